#include "services/common/contract/proto_json.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/common/contract/proto_values.h"

namespace gradhub {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

constexpr int kMaxDepth = 100;  // as protobuf's own parsers

// What a JSON value may be where it stands.
struct Shape {
  enum Kind {
    kAny,      // an unknown field (protobuf refuses it) or a well-known type (its own parser)
    kMessage,  // an object of `message`'s fields
    kMap,      // an object of `field`'s map entries
    kList,     // a list of `field`'s elements
    kScalar,   // a string, number or boolean
  };
  Kind kind = kAny;
  const Descriptor* message = nullptr;
  const FieldDescriptor* field = nullptr;
  bool element = false;  // inside a list: neither a list nor null
};

bool IsWellKnown(const Descriptor& type) {
  return absl::StartsWith(type.full_name(), "google.protobuf.");
}

// One value of `field`: a singular field's, a list element's or a map entry's.
Shape OneValueOf(const FieldDescriptor& field) {
  if (field.cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) return {Shape::kScalar};
  if (IsWellKnown(*field.message_type())) return {Shape::kAny};
  return {Shape::kMessage, field.message_type()};
}

Shape ShapeOf(const FieldDescriptor& field) {
  if (field.is_map()) return {Shape::kMap, nullptr, &field};
  if (field.is_repeated()) return {Shape::kList, nullptr, &field};
  return OneValueOf(field);
}

Shape ElementOf(const FieldDescriptor& field) {
  Shape shape = OneValueOf(field);
  shape.element = shape.kind != Shape::kAny;
  return shape;
}

// The field a key names, as protobuf's parser finds it: by JSON name or by proto name.
const FieldDescriptor* FieldNamed(const Descriptor& type, const std::string& key) {
  for (int i = 0; i < type.field_count(); ++i) {
    const FieldDescriptor* field = type.field(i);
    if (field->json_name() == key || field->name() == key) return field;
  }
  return nullptr;
}

std::string Join(const std::string& path, const std::string& name) {
  return path.empty() ? name : absl::StrCat(path, ".", name);
}

void AppendUtf8(uint32_t code, std::string* out) {
  if (code < 0x80) {
    out->push_back(static_cast<char>(code));
  } else if (code < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (code >> 6)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else if (code < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (code >> 12)));
    out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (code >> 18)));
    out->push_back(static_cast<char>(0x80 | ((code >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
}

// The JSON lexer: strict RFC 8259 tokens, positions for errors. Each reader returns false
// after recording the first error.
class JsonLexer {
 public:
  explicit JsonLexer(std::string_view text) : text_(text) {}

  const absl::Status& error() const { return error_; }
  bool at_end() {
    SkipSpace();
    return pos_ == text_.size();
  }
  char Peek() {
    SkipSpace();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  // Consumes `c` if it comes next.
  bool Take(char c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }
  bool Expect(char c) {
    return Take(c) || SyntaxError(absl::StrCat("expected '", std::string(1, c), "'"));
  }

  bool SyntaxError(const std::string& what) {
    return Fail(absl::StrCat("not valid JSON at byte ", pos_, ": ", what));
  }
  bool Fail(const std::string& message) {
    if (error_.ok()) error_ = absl::InvalidArgumentError(message);
    return false;
  }

  // A string; decoded into *out unless null.
  bool String(std::string* out) {
    if (!Take('"')) return SyntaxError("expected a string in double quotes");
    while (pos_ < text_.size()) {
      const unsigned char c = static_cast<unsigned char>(text_[pos_++]);
      if (c == '"') return true;
      if (c < 0x20) return SyntaxError("a control character inside a string");
      if (c != '\\') {
        if (out) out->push_back(static_cast<char>(c));
        continue;
      }
      if (!Escape(out)) return false;
    }
    return SyntaxError("a string without its closing quote");
  }

  // A number, true, false or null. Sets *null when it was null.
  bool Literal(bool* null) {
    *null = false;
    for (std::string_view word : {"true", "false", "null"}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        *null = word == "null";
        return true;
      }
    }
    return Number();
  }

 private:
  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Digits() {
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
    return pos_ > start;
  }

  // -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool Number() {
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '0') {
      ++pos_;
    } else if (!Digits()) {
      return SyntaxError("expected a value");
    }
    if (pos_ < text_.size() && text_[pos_] == '.' && (++pos_, !Digits())) {
      return SyntaxError("expected digits after '.'");
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!Digits()) return SyntaxError("expected digits in the exponent");
    }
    return true;
  }

  bool Hex4(uint32_t* code) {
    if (pos_ + 4 > text_.size()) return SyntaxError("a \\u escape without 4 hex digits");
    *code = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_++];
      const int digit = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
      if (digit < 0) return SyntaxError("a \\u escape without 4 hex digits");
      *code = *code * 16 + static_cast<uint32_t>(digit);
    }
    return true;
  }

  // After a backslash: one escape, a surrogate pair as one character.
  bool Escape(std::string* out) {
    if (pos_ >= text_.size()) return SyntaxError("a string without its closing quote");
    const char c = text_[pos_++];
    static constexpr std::string_view kFrom = "\"\\/bfnrt", kTo = "\"\\/\b\f\n\r\t";
    if (const size_t simple = kFrom.find(c); simple != std::string_view::npos) {
      if (out) out->push_back(kTo[simple]);
      return true;
    }
    if (c != 'u') return SyntaxError("an unknown escape in a string");
    uint32_t code = 0;
    if (!Hex4(&code)) return false;
    if (code >= 0xDC00 && code <= 0xDFFF) return SyntaxError("a lone low surrogate (\\u escape)");
    if (code >= 0xD800 && code <= 0xDBFF) {
      uint32_t low = 0;
      if (text_.substr(pos_, 2) != "\\u" || (pos_ += 2, !Hex4(&low)) || low < 0xDC00 ||
          low > 0xDFFF) {
        return SyntaxError("a high surrogate (\\u escape) without its low surrogate");
      }
      code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
    }
    if (out) AppendUtf8(code, out);
    return true;
  }

  std::string_view text_;
  size_t pos_ = 0;
  absl::Status error_;
};

// Step 1 of ParseProtoJson: reads the whole text, checking each value's shape where it stands.
class ShapeChecker {
 public:
  explicit ShapeChecker(std::string_view text) : lex_(text) {}

  absl::Status Check(const Descriptor& type) {
    if (lex_.Peek() != '{') {
      lex_.SyntaxError("expected an object ({...})");
    } else if (Value({Shape::kMessage, &type}, "") && !lex_.at_end()) {
      lex_.SyntaxError("more after the object");
    }
    return lex_.error();
  }

 private:
  bool Value(const Shape& shape, const std::string& path) {
    const char next = lex_.Peek();
    if (next == '[' || next == '{') {
      if (++depth_ > kMaxDepth) return lex_.SyntaxError("nested deeper than 100 levels");
      const bool ok = next == '[' ? List(shape, path) : Object(shape, path);
      --depth_;
      return ok;
    }
    if (shape.kind == Shape::kList) return Wrong(path, "must be a list ([...])");
    if (shape.kind == Shape::kMessage || shape.kind == Shape::kMap) {
      if (next == 'n' && !shape.element) return lex_.Literal(&null_);
      return Wrong(path, shape.element ? "must be an object ({...}), not null or a single value"
                                       : "must be an object ({...})");
    }
    if (next == '"') return lex_.String(nullptr);
    if (!lex_.Literal(&null_)) return false;
    if (null_ && shape.element) return Wrong(path, "is null inside a list");
    return true;
  }

  bool List(const Shape& shape, const std::string& path) {
    if (shape.element) {
      return Wrong(path, "is a list inside a list, which the field cannot hold: give one list");
    }
    if (shape.kind == Shape::kMessage || shape.kind == Shape::kMap) {
      return Wrong(path, "must be an object ({...}), not a list");
    }
    if (shape.kind == Shape::kScalar) {
      return Wrong(path, "is a list, but the field holds a single value");
    }
    const Shape element = shape.kind == Shape::kAny ? Shape{} : ElementOf(*shape.field);
    lex_.Expect('[');
    if (lex_.Take(']')) return true;
    for (int i = 0;; ++i) {
      if (!Value(element, absl::StrCat(path, "[", i, "]"))) return false;
      if (lex_.Take(']')) return true;
      if (!lex_.Expect(',')) return false;
    }
  }

  bool Object(const Shape& shape, const std::string& path) {
    if (shape.kind == Shape::kList) return Wrong(path, "must be a list ([...])");
    if (shape.kind == Shape::kScalar) {
      return Wrong(path, "is an object, but the field holds a single value");
    }
    lex_.Expect('{');
    if (lex_.Take('}')) return true;
    std::vector<const FieldDescriptor*> seen;  // of a message: each field once
    std::vector<std::string> keys;             // of a map: each key once
    while (true) {
      std::string key;
      if (!lex_.String(&key) || !lex_.Expect(':')) return false;
      if (!Member(shape, path, key, seen, keys)) return false;
      if (lex_.Take('}')) return true;
      if (!lex_.Expect(',')) return false;
    }
  }

  // One key and its value, of an object shaped `shape`.
  bool Member(const Shape& shape, const std::string& path, const std::string& key,
              std::vector<const FieldDescriptor*>& seen, std::vector<std::string>& keys) {
    if (shape.kind == Shape::kMap) {
      if (std::find(keys.begin(), keys.end(), key) != keys.end()) {
        return Wrong(Join(path, key), "is given twice");
      }
      keys.push_back(key);
      return Value(OneValueOf(*shape.field->message_type()->map_value()), Join(path, key));
    }
    const FieldDescriptor* field =
        shape.kind == Shape::kMessage ? FieldNamed(*shape.message, key) : nullptr;
    if (field == nullptr) return Value({}, Join(path, key));  // protobuf refuses or parses it
    const std::string field_path = Join(path, field->json_name());
    if (std::find(seen.begin(), seen.end(), field) != seen.end()) {
      return Wrong(field_path, field->json_name() == field->name()
                                   ? "is given twice"
                                   : absl::StrCat("is given twice (", field->json_name(), " and ",
                                                  field->name(), " are the same field)"));
    }
    seen.push_back(field);
    return Value(ShapeOf(*field), field_path);
  }

  bool Wrong(const std::string& path, const std::string& problem) {
    return lex_.Fail(absl::StrCat(path.empty() ? "the body" : path, ": ", problem));
  }

  JsonLexer lex_;
  int depth_ = 0;
  bool null_ = false;
};

}  // namespace

absl::Status ParseProtoJson(std::string_view json, google::protobuf::Message* message,
                            const ProtoJsonOptions& options) {
  if (absl::Status shape = ShapeChecker(json).Check(*message->GetDescriptor()); !shape.ok()) {
    return shape;
  }
  google::protobuf::util::JsonParseOptions parse;
  parse.ignore_unknown_fields = false;
  parse.case_insensitive_enum_parsing = options.case_insensitive_enums;
  if (const auto parsed = google::protobuf::util::JsonStringToMessage(
          google::protobuf::StringPiece(json.data(), json.size()), message, parse);
      !parsed.ok()) {
    return absl::InvalidArgumentError(std::string(parsed.message()));
  }
  std::vector<FieldIssue> issues = ProtoValueIssues(*message);
  if (issues.empty()) return absl::OkStatus();
  std::vector<std::string> parts;
  for (const FieldIssue& issue : issues) parts.push_back(issue.field + ": " + issue.message);
  return absl::InvalidArgumentError(absl::StrJoin(parts, "; "));
}

}  // namespace gradhub
