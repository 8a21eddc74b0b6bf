// ParseProtoJson (proto_json.h) and ProtoValueIssues (proto_values.h): each class of JSON the
// proto3 mapping takes but the proto cannot mean is refused naming its field.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "gradhub/v1/jobs.pb.h"
#include "services/common/contract/proto_json.h"
#include "services/common/contract/proto_values.h"

namespace gradhub {
namespace {

// The error of parsing `json` as a JobSpec, "" when it parses.
std::string Refusal(const std::string& json) {
  v1::JobSpec spec;
  const absl::Status status = ParseProtoJson(json, &spec);
  if (status.ok()) return "";
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << json;
  return std::string(status.message());
}

// Refused, with a message that starts with `field` (the field path, JSON spelling).
void ExpectRefusedNaming(const std::string& json, const std::string& field) {
  const std::string refusal = Refusal(json);
  EXPECT_EQ(refusal.rfind(field + ": ", 0), 0u) << json << " => " << refusal;
}

TEST(StrictJsonTest, AcceptsWhatTheProtoMeans) {
  v1::JobSpec spec;
  ASSERT_TRUE(ParseProtoJson(R"({"displayName": "caf\u00e9 \ud83d\ude00",
      "labels": {"team": "vision"}, "model": {"mlp": {"layers": [64, 10], "dropout": 1e-1}},
      "optimizer": {"sgd": {"lr": 0.05}}, "maxSteps": "12", "precision": "BF16",
      "distributed": {"backend": 2, "encryptTraffic": true}, "dataset": null,
      "script": {"args": []}})",
                             &spec)
                  .ok());
  EXPECT_EQ(spec.display_name(), "caf\xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_EQ(spec.model().mlp().layers_size(), 2);
  EXPECT_EQ(spec.max_steps(), 12);
  EXPECT_TRUE(spec.distributed().encrypt_traffic());
  // Well-known types keep their own JSON forms (a Timestamp is a string).
  v1::Job job;
  EXPECT_TRUE(
      ParseProtoJson(R"({"createTime": "2024-01-02T03:04:05Z", "name": "jobs/x"})", &job).ok());
  EXPECT_EQ(job.create_time().seconds(), 1704164645);
  // Case-insensitive enum names, for spec files only.
  EXPECT_FALSE(ParseProtoJson(R"({"precision": "bf16"})", &spec).ok());
  EXPECT_TRUE(
      ParseProtoJson(R"({"precision": "bf16"})", &spec, {.case_insensitive_enums = true}).ok());
}

TEST(StrictJsonTest, UndefinedEnumNumbersAreRefusedNamingTheField) {
  ExpectRefusedNaming(R"({"precision": 7})", "precision");
  ExpectRefusedNaming(R"({"distributed": {"backend": -1}})", "distributed.backend");
  ExpectRefusedNaming(R"({"model": {"mlp": {"activation": 99}}})", "model.mlp.activation");
  EXPECT_NE(Refusal(R"({"precision": 7})").find("FP32, BF16, FP16"), std::string::npos);
}

TEST(StrictJsonTest, NonFiniteNumbersAreRefusedNamingTheField) {
  for (const char* value : {"\"NaN\"", "\"Infinity\"", "\"-Infinity\""}) {
    ExpectRefusedNaming(std::string(R"({"optimizer": {"sgd": {"lr": )") + value + "}}}",
                        "optimizer.sgd.lr");
    ExpectRefusedNaming(std::string(R"({"model": {"mlp": {"dropout": )") + value + "}}}",
                        "model.mlp.dropout");
  }
  // Past a double's range: protobuf's parser refuses it, quoted or not.
  EXPECT_NE(Refusal(R"({"optimizer": {"sgd": {"lr": 1e999}}})"), "");
  EXPECT_NE(Refusal(R"({"optimizer": {"sgd": {"lr": "1e999"}}})"), "");
}

TEST(StrictJsonTest, NestedListsAndNullsInListsAreRefused) {
  ExpectRefusedNaming(R"({"model": {"mlp": {"layers": [[1, 2], [3]]}}})", "model.mlp.layers[0]");
  ExpectRefusedNaming(R"({"model": {"mlp": {"layers": [1, [2]]}}})", "model.mlp.layers[1]");
  ExpectRefusedNaming(R"({"model": {"mlp": {"layers": [1, null, 2]}}})", "model.mlp.layers[1]");
  ExpectRefusedNaming(R"({"script": {"args": [["a"], "b"]}})", "script.args[0]");
  EXPECT_NE(Refusal(R"({"model": {"mlp": {"layers": [[1, 2], [3]]}}})").find("list inside a list"),
            std::string::npos);
}

TEST(StrictJsonTest, EachValueMustHaveItsFieldsShape) {
  ExpectRefusedNaming(R"({"model": {"mlp": {"layers": 5}}})", "model.mlp.layers");
  ExpectRefusedNaming(R"({"displayName": ["a"]})", "displayName");
  ExpectRefusedNaming(R"({"displayName": {"a": 1}})", "displayName");
  ExpectRefusedNaming(R"({"model": [1]})", "model");
  ExpectRefusedNaming(R"({"model": "mlp"})", "model");
  ExpectRefusedNaming(R"({"labels": {"team": ["a"]}})", "labels.team");
  ExpectRefusedNaming(R"({"labels": ["team"]})", "labels");
}

TEST(StrictJsonTest, AFieldGivenTwiceIsRefused) {
  ExpectRefusedNaming(R"({"model": {"mlp": {"layers": [1], "layers": [2]}}})", "model.mlp.layers");
  ExpectRefusedNaming(R"({"displayName": "a", "display_name": "b"})", "displayName");
  ExpectRefusedNaming(R"({"labels": {"a": "b", "a": "c"}})", "labels.a");
}

TEST(StrictJsonTest, OnlyStrictJsonIsJson) {
  for (const char* lenient :
       {R"({'displayName': 'x'})", R"({displayName: "x"})", R"({"displayName": "x",})",
        R"({"model": {"mlp": {"layers": [1, 2,]}}})", "{\"displayName\": \"tab\there\"}", R"([])",
        R"({"displayName": "x"} {})", R"({"maxSteps": 01})", R"({"maxSteps": .5})",
        R"({"displayName": "\ud800"})", R"({"displayName": "\udc00"})", "", "{"}) {
    EXPECT_EQ(Refusal(lenient).rfind("not valid JSON at byte ", 0), 0u)
        << lenient << " => " << Refusal(lenient);
  }
  std::string deep = R"({"unknown": )";  // skipped as any JSON, but not past the depth
  for (int i = 0; i < 150; ++i) deep += "[";
  EXPECT_NE(Refusal(deep).find("nested deeper than 100"), std::string::npos);
}

TEST(StrictJsonTest, NulAndInvalidUtf8AreRefusedInEveryString) {
  ExpectRefusedNaming(R"({"displayName": "a\u0000b"})", "displayName");
  ExpectRefusedNaming(R"({"script": {"args": ["x", "\u0000"]}})", "script.args[1]");
  ExpectRefusedNaming(R"({"script": {"env": {"A": "\u0000"}}})", "script.env.A");
  ExpectRefusedNaming(R"({"labels": {"a\u0000": "b"}})", "labels");
  EXPECT_NE(Refusal("{\"displayName\": \"\xff\"}"), "");  // raw invalid UTF-8
}

TEST(StrictJsonTest, ValueIssuesAreBoundedForAHostileList) {
  v1::JobSpec spec;
  for (int i = 0; i < 100000; ++i) spec.mutable_script()->add_args(std::string(1, '\0'));
  EXPECT_EQ(ProtoValueIssues(spec).size(), kMaxValueIssues);
}

// Truncations and byte flips of a valid body: any answer but a crash (the fuzz target runs
// this at length; here a quick smoke in every test run).
TEST(StrictJsonTest, MangledBodiesNeverCrash) {
  const std::string body = R"({"displayName": "x\u00e9", "labels": {"a": "b"},
      "model": {"mlp": {"layers": [64, 10], "dropout": 0.1}}, "maxSteps": "7",
      "distributed": {"worldSize": 2, "backend": "GLOO"}})";
  std::mt19937 random(7);
  for (size_t cut = 0; cut <= body.size(); ++cut) Refusal(body.substr(0, cut));
  for (int i = 0; i < 20000; ++i) {
    std::string mangled = body;
    mangled[random() % mangled.size()] = static_cast<char>(random() % 256);
    v1::JobSpec spec;
    (void)ParseProtoJson(mangled, &spec);
  }
}

}  // namespace
}  // namespace gradhub
