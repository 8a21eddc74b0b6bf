// The values a proto can hold but no request can mean, found generically (protobuf reflection)
// over a whole message, so that no field is forgotten when a proto grows:
//   - an enum number with no name: proto3 enums are open, so protobuf's parsers (binary and
//     JSON, e.g. "precision": 7) keep any number, which no code that switches on it expects;
//   - a float or double that is NaN or infinite (JSON "NaN", "Infinity"): every limit check
//     (x > 0, x < 1) is false or true for it in ways nobody meant;
//   - a string that is not valid UTF-8 or holds a NUL character (text_rules.h).
// The REST gateway's JSON parsing (proto_json.h) and ValidateJobSpec (so gRPC too) run it.
// Pure functions, thread-safe.
#pragma once

#include <google/protobuf/message.h>

#include <string>
#include <vector>

namespace gradhub {

// A field of a request with something wrong: `field` is its path in the proto3 JSON spelling
// (e.g. "optimizer.sgd.lr", "model.mlp.layers[2]", "labels.team"), `message` what is wrong.
struct FieldIssue {
  std::string field;
  std::string message;
};

// Every value of `message` (set fields only, recursively, map entries included) that no
// request can mean, each naming its path under `prefix` ("" = from the message's top). At most
// kMaxValueIssues, so that a hostile list of a million NaNs answers a short error.
inline constexpr size_t kMaxValueIssues = 50;
std::vector<FieldIssue> ProtoValueIssues(const google::protobuf::Message& message,
                                         const std::string& prefix = "");

}  // namespace gradhub
