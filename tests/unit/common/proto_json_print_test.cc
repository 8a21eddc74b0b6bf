// ProtoToJson (proto_json.h): the same JSON value as protobuf's MessageToJsonString, for every
// kind of field a spec can hold, and read back by protobuf as the same message.
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "gradhub/v1/jobs.pb.h"
#include "services/common/contract/proto_json.h"

namespace gradhub {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// Texts that need escaping, and characters beyond ASCII.
const std::string kAwkwardText = "q\"uote\\ \n\t\x01 </script> \xc3\xa9 \xe4\xb8\xad";

// Sets one value of `field` (appends one when repeated), distinct per `variant`.
void SetValue(Message* message, const FieldDescriptor& field, int variant) {
  const auto* r = message->GetReflection();
  const bool many = field.is_repeated();
  switch (field.cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      many ? r->AddInt32(message, &field, -7 - variant)
           : r->SetInt32(message, &field, -7 - variant);
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      many ? r->AddUInt32(message, &field, 4000000000u)
           : r->SetUInt32(message, &field, 4000000000u);
      break;
    case FieldDescriptor::CPPTYPE_INT64:  // beyond a double's integers
      many ? r->AddInt64(message, &field, -9007199254740993 - variant)
           : r->SetInt64(message, &field, -9007199254740993 - variant);
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      many ? r->AddUInt64(message, &field, UINT64_MAX - variant)
           : r->SetUInt64(message, &field, UINT64_MAX - variant);
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      const double value = variant == 0 ? 0.1 : variant == 1 ? 1e300 : -2.5e-300;
      many ? r->AddDouble(message, &field, value) : r->SetDouble(message, &field, value);
      break;
    }
    case FieldDescriptor::CPPTYPE_FLOAT:
      many ? r->AddFloat(message, &field, 0.1f) : r->SetFloat(message, &field, 0.1f);
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      many ? r->AddBool(message, &field, true) : r->SetBool(message, &field, true);
      break;
    case FieldDescriptor::CPPTYPE_ENUM: {
      // The last name, or (variant 1) a number without a name: proto3 enums are open.
      const auto* type = field.enum_type();
      const int number = variant == 1 ? 99 : type->value(type->value_count() - 1)->number();
      many ? r->AddEnumValue(message, &field, number) : r->SetEnumValue(message, &field, number);
      break;
    }
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string text = field.type() == FieldDescriptor::TYPE_BYTES
                                   ? std::string("\x00\xff bin", 6)
                                   : kAwkwardText + std::to_string(variant);
      many ? r->AddString(message, &field, text) : r->SetString(message, &field, text);
      break;
    }
    default:
      break;
  }
}

// Every field of `message`, recursively: repeated and map fields get two values, and of each
// oneof only the member `variant` picks is set.
void Fill(Message* message, int variant, int depth = 0) {
  const auto* descriptor = message->GetDescriptor();
  const auto* r = message->GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor& field = *descriptor->field(i);
    if (const auto* oneof = field.containing_oneof();
        oneof != nullptr && field.index_in_oneof() != variant % oneof->field_count()) {
      continue;
    }
    if (field.cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) {
      for (int n = 0; n < (field.is_repeated() ? 2 : 1); ++n) SetValue(message, field, variant + n);
      continue;
    }
    if (depth > 5) continue;
    if (field.is_map()) {
      for (int n = 0; n < 2; ++n) {
        Message* entry = r->AddMessage(message, &field);
        SetValue(entry, *entry->GetDescriptor()->map_key(), variant + n);
        SetValue(entry, *entry->GetDescriptor()->map_value(), variant);
      }
    } else if (field.is_repeated()) {
      for (int n = 0; n < 2; ++n) Fill(r->AddMessage(message, &field), variant + n, depth + 1);
    } else {
      Fill(r->MutableMessage(message, &field), variant, depth + 1);
    }
  }
}

void ExpectSameAsProtobuf(const Message& message) {
  std::string expected;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(message, &expected).ok());
  const absl::StatusOr<std::string> printed = ProtoToJson(message);
  ASSERT_TRUE(printed.ok()) << printed.status();
  EXPECT_EQ(nlohmann::json::parse(*printed), nlohmann::json::parse(expected)) << *printed << "\n"
                                                                              << expected;
  std::unique_ptr<Message> read(message.New());
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(*printed, read.get()).ok()) << *printed;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*read, message));
}

TEST(ProtoToJsonTest, EveryKindOfFieldAsProtobufPrintsIt) {
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE(variant);
    v1::JobSpec spec;
    Fill(&spec, variant);
    ExpectSameAsProtobuf(spec);
  }
}

TEST(ProtoToJsonTest, OnlySetFields) {
  ExpectSameAsProtobuf(v1::JobSpec());
  v1::JobSpec spec;
  spec.mutable_distributed();  // present, empty
  spec.set_priority(0);        // default: not printed
  ExpectSameAsProtobuf(spec);
  EXPECT_EQ(*ProtoToJson(spec), "{\"distributed\":{}}");
}

TEST(ProtoToJsonTest, NonFiniteNumbersAsTheirNames) {
  v1::JobSpec spec;
  spec.set_grad_clip_norm(std::nan(""));
  EXPECT_EQ(*ProtoToJson(spec), "{\"gradClipNorm\":\"NaN\"}");
  spec.set_grad_clip_norm(-INFINITY);
  EXPECT_EQ(*ProtoToJson(spec), "{\"gradClipNorm\":\"-Infinity\"}");
}

TEST(ProtoToJsonTest, WellKnownTypesLeftToProtobuf) {
  v1::Job job;
  job.set_name("jobs/x");
  job.mutable_create_time()->set_seconds(1700000000);
  std::string expected;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(job, &expected).ok());
  EXPECT_EQ(*ProtoToJson(job), expected);
}

}  // namespace
}  // namespace gradhub
