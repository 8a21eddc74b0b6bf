// ProtoToJson (proto_json.h): the proto3 JSON mapping printed through reflection.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <google/protobuf/util/json_util.h>

#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/common/contract/proto_json.h"
#include "services/common/json_text.h"

namespace gradhub {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Well-known types have JSON forms of their own (a Timestamp is a string): left to protobuf.
bool IsWellKnown(const Descriptor& type) {
  return absl::StartsWith(type.full_name(), "google.protobuf.");
}

// A float or double as the mapping writes it: the shortest text that reads back as the same
// value, or the quoted names of the non-finite ones.
template <typename Number>
void AppendFloating(Number value, std::string& out) {
  if (std::isnan(value)) {
    out += "\"NaN\"";
  } else if (std::isinf(value)) {
    out += value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  } else {
    char text[64];
    const auto end = std::to_chars(text, text + sizeof(text), value).ptr;
    out.append(text, end);
  }
}

class Printer {
 public:
  // False when `message` holds a well-known type, which this printer leaves to protobuf.
  bool PrintMessage(const Message& message, std::string& out) {
    if (IsWellKnown(*message.GetDescriptor())) return false;
    const Reflection& reflection = *message.GetReflection();
    std::vector<const FieldDescriptor*> fields;
    // The fields the mapping prints: set ones only (present, non-default or non-empty), in
    // field number order, as MessageToJsonString without always_print_primitive_fields.
    reflection.ListFields(message, &fields);
    out += '{';
    for (size_t i = 0; i < fields.size(); ++i) {
      const FieldDescriptor& field = *fields[i];
      absl::StrAppend(&out, i == 0 ? "" : ",", QuoteJson(field.json_name()), ":");
      if (!PrintField(message, field, out)) return false;
    }
    out += '}';
    return true;
  }

 private:
  bool PrintField(const Message& message, const FieldDescriptor& field, std::string& out) {
    const Reflection& reflection = *message.GetReflection();
    if (field.is_map()) return PrintMap(message, field, out);
    if (!field.is_repeated()) return PrintValue(message, field, -1, out);
    out += '[';
    for (int i = 0; i < reflection.FieldSize(message, &field); ++i) {
      if (i > 0) out += ',';
      if (!PrintValue(message, field, i, out)) return false;
    }
    out += ']';
    return true;
  }

  // A map field as an object: its entries' keys as strings, whatever their type.
  bool PrintMap(const Message& message, const FieldDescriptor& field, std::string& out) {
    const Reflection& reflection = *message.GetReflection();
    const FieldDescriptor& key = *field.message_type()->map_key();
    const FieldDescriptor& value = *field.message_type()->map_value();
    out += '{';
    for (int i = 0; i < reflection.FieldSize(message, &field); ++i) {
      const Message& entry = reflection.GetRepeatedMessage(message, &field, i);
      std::string key_text;
      PrintValue(entry, key, -1, key_text);
      if (key_text.front() != '"') key_text = QuoteJson(key_text);  // 32-bit numbers, bools
      absl::StrAppend(&out, i == 0 ? "" : ",", key_text, ":");
      if (!PrintValue(entry, value, -1, out)) return false;
    }
    out += '}';
    return true;
  }

  // One value of `field`: the singular one (index -1) or the repeated one at `index`.
  bool PrintValue(const Message& message, const FieldDescriptor& field, int index,
                  std::string& out) {
    const Reflection& r = *message.GetReflection();
    const bool one = index < 0;
    switch (field.cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        absl::StrAppend(
            &out, one ? r.GetInt32(message, &field) : r.GetRepeatedInt32(message, &field, index));
        return true;
      case FieldDescriptor::CPPTYPE_UINT32:
        absl::StrAppend(
            &out, one ? r.GetUInt32(message, &field) : r.GetRepeatedUInt32(message, &field, index));
        return true;
      case FieldDescriptor::CPPTYPE_INT64:  // quoted: JSON numbers lose 64-bit precision
        absl::StrAppend(
            &out, "\"",
            one ? r.GetInt64(message, &field) : r.GetRepeatedInt64(message, &field, index), "\"");
        return true;
      case FieldDescriptor::CPPTYPE_UINT64:
        absl::StrAppend(
            &out, "\"",
            one ? r.GetUInt64(message, &field) : r.GetRepeatedUInt64(message, &field, index), "\"");
        return true;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        AppendFloating(
            one ? r.GetDouble(message, &field) : r.GetRepeatedDouble(message, &field, index), out);
        return true;
      case FieldDescriptor::CPPTYPE_FLOAT:
        AppendFloating(
            one ? r.GetFloat(message, &field) : r.GetRepeatedFloat(message, &field, index), out);
        return true;
      case FieldDescriptor::CPPTYPE_BOOL:
        out += (one ? r.GetBool(message, &field) : r.GetRepeatedBool(message, &field, index))
                   ? "true"
                   : "false";
        return true;
      default:
        return PrintNonNumeric(message, field, index, out);
    }
  }

  bool PrintNonNumeric(const Message& message, const FieldDescriptor& field, int index,
                       std::string& out) {
    const Reflection& r = *message.GetReflection();
    const bool one = index < 0;
    switch (field.cpp_type()) {
      case FieldDescriptor::CPPTYPE_ENUM: {
        // By name; a number no name has (proto3 enums are open) as the number.
        const int number =
            one ? r.GetEnumValue(message, &field) : r.GetRepeatedEnumValue(message, &field, index);
        if (const auto* value = field.enum_type()->FindValueByNumber(number)) {
          out += QuoteJson(value->name());
        } else {
          absl::StrAppend(&out, number);
        }
        return true;
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        std::string scratch;
        const std::string& text =
            one ? r.GetStringReference(message, &field, &scratch)
                : r.GetRepeatedStringReference(message, &field, index, &scratch);
        out += QuoteJson(field.type() == FieldDescriptor::TYPE_BYTES ? absl::Base64Escape(text)
                                                                     : text);
        return true;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE:
        return PrintMessage(
            one ? r.GetMessage(message, &field) : r.GetRepeatedMessage(message, &field, index),
            out);
      default:
        return false;
    }
  }
};

}  // namespace

absl::StatusOr<std::string> ProtoToJson(const Message& message) {
  std::string json;
  if (Printer().PrintMessage(message, json)) return json;
  json.clear();
  if (auto status = google::protobuf::util::MessageToJsonString(message, &json); !status.ok()) {
    return absl::InternalError(status.ToString());
  }
  return json;
}

}  // namespace gradhub
