#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gradhub::db {

// One statement parameter, sent in text format through PQexecParams so user data never
// becomes part of the SQL text. Implicit from the C++ types we store; std::nullopt is NULL.
class Param {
 public:
  Param(std::nullopt_t) {}
  Param(std::string_view text) : text_(std::string(text)) {}
  Param(const std::string& text) : text_(text) {}
  Param(const char* text) : text_(std::string(text)) {}
  Param(int32_t value) : text_(std::to_string(value)) {}
  Param(int64_t value) : text_(std::to_string(value)) {}
  Param(uint64_t value) : text_(std::to_string(value)) {}
  Param(double value);
  Param(bool value) : text_(value ? "t" : "f") {}
  template <typename T>
  Param(const std::optional<T>& value) {
    if (value) text_ = Param(*value).text_;
  }

  // Arbitrary bytes for a bytea column (hex text format, so NUL bytes survive).
  static Param Bytes(std::string_view bytes);

  const char* c_str() const { return text_ ? text_->c_str() : nullptr; }
  // A NUL inside the text: c_str() would cut it there, so Connection::Exec refuses it.
  bool holds_nul() const { return text_ && text_->find('\0') != std::string::npos; }

 private:
  std::optional<std::string> text_;
};

// The parameters of SQL assembled piece by piece (filters, page tokens): Bind appends one and
// returns its placeholder, so each condition is written next to its value.
class ParamList {
 public:
  ParamList(std::initializer_list<Param> first = {}) : params_(first) {}
  std::string Bind(Param param) {
    params_.push_back(std::move(param));
    return "$" + std::to_string(params_.size());
  }
  const std::vector<Param>& values() const { return params_; }

 private:
  std::vector<Param> params_;
};

}  // namespace gradhub::db
