#pragma once

#include <libpq-fe.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace gradhub::db {

class Result;

// One row of a Result, valid while the Result lives. Get<T>(column) converts the text value;
// asking for a column that is not there, or for a non-optional T from a NULL, is a bug in our
// SQL and throws std::logic_error (runtime failures are absl::Status elsewhere in this layer).
class Row {
 public:
  template <typename T>
  T Get(std::string_view column) const;
  bool IsNull(std::string_view column) const;

 private:
  friend class Result;
  Row(const Result* result, int index) : result_(result), index_(index) {}
  int Column(std::string_view column) const;
  const Result* result_;
  int index_;
};

// Owns a PGresult. Movable, not copyable.
class Result {
 public:
  explicit Result(PGresult* result) : result_(result, &PQclear) {}

  int rows() const { return PQntuples(result_.get()); }
  bool empty() const { return rows() == 0; }
  Row row(int index) const;
  // Rows changed by INSERT/UPDATE/DELETE.
  int64_t affected() const;

  class Iterator {
   public:
    Iterator(const Result* result, int index) : result_(result), index_(index) {}
    Row operator*() const { return result_->row(index_); }
    Iterator& operator++() {
      ++index_;
      return *this;
    }
    bool operator!=(const Iterator& other) const { return index_ != other.index_; }

   private:
    const Result* result_;
    int index_;
  };
  Iterator begin() const { return Iterator(this, 0); }
  Iterator end() const { return Iterator(this, rows()); }

  const PGresult* raw() const { return result_.get(); }

 private:
  std::unique_ptr<PGresult, void (*)(PGresult*)> result_;
};

template <>
std::string Row::Get<std::string>(std::string_view column) const;
template <>
int64_t Row::Get<int64_t>(std::string_view column) const;
template <>
int32_t Row::Get<int32_t>(std::string_view column) const;
template <>
double Row::Get<double>(std::string_view column) const;
template <>
bool Row::Get<bool>(std::string_view column) const;

// Get<std::optional<T>>: NULL becomes std::nullopt.
template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};

template <typename T>
T Row::Get(std::string_view column) const {
  static_assert(IsOptional<T>::value, "Row::Get supports string, int32/64, double, bool, optional");
  if (IsNull(column)) return std::nullopt;
  return Get<typename T::value_type>(column);
}

// Decodes a bytea column in hex text format ("\x0a1b...") to raw bytes.
std::string DecodeBytea(std::string_view hex_text);

}  // namespace gradhub::db
