// Conversions between C++ values and PostgreSQL's text format, both directions: Param encodes,
// Row::Get decodes.
#include <charconv>
#include <cmath>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/common/db/param.h"
#include "services/common/db/result.h"

namespace gradhub::db {
namespace {

constexpr char kHex[] = "0123456789abcdef";

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

template <typename Int>
Int ParseInteger(std::string_view text, std::string_view column) {
  Int value{};
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    throw std::logic_error(absl::StrCat("column ", std::string(column), ": '", std::string(text),
                                        "' is not an integer"));
  }
  return value;
}

}  // namespace

Param::Param(double value) {
  // %.17g round-trips every double; PostgreSQL spells the non-finite ones as words.
  if (std::isnan(value)) {
    text_ = "NaN";
  } else if (std::isinf(value)) {
    text_ = value > 0 ? "Infinity" : "-Infinity";
  } else {
    text_ = absl::StrFormat("%.17g", value);
  }
}

Param Param::Bytes(std::string_view bytes) {
  std::string hex = "\\x";
  hex.reserve(2 + 2 * bytes.size());
  for (unsigned char c : bytes) {
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 0xf]);
  }
  return Param(hex);
}

std::string DecodeBytea(std::string_view text) {
  if (text.size() < 2 || text[0] != '\\' || text[1] != 'x' || text.size() % 2 != 0) {
    throw std::logic_error("bytea value is not in hex format (bytea_output = hex)");
  }
  std::string bytes;
  bytes.reserve(text.size() / 2 - 1);
  for (size_t i = 2; i < text.size(); i += 2) {
    int high = HexValue(text[i]), low = HexValue(text[i + 1]);
    if (high < 0 || low < 0) throw std::logic_error("bytea value has a non-hex digit");
    bytes.push_back(static_cast<char>(high << 4 | low));
  }
  return bytes;
}

Row Result::row(int index) const {
  if (index < 0 || index >= rows()) {
    throw std::logic_error(absl::StrCat("row ", index, " out of range (", rows(), " rows)"));
  }
  return Row(this, index);
}

int64_t Result::affected() const {
  const char* count = PQcmdTuples(result_.get());
  return (count == nullptr || *count == '\0') ? 0 : ParseInteger<int64_t>(count, "affected rows");
}

int Row::Column(std::string_view column) const {
  // Our column names are lower-case, as PostgreSQL returns them: an exact match first, since
  // PQfnumber copies and case-folds the name on every call (a row read column by column over a
  // long result called it 130,000 times per scheduler pass with 27,000 jobs queued).
  const int columns = PQnfields(result_->raw());
  for (int i = 0; i < columns; ++i) {
    if (column == PQfname(result_->raw(), i)) return i;
  }
  int index = PQfnumber(result_->raw(), std::string(column).c_str());
  if (index < 0)
    throw std::logic_error(absl::StrCat("result has no column '", std::string(column), "'"));
  return index;
}

bool Row::IsNull(std::string_view column) const {
  return PQgetisnull(result_->raw(), index_, Column(column)) == 1;
}

template <>
std::string Row::Get<std::string>(std::string_view column) const {
  int index = Column(column);
  if (PQgetisnull(result_->raw(), index_, index)) {
    throw std::logic_error(
        absl::StrCat("column ", std::string(column), " is NULL; read it as std::optional"));
  }
  return std::string(PQgetvalue(result_->raw(), index_, index),
                     PQgetlength(result_->raw(), index_, index));
}

template <>
int64_t Row::Get<int64_t>(std::string_view column) const {
  return ParseInteger<int64_t>(Get<std::string>(column), column);
}

template <>
int32_t Row::Get<int32_t>(std::string_view column) const {
  return ParseInteger<int32_t>(Get<std::string>(column), column);
}

template <>
double Row::Get<double>(std::string_view column) const {
  std::string text = Get<std::string>(column);
  if (text == "NaN") return std::nan("");
  if (text == "Infinity") return HUGE_VAL;
  if (text == "-Infinity") return -HUGE_VAL;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) {
    throw std::logic_error(absl::StrCat("column ", std::string(column), ": '", std::string(text),
                                        "' is not a number"));
  }
  return value;
}

template <>
bool Row::Get<bool>(std::string_view column) const {
  std::string text = Get<std::string>(column);
  if (text == "t") return true;
  if (text == "f") return false;
  throw std::logic_error(
      absl::StrCat("column ", std::string(column), ": '", std::string(text), "' is not a boolean"));
}

}  // namespace gradhub::db
