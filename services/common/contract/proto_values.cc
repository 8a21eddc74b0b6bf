#include "services/common/contract/proto_values.h"

#include <google/protobuf/descriptor.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "services/common/text_rules.h"

namespace gradhub {
namespace {

using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

std::string EnumNames(const EnumDescriptor& type) {
  std::vector<std::string> names;
  for (int i = 0; i < type.value_count(); ++i) names.push_back(type.value(i)->name());
  return absl::StrJoin(names, ", ");
}

// A map entry's key as the JSON mapping writes it (map keys are strings, integers or bools).
std::string MapKey(const Message& entry, const FieldDescriptor& key) {
  const Reflection& reflection = *entry.GetReflection();
  switch (key.cpp_type()) {
    case FieldDescriptor::CPPTYPE_STRING:
      return reflection.GetString(entry, &key);
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(reflection.GetInt32(entry, &key));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(reflection.GetInt64(entry, &key));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(reflection.GetUInt32(entry, &key));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(reflection.GetUInt64(entry, &key));
    case FieldDescriptor::CPPTYPE_BOOL:
      return reflection.GetBool(entry, &key) ? "true" : "false";
    default:
      return "";
  }
}

// Walks a message's set fields; `index` < 0 reads a singular field, else one element.
class ValueWalker {
 public:
  std::vector<FieldIssue> Take() { return std::move(issues_); }

  void Walk(const Message& message, const std::string& prefix) {
    std::vector<const FieldDescriptor*> fields;
    message.GetReflection()->ListFields(message, &fields);
    for (const FieldDescriptor* field : fields) {
      const std::string path =
          prefix.empty() ? field->json_name() : absl::StrCat(prefix, ".", field->json_name());
      if (field->is_map()) {
        Map(message, *field, path);
      } else if (field->is_repeated()) {
        const int size = message.GetReflection()->FieldSize(message, field);
        for (int i = 0; i < size && !full(); ++i) {
          Value(message, *field, i, absl::StrCat(path, "[", i, "]"));
        }
      } else {
        Value(message, *field, -1, path);
      }
    }
  }

 private:
  bool full() const { return issues_.size() >= kMaxValueIssues; }

  void Add(const std::string& field, std::string message) {
    if (!full()) issues_.push_back({field, std::move(message)});
  }

  // A map as the JSON mapping writes it, an object: each entry's path is "<map>.<key>".
  void Map(const Message& message, const FieldDescriptor& field, const std::string& path) {
    const Reflection& reflection = *message.GetReflection();
    const FieldDescriptor& key = *field.message_type()->map_key();
    const FieldDescriptor& value = *field.message_type()->map_value();
    for (int i = 0; i < reflection.FieldSize(message, &field) && !full(); ++i) {
      const Message& entry = reflection.GetRepeatedMessage(message, &field, i);
      const std::string name = MapKey(entry, key);
      if (std::string problem = TextProblem(name); !problem.empty()) {
        Add(path, "a key " + problem);
        continue;
      }
      Value(entry, value, -1, absl::StrCat(path, ".", name));
    }
  }

  void Value(const Message& message, const FieldDescriptor& field, int index,
             const std::string& path) {
    const Reflection& reflection = *message.GetReflection();
    const bool one = index < 0;
    switch (field.cpp_type()) {
      case FieldDescriptor::CPPTYPE_ENUM: {
        const int number = one ? reflection.GetEnumValue(message, &field)
                               : reflection.GetRepeatedEnumValue(message, &field, index);
        if (field.enum_type()->FindValueByNumber(number) == nullptr) {
          Add(path, absl::StrCat(number, " is not a value of ", field.enum_type()->name(),
                                 " (one of ", EnumNames(*field.enum_type()), ")"));
        }
        return;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT: {
        const double number = field.cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE
                                  ? (one ? reflection.GetDouble(message, &field)
                                         : reflection.GetRepeatedDouble(message, &field, index))
                                  : (one ? reflection.GetFloat(message, &field)
                                         : reflection.GetRepeatedFloat(message, &field, index));
        if (!std::isfinite(number)) {
          Add(path, absl::StrCat("must be a finite number, not ", std::isnan(number) ? "NaN"
                                                                  : number > 0       ? "Infinity"
                                                                               : "-Infinity"));
        }
        return;
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        if (field.type() != FieldDescriptor::TYPE_STRING) return;  // bytes may hold anything
        std::string scratch;
        const std::string& text =
            one ? reflection.GetStringReference(message, &field, &scratch)
                : reflection.GetRepeatedStringReference(message, &field, index, &scratch);
        if (std::string problem = TextProblem(text); !problem.empty()) Add(path, problem);
        return;
      }
      case FieldDescriptor::CPPTYPE_MESSAGE:
        Walk(one ? reflection.GetMessage(message, &field)
                 : reflection.GetRepeatedMessage(message, &field, index),
             path);
        return;
      default:
        return;  // integers and booleans: every value is one the proto means
    }
  }

  std::vector<FieldIssue> issues_;
};

}  // namespace

std::vector<FieldIssue> ProtoValueIssues(const Message& message, const std::string& prefix) {
  ValueWalker walker;
  walker.Walk(message, prefix);
  return walker.Take();
}

}  // namespace gradhub
