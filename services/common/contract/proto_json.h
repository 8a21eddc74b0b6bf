// JSON into protos, refusing what the proto3 JSON mapping would take but the proto cannot mean.
// Every JSON a client sends goes through ParseProtoJson: the REST gateway's bodies and the job
// spec files (YAML is turned into JSON first, job_spec.h).
//
// Protobuf's own parser (3.21, Debian 12) is lenient in ways a hostile or careless client can
// use, which is why it does not run alone:
//   - [[1,2],[3]] for a repeated number is flattened into [1,2,3], nulls in a list are
//     dropped, and a single value is taken for a list;
//   - a field given twice in one object (also once as displayName and once as display_name)
//     is appended to when repeated and overwritten when not;
//   - single-quoted strings, unquoted keys and trailing commas are taken as JSON;
//   - enum numbers without a name, "NaN" and "Infinity", and "\u0000" are kept.
// Thread-safe: pure functions.
#pragma once

#include <google/protobuf/message.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradhub {

struct ProtoJsonOptions {
  bool case_insensitive_enums = false;  // spec files: `backend: auto`
};

// Parses `json` into `message` (merged into what it holds, normally nothing), in three steps:
//   1. the text is strict JSON (RFC 8259), one object, nested at most 100 deep, and its shape
//      is one the message's fields can mean: an object for a message or a map, a list only for
//      a repeated field, never a list or a null inside a list, no field twice in one object;
//   2. protobuf's parser reads it (types, unknown fields and enum names refused);
//   3. ProtoValueIssues (proto_values.h): enum numbers, non-finite numbers, NUL and UTF-8.
// INVALID_ARGUMENT naming the field path in JSON spelling ("model.mlp.layers[0]: ...") or the
// byte offset of a syntax error; `message` holds what was parsed so far.
absl::Status ParseProtoJson(std::string_view json, google::protobuf::Message* message,
                            const ProtoJsonOptions& options = {});

// `message` in the proto3 JSON mapping as protobuf's MessageToJsonString prints it with its
// default options (camelCase names, only the fields that are set, 64-bit integers quoted, enums
// by name): the same JSON value, though not always the same text (escapes, number spelling).
// Printed through reflection: protobuf 3.21 converts the message to its wire format and back
// through a type resolver built anew per call, which took 14% of gradhub-api's CPU per
// CreateJob (the spec as the jobs row stores it); this is several times faster. A message
// holding a well-known type (google.protobuf.*) is left to protobuf.
absl::StatusOr<std::string> ProtoToJson(const google::protobuf::Message& message);

}  // namespace gradhub
