// The `gradhub` CLI as a user runs it: a real binary against a real gradhub-api on a real
// PostgreSQL. Covers what the server implements today (CreateJob, GetJob, ListJobs, CancelJob,
// ListJobEvents, GetJobMetrics): the text and JSON output of every job command, paging,
// filters, and the exit codes scripts rely on.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gradhub/v1/jobs.pb.h"
#include "gradhub/v1/nodes.grpc.pb.h"
#include "gradhub/v1/tenants.pb.h"
#include "tests/support/job_specs.h"
#include "tests/support/postgres_server.h"
#include "tests/support/subprocess.h"

namespace gradhub {
namespace {

using testing::BinaryPath;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunResult;
using testing::Subprocess;

// A small valid spec with the given labels (YAML flow map body, e.g. `team: vision`).
std::string SmallSpec(const std::string& display_name, const std::string& labels) {
  return "displayName: " + display_name + "\nlabels: {" + labels +
         "}\n"
         "model: {mlp: {layers: [4, 2]}}\n"
         "dataset: {synthetic: {numSamples: 64, numFeatures: 4, numClasses: 2}}\n"
         "optimizer: {sgd: {lr: 0.1}}\n"
         "batchSizePerRank: 8\n"
         "maxSteps: 5\n";
}

template <typename T>
T ParseJson(const std::string& json) {
  T message;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &message);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\nin:\n" << json;
  return message;
}

// A JSON value (from a parsed Struct) back to text, to parse it as a specific message.
std::string ValueJson(const google::protobuf::Value& value) {
  std::string json;
  EXPECT_TRUE(google::protobuf::util::MessageToJsonString(value, &json).ok());
  return json;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

std::vector<std::string> Names(const v1::ListJobsResponse& response) {
  std::vector<std::string> names;
  for (const v1::Job& job : response.jobs()) names.push_back(job.name());
  return names;
}

constexpr char kAdminToken[] = "cli-e2e-admin-secret";

// One gradhub-api (and database) for the whole binary: each test makes its own tenant, and a
// tenant sees only its own jobs, so tests do not see each other's jobs.
class CliE2eTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    url_ = new std::string(testing::PostgresServer::Shared().CreateDatabase());
    api_ = new Subprocess({BinaryPath("gradhub-api"), "--database-url", *url_, "--grpc-address",
                           "127.0.0.1:0", "--http-host", "127.0.0.1", "--http-port", "0",
                           "--shutdown-grace", "1s", "--admin-token", kAdminToken, "serve"});
    static const std::regex kServing("serving gRPC on port ([0-9]+)");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline && api_->running()) {
      std::smatch match;
      const std::string out = api_->out();
      if (std::regex_search(out, match, kServing)) {
        server_ = new std::string("127.0.0.1:" + match[1].str());
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    FAIL() << "gradhub-api did not start:\n" << api_->err();
  }

  static void TearDownTestSuite() {
    delete api_;  // SIGKILL: nothing of the server is under test here
    delete server_;
    delete url_;
  }

  void SetUp() override {
    ASSERT_NE(server_, nullptr) << "no server";
    token_ = NewTenant(&tenant_);
  }

  // A fresh tenant through the bootstrap subcommand; returns its token.
  std::string NewTenant(std::string* tenant) {
    static int count = 0;
    *tenant = "cli-" + std::to_string(getpid()) + "-" + std::to_string(++count);
    RunResult created = testing::Run(
        {BinaryPath("gradhub-api"), "--database-url", *url_, "create-tenant", *tenant});
    EXPECT_EQ(created.exit_code, 0) << created.err;
    return created.out.substr(0, created.out.find('\n'));
  }

  // `gradhub ARGS` with nothing from the environment but `env`.
  RunResult Raw(std::vector<std::string> args, std::map<std::string, std::string> env = {}) {
    args.insert(args.begin(), BinaryPath("gradhub"));
    // Whatever the developer's shell has must not leak into the defaults under test.
    for (const char* name : {"GRADHUB_SERVER", "GRADHUB_TOKEN", "GRADHUB_TLS_CA", "GRADHUB_OUTPUT",
                             "GRADHUB_TIMEOUT"}) {
      env.emplace(name, "");
    }
    return testing::Run(std::move(args), env, std::chrono::seconds(60));
  }

  // `gradhub --server S --token T ARGS`, as this test's tenant.
  RunResult Gradhub(std::vector<std::string> args) { return As(token_, std::move(args)); }
  RunResult As(const std::string& token, std::vector<std::string> args) {
    args.insert(args.begin(), {"--server", *server_, "--token", token});
    return Raw(std::move(args));
  }

  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = dir_.path() + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  // Submits a spec and returns the job's name, failing the test if that does not work.
  std::string Submit(const std::string& spec) {
    static int count = 0;
    RunResult submitted =
        Gradhub({"submit", "-f", WriteFile("spec-" + std::to_string(++count) + ".yaml", spec)});
    EXPECT_EQ(submitted.exit_code, 0) << submitted.err;
    return submitted.out.substr(0, submitted.out.find('\n'));
  }

  v1::Job GetJson(const std::string& job) {
    RunResult got = Gradhub({"get", job, "--output", "json"});
    EXPECT_EQ(got.exit_code, 0) << got.err;
    return ParseJson<v1::Job>(got.out);
  }

  v1::ListJobsResponse ListJson(std::vector<std::string> args) {
    args.insert(args.begin(), {"--output", "json", "list"});
    RunResult listed = Gradhub(args);
    EXPECT_EQ(listed.exit_code, 0) << listed.err;
    return ParseJson<v1::ListJobsResponse>(listed.out);
  }

  static std::string* url_;
  static std::string* server_;
  static Subprocess* api_;
  std::string tenant_, token_;
  testing::TempDir dir_;
};

std::string* CliE2eTest::url_ = nullptr;
std::string* CliE2eTest::server_ = nullptr;
Subprocess* CliE2eTest::api_ = nullptr;

TEST_F(CliE2eTest, SubmitThenGetListDescribeCancel) {
  RunResult submitted =
      Gradhub({"submit", "-f", WriteFile("job.yaml", testing::kArchitectureExampleYaml)});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  static const std::regex kJobLine(
      "jobs/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\n");
  std::smatch match;
  ASSERT_TRUE(std::regex_match(submitted.out, match, kJobLine)) << submitted.out;
  const std::string name = "jobs/" + match[1].str(), uuid = match[1].str();

  // get, text: the status block.
  RunResult got = Gradhub({"get", name});
  ASSERT_EQ(got.exit_code, 0) << got.err;
  EXPECT_TRUE(std::regex_search(got.out, std::regex("(^|\n)name: +" + name + "\n"))) << got.out;
  EXPECT_TRUE(std::regex_search(got.out, std::regex("\nstate: +PENDING\n"))) << got.out;
  EXPECT_TRUE(std::regex_search(got.out, std::regex("\ndisplayName: +digits-mlp\n"))) << got.out;
  EXPECT_TRUE(std::regex_search(got.out, std::regex("\ntenant: +tenants/" + tenant_ + "\n")))
      << got.out;
  EXPECT_TRUE(std::regex_search(got.out, std::regex("\nlabels: +team=vision\n"))) << got.out;
  EXPECT_TRUE(std::regex_search(got.out, std::regex("\nprogress: +0/1000 steps\n"))) << got.out;

  // get, JSON: the Job in the proto3 mapping, and the bare uuid names the same job.
  for (const std::string& arg : {name, uuid}) {
    const v1::Job job = GetJson(arg);
    EXPECT_EQ(job.name(), name);
    EXPECT_EQ(job.tenant(), "tenants/" + tenant_);
    EXPECT_EQ(job.state(), v1::Job::PENDING);
    EXPECT_EQ(job.spec().display_name(), "digits-mlp");
    EXPECT_EQ(job.spec().labels().at("team"), "vision");
    ASSERT_EQ(job.spec().model().mlp().layers_size(), 4);
    EXPECT_EQ(job.spec().model().mlp().layers(1), 256);
    EXPECT_EQ(job.spec().distributed().world_size(), 2);
    EXPECT_EQ(job.spec().dataset().csv().normalize(), v1::CsvDataset::STANDARD);
    EXPECT_EQ(job.spec().max_steps(), 1000);
    EXPECT_TRUE(job.has_create_time());
  }

  // list: text table and JSON.
  RunResult listed = Gradhub({"list"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  std::vector<std::string> rows = Lines(listed.out);
  ASSERT_EQ(rows.size(), 2u) << listed.out;
  EXPECT_TRUE(std::regex_search(rows[0], std::regex("^NAME +STATE +DISPLAY NAME +STEP +CREATED$")))
      << rows[0];
  EXPECT_TRUE(
      std::regex_search(rows[1], std::regex("^" + name + " +PENDING +digits-mlp +0/1000 +20")))
      << rows[1];
  EXPECT_EQ(Names(ListJson({})), std::vector<std::string>{name});

  // describe, text: summary, the spec as YAML, the events.
  RunResult described = Gradhub({"describe", name});
  ASSERT_EQ(described.exit_code, 0) << described.err;
  const std::string& text = described.out;
  const size_t spec_at = text.find("\nspec:\n"), events_at = text.find("\nevents:\n");
  ASSERT_NE(spec_at, std::string::npos) << text;
  ASSERT_NE(events_at, std::string::npos) << text;
  const std::string spec_text = text.substr(spec_at + 7, events_at + 1 - (spec_at + 7));
  EXPECT_THAT(spec_text, HasSubstr("  displayName: digits-mlp\n"));
  EXPECT_THAT(spec_text, HasSubstr("      layers: [64, 256, 256, 10]\n"));
  EXPECT_THAT(spec_text, HasSubstr("      normalize: STANDARD\n"));
  EXPECT_THAT(spec_text, HasSubstr("  labels:\n    team: vision\n"));
  EXPECT_TRUE(std::regex_search(text.substr(events_at), std::regex("STATE_CHANGED +-> PENDING")))
      << text;

  // The YAML that describe prints is a spec that submits again, to the same spec.
  std::string resubmit;
  for (const std::string& line : Lines(spec_text)) resubmit += line.substr(2) + "\n";
  RunResult again =
      Gradhub({"--output", "json", "submit", "-f", WriteFile("described.yaml", resubmit)});
  ASSERT_EQ(again.exit_code, 0) << again.err << "\n" << resubmit;
  const v1::Job copy = ParseJson<v1::Job>(again.out);
  EXPECT_NE(copy.name(), name);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(copy.spec(), GetJson(name).spec()))
      << resubmit;

  // describe, JSON: one document, {"job": Job, "events": [JobEvent...]}.
  RunResult described_json = Gradhub({"describe", name, "--output", "json"});
  ASSERT_EQ(described_json.exit_code, 0) << described_json.err;
  const auto document = ParseJson<google::protobuf::Struct>(described_json.out);
  ASSERT_TRUE(document.fields().count("job")) << described_json.out;
  EXPECT_EQ(ParseJson<v1::Job>(ValueJson(document.fields().at("job"))).name(), name);
  const auto& events = document.fields().at("events").list_value();
  ASSERT_EQ(events.values_size(), 1) << described_json.out;
  const auto event = ParseJson<v1::JobEvent>(ValueJson(events.values(0)));
  EXPECT_EQ(event.type(), v1::JobEvent::STATE_CHANGED);
  EXPECT_EQ(event.to_state(), v1::Job::PENDING);

  // cancel: prints the new state; idempotent; visible in get and describe afterwards.
  RunResult cancelled = Gradhub({"cancel", uuid, "--reason", "testing"});
  ASSERT_EQ(cancelled.exit_code, 0) << cancelled.err;
  EXPECT_EQ(cancelled.out, name + " CANCELLED\n");
  RunResult cancelled_again = Gradhub({"--output", "json", "cancel", name});
  ASSERT_EQ(cancelled_again.exit_code, 0) << cancelled_again.err;
  EXPECT_EQ(ParseJson<v1::Job>(cancelled_again.out).state(), v1::Job::CANCELLED);
  const v1::Job after = GetJson(name);
  EXPECT_EQ(after.state(), v1::Job::CANCELLED);
  EXPECT_TRUE(after.has_end_time());
  RunResult described_after = Gradhub({"describe", name});
  ASSERT_EQ(described_after.exit_code, 0) << described_after.err;
  EXPECT_TRUE(std::regex_search(described_after.out, std::regex("\nstate: +CANCELLED\n")));
  EXPECT_TRUE(
      std::regex_search(described_after.out, std::regex("STATE_CHANGED +PENDING -> CANCELLED")))
      << described_after.out;
  EXPECT_TRUE(std::regex_search(described_after.out, std::regex("\nended: +20")))
      << described_after.out;
}

TEST_F(CliE2eTest, SubmitJsonAndRequestIds) {
  const std::string file = WriteFile("job.yaml", testing::kArchitectureExampleYaml);
  RunResult first = Gradhub({"--output", "json", "submit", "-f", file, "--request-id", "rid-1"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const v1::Job job = ParseJson<v1::Job>(first.out);
  EXPECT_EQ(job.name().rfind("jobs/", 0), 0u) << first.out;
  EXPECT_EQ(job.state(), v1::Job::PENDING);
  EXPECT_EQ(job.request_id(), "rid-1");

  // Without --request-id each invocation sends a fresh random UUID.
  RunResult defaulted = Gradhub({"submit", "-f", file, "--output", "json"});
  ASSERT_EQ(defaulted.exit_code, 0) << defaulted.err;
  EXPECT_TRUE(std::regex_match(
      ParseJson<v1::Job>(defaulted.out).request_id(),
      std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")))
      << defaulted.out;

  // The same request id is the same job; the default (a fresh random id) is a new one.
  RunResult retry = Gradhub({"submit", "--request-id=rid-1", "-f", file});
  ASSERT_EQ(retry.exit_code, 0) << retry.err;
  EXPECT_EQ(retry.out, job.name() + "\n");
  RunResult fresh1 = Gradhub({"submit", "-f", file}), fresh2 = Gradhub({"submit", "-f", file});
  ASSERT_EQ(fresh1.exit_code, 0) << fresh1.err;
  ASSERT_EQ(fresh2.exit_code, 0) << fresh2.err;
  EXPECT_NE(fresh1.out, fresh2.out);
  EXPECT_NE(fresh1.out, retry.out);
  EXPECT_EQ(ListJson({}).jobs_size(), 4);

  // The same request id with a different spec is ALREADY_EXISTS: exit 7.
  RunResult conflict = Gradhub(
      {"submit", "-f", WriteFile("other.yaml", SmallSpec("other", "")), "--request-id", "rid-1"});
  EXPECT_EQ(conflict.exit_code, 7) << conflict.err;
  EXPECT_THAT(conflict.err, HasSubstr("gradhub: ALREADY_EXISTS: "));
  EXPECT_EQ(conflict.out, "");
}

TEST_F(CliE2eTest, ListPagesAndAllFollowsPageTokens) {
  std::vector<std::string> submitted;
  for (int i = 0; i < 7; ++i)
    submitted.push_back(Submit(SmallSpec("job-" + std::to_string(i), "")));
  ASSERT_EQ(std::set<std::string>(submitted.begin(), submitted.end()).size(), 7u);
  const std::vector<std::string> newest_first(submitted.rbegin(), submitted.rend());

  // One page: three rows, and a hint on stderr (not stdout) saying how to get the rest.
  RunResult page = Gradhub({"list", "--page-size", "3"});
  ASSERT_EQ(page.exit_code, 0) << page.err;
  EXPECT_EQ(Lines(page.out).size(), 4u) << page.out;
  EXPECT_THAT(page.err, HasSubstr("--page-token "));
  const v1::ListJobsResponse first = ListJson({"--page-size", "3"});
  EXPECT_EQ(Names(first), std::vector<std::string>(newest_first.begin(), newest_first.begin() + 3));
  ASSERT_FALSE(first.next_page_token().empty());

  // --page-token continues where the first page stopped.
  const v1::ListJobsResponse second =
      ListJson({"--page-size", "3", "--page-token", first.next_page_token()});
  EXPECT_EQ(Names(second),
            std::vector<std::string>(newest_first.begin() + 3, newest_first.begin() + 6));

  // --all: every job once, newest first, in one response without a next page.
  const v1::ListJobsResponse all = ListJson({"--page-size", "3", "--all"});
  EXPECT_EQ(Names(all), newest_first);
  EXPECT_TRUE(all.next_page_token().empty());
  RunResult all_text = Gradhub({"list", "--all", "--page-size=2"});
  ASSERT_EQ(all_text.exit_code, 0) << all_text.err;
  const std::vector<std::string> rows = Lines(all_text.out);
  ASSERT_EQ(rows.size(), 8u) << all_text.out;
  for (size_t i = 0; i < newest_first.size(); ++i) {
    EXPECT_EQ(rows[i + 1].rfind(newest_first[i] + " ", 0), 0u) << rows[i + 1];
  }
  EXPECT_EQ(all_text.err, "");

  // The page size the server's default (50) leaves in one page.
  EXPECT_EQ(ListJson({}).jobs_size(), 7);
}

TEST_F(CliE2eTest, ListFiltersByStateAndLabels) {
  const std::string vision1 = Submit(SmallSpec("v1", "team: vision"));
  const std::string vision2 = Submit(SmallSpec("v2", "team: vision, owner: Ann Lee"));
  const std::string nlp = Submit(SmallSpec("n1", "team: nlp"));
  const std::string unlabelled = Submit(SmallSpec("u1", ""));
  ASSERT_EQ(Gradhub({"cancel", vision1}).exit_code, 0);

  auto set = [](const v1::ListJobsResponse& response) {
    const std::vector<std::string> names = Names(response);
    return std::set<std::string>(names.begin(), names.end());
  };
  using Set = std::set<std::string>;
  EXPECT_EQ(set(ListJson({"--label", "team=vision"})), (Set{vision1, vision2}));
  EXPECT_EQ(set(ListJson({"--label=team=nlp"})), (Set{nlp}));
  // State names are case-insensitive on the command line.
  EXPECT_EQ(set(ListJson({"--state", "cancelled"})), (Set{vision1}));
  EXPECT_EQ(set(ListJson({"--state", "PENDING"})), (Set{vision2, nlp, unlabelled}));
  EXPECT_EQ(set(ListJson({"--state", "PENDING", "--label", "team=vision"})), (Set{vision2}));
  // A value with a space, and two labels at once (ANDed).
  EXPECT_EQ(set(ListJson({"--label", "owner=Ann Lee"})), (Set{vision2}));
  EXPECT_EQ(set(ListJson({"--label", "owner=Ann Lee", "--label", "team=vision"})), (Set{vision2}));
  EXPECT_EQ(set(ListJson({"--label", "owner=Ann Lee", "--label", "team=nlp"})), Set{});
  EXPECT_EQ(set(ListJson({"--label", "team=robotics"})), Set{});

  // Text output filters the same way.
  RunResult text = Gradhub({"list", "--label", "team=vision", "--state", "PENDING"});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  ASSERT_EQ(Lines(text.out).size(), 2u) << text.out;
  EXPECT_EQ(Lines(text.out)[1].rfind(vision2 + " ", 0), 0u) << text.out;

  // A state the server does not know is its INVALID_ARGUMENT (4), message passed through.
  RunResult bad_state = Gradhub({"list", "--state", "SLEEPING"});
  EXPECT_EQ(bad_state.exit_code, 4) << bad_state.err;
  EXPECT_THAT(bad_state.err, HasSubstr("gradhub: INVALID_ARGUMENT: "));
  EXPECT_THAT(bad_state.err, HasSubstr("SLEEPING"));
  // A label the filter grammar cannot carry is a usage error (2), caught before sending.
  for (const char* label : {"novalue", "=v", "k=say \"hi\""}) {
    RunResult bad = Gradhub({"list", "--label", label});
    EXPECT_EQ(bad.exit_code, 2) << label << ": " << bad.err;
    EXPECT_THAT(bad.err, HasSubstr("gradhub: USAGE: --label"));
  }
}

TEST_F(CliE2eTest, InvalidSpecsExit4NamingTheField) {
  // Unknown field: refused locally by the parser, nothing sent.
  RunResult unknown =
      Gradhub({"submit", "-f",
               WriteFile("typo.yaml", SmallSpec("typo", "") + "distributed: {worldSizes: 2}\n")});
  EXPECT_EQ(unknown.exit_code, 4) << unknown.err;
  EXPECT_THAT(unknown.err, HasSubstr("gradhub: INVALID_ARGUMENT: "));
  EXPECT_THAT(unknown.err, HasSubstr("worldSizes"));
  EXPECT_THAT(unknown.err, HasSubstr("typo.yaml"));
  EXPECT_EQ(unknown.out, "");

  // An enum value that does not exist.
  RunResult enum_value =
      Gradhub({"submit", "-f",
               WriteFile("enum.yaml", SmallSpec("enum", "") + "distributed: {backend: MPI}\n")});
  EXPECT_EQ(enum_value.exit_code, 4) << enum_value.err;
  EXPECT_THAT(enum_value.err, HasSubstr("backend"));

  // Not YAML at all, and a file that is not there.
  RunResult broken = Gradhub({"submit", "-f", WriteFile("broken.yaml", "model: {mlp: [1, 2\n")});
  EXPECT_EQ(broken.exit_code, 4) << broken.err;
  EXPECT_THAT(broken.err, HasSubstr("broken.yaml"));
  RunResult missing = Gradhub({"submit", "-f", dir_.path() + "/nope.yaml"});
  EXPECT_EQ(missing.exit_code, 4) << missing.err;
  EXPECT_THAT(missing.err, HasSubstr("nope.yaml"));

  // Parses, but the server's validation refuses it: its message names the field.
  RunResult server_side =
      Gradhub({"submit", "-f",
               WriteFile("one-layer.yaml",
                         "model: {mlp: {layers: [4]}}\n"
                         "dataset: {synthetic: {numSamples: 64, numFeatures: 4, numClasses: 2}}\n"
                         "optimizer: {sgd: {lr: 0.1}}\nbatchSizePerRank: 8\nmaxSteps: 5\n")});
  EXPECT_EQ(server_side.exit_code, 4) << server_side.err;
  EXPECT_THAT(server_side.err, HasSubstr("gradhub: INVALID_ARGUMENT: "));
  EXPECT_THAT(server_side.err, HasSubstr("model.mlp.layers"));

  // None of them made a job.
  EXPECT_EQ(ListJson({}).jobs_size(), 0);
}

TEST_F(CliE2eTest, MissingJobsExit3) {
  const std::string absent = "jobs/00000000-0000-4000-8000-000000000000";
  for (const char* command : {"get", "describe", "cancel"}) {
    RunResult result = Gradhub({command, absent});
    EXPECT_EQ(result.exit_code, 3) << command << ": " << result.err;
    EXPECT_THAT(result.err, HasSubstr("gradhub: NOT_FOUND: ")) << command;
    EXPECT_EQ(result.out, "") << command;
  }
  RunResult malformed = Gradhub({"get", "not-a-uuid"});
  EXPECT_EQ(malformed.exit_code, 3) << malformed.err;

  // Another tenant's job is NOT_FOUND too.
  const std::string mine = Submit(SmallSpec("mine", ""));
  std::string other_tenant;
  const std::string other = NewTenant(&other_tenant);
  RunResult foreign = As(other, {"get", mine});
  EXPECT_EQ(foreign.exit_code, 3) << foreign.err;
  EXPECT_EQ(Gradhub({"get", mine}).exit_code, 0);
}

TEST_F(CliE2eTest, BadTokensExit5) {
  for (const std::string& token : {std::string("ghk_not-a-real-token"), std::string()}) {
    for (const std::vector<std::string>& args :
         std::vector<std::vector<std::string>>{{"list"}, {"get", "jobs/x"}}) {
      RunResult result = As(token, args);
      EXPECT_EQ(result.exit_code, 5) << "token '" << token << "' " << args[0] << ": " << result.err;
      EXPECT_THAT(result.err, HasSubstr("gradhub: UNAUTHENTICATED: "));
      EXPECT_EQ(result.out, "");
    }
  }
  RunResult submit =
      As("ghk_wrong", {"submit", "-f", WriteFile("job.yaml", testing::kArchitectureExampleYaml)});
  EXPECT_EQ(submit.exit_code, 5) << submit.err;
}

TEST_F(CliE2eTest, UnreachableServerExits6) {
  // Nothing listens on port 1: connection refused, UNAVAILABLE.
  RunResult refused = Raw({"--server", "127.0.0.1:1", "--token", token_, "list"});
  EXPECT_EQ(refused.exit_code, 6) << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("gradhub: UNAVAILABLE: "));
  EXPECT_EQ(refused.out, "");

  // A socket that accepts connections but never speaks gRPC: the --timeout deadline.
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 16), 0);
  socklen_t length = sizeof(address);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string silent = "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  const auto start = std::chrono::steady_clock::now();
  RunResult silent_result =
      Raw({"--server", silent, "--token", token_, "--timeout", "700ms", "get", "jobs/x"});
  const auto elapsed = std::chrono::steady_clock::now() - start;
  close(listener);
  EXPECT_EQ(silent_result.exit_code, 6) << silent_result.err;
  EXPECT_THAT(silent_result.err, HasSubstr("gradhub: DEADLINE_EXCEEDED: "));
  EXPECT_LT(elapsed, std::chrono::seconds(10));
}

// A second gradhub-api on the same database, serving TLS on both ports: the CLI reaches it
// only with --tls-ca, and its /metrics (over HTTPS) counts the CLI's gRPC calls.
TEST_F(CliE2eTest, TlsServerIsReachedWithTheCaAndCountsCallsInMetrics) {
  const std::string cert = dir_.path() + "/cert.pem", key = dir_.path() + "/key.pem";
  RunResult made =
      testing::Run({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days",
                    "1", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key, "-out", cert});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  Subprocess api({BinaryPath("gradhub-api"), "--database-url", *url_, "--grpc-address",
                  "127.0.0.1:0", "--http-host", "127.0.0.1", "--http-port", "0", "--shutdown-grace",
                  "1s", "--tls-cert", cert, "--tls-key", key, "serve"});
  static const std::regex kPorts("serving REST on port ([0-9]+)\\n.*serving gRPC on port ([0-9]+)");
  std::smatch ports;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::string out;
  while (std::chrono::steady_clock::now() < deadline && api.running()) {
    out = api.out();
    if (std::regex_search(out, ports, kPorts)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(ports.size(), 3u) << api.err();
  const std::string server = "127.0.0.1:" + ports[2].str();

  RunResult listed = Raw({"--server", server, "--token", token_, "--tls-ca", cert, "list"});
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  RunResult plaintext = Raw({"--server", server, "--token", token_, "--timeout", "2s", "list"});
  EXPECT_EQ(plaintext.exit_code, 6) << plaintext.err;
  RunResult no_ca =
      Raw({"--server", server, "--token", token_, "--tls-ca", dir_.path() + "/none.pem", "list"});
  EXPECT_EQ(no_ca.exit_code, 2) << no_ca.err;
  EXPECT_THAT(no_ca.err, HasSubstr("--tls-ca"));

  httplib::SSLClient https("127.0.0.1", std::stoi(ports[1].str()));
  https.set_ca_cert_path(cert.c_str());
  https.enable_server_certificate_verification(true);
  auto metrics = https.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_THAT(
      metrics->body,
      HasSubstr(
          R"(gradhub_api_requests_total{code="OK",method="JobService.ListJobs",transport="grpc"} 1)"));
  EXPECT_THAT(
      metrics->body,
      HasSubstr(
          R"(gradhub_api_request_duration_seconds_count{method="JobService.ListJobs",transport="grpc"} 1)"));
}

TEST_F(CliE2eTest, BadUsageExits2WithoutCallingTheServer) {
  // The server is unreachable here: had any of these sent a call, the exit would be 6.
  const std::string file = WriteFile("job.yaml", testing::kArchitectureExampleYaml);
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"frobnicate"},
      {"list", "--no-such-flag"},
      {"list", "-x"},
      {"list", "extra"},
      {"list", "--page-size", "-1"},
      {"list", "--page-size", "many"},
      {"get"},
      {"get", "a", "b"},
      {"get", "nodes/x"},
      {"submit"},
      {"submit", file},
      {"--output", "yaml", "list"},
      {"list", "--output", "yaml"},
      {"--state", "RUNNING", "list"},
      {"--server"},
      {"--timeout", "0s", "list"},
      {"nodes", "explode"},
      {"admin"},
      {"logs", "jobs/x", "--rank", "-7"},
      {"admin", "create-token", "t", "--kind", "root"},
      {"admin", "revoke-token", "tenants/t"},
      {"metrics"},
      {"metrics", "jobs/x", "--max-points", "-1"},
      {"metrics", "jobs/x", "--max-points", "lots"},
  };
  for (std::vector<std::string> args : cases) {
    std::string shown;
    for (const std::string& arg : args) shown += arg + " ";
    args.insert(args.begin(), {"--server", "127.0.0.1:1", "--token", "t"});
    // `gradhub --server` alone: the flag's value is missing, not a server.
    if (shown == "--server ") args = {"--server"};
    RunResult result = Raw(args);
    EXPECT_EQ(result.exit_code, 2) << "gradhub " << shown << "\n" << result.err;
    EXPECT_THAT(result.err, HasSubstr("gradhub: USAGE: ")) << "gradhub " << shown;
    EXPECT_EQ(result.out, "") << "gradhub " << shown;
  }

  // --help: usage on stdout, exit 0, with every exit code listed.
  RunResult help = Raw({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  for (const char* line :
       {"  0  ok", "  1  internal", "  2  usage", "  3  not found", "  4  invalid argument",
        "  5  unauthenticated", "  6  server unavailable", "  7  failed precondition",
        "  8  watch: the job FAILED", "  9  watch: the job was CANCELLED", "GRADHUB_SERVER",
        "GRADHUB_TOKEN", "submit -f FILE", "nodes drain NODE", "admin create-token TENANT"}) {
    EXPECT_THAT(help.out, HasSubstr(line));
  }
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"submit", "--help"}, {"help", "submit"}, {"--help", "submit"}}) {
    RunResult command_help = Raw(args);
    EXPECT_EQ(command_help.exit_code, 0) << args[0];
    EXPECT_THAT(command_help.out, HasSubstr("Usage: gradhub submit -f FILE")) << args[0];
    EXPECT_THAT(command_help.out, HasSubstr("--request-id")) << args[0];
  }
  RunResult nodes_help = Raw({"nodes", "cordon", "--help"});
  EXPECT_EQ(nodes_help.exit_code, 0);
  EXPECT_THAT(nodes_help.out, HasSubstr("Usage: gradhub nodes cordon NODE"));
}

TEST_F(CliE2eTest, EnvironmentFallbacksAndFlagPrecedence) {
  const std::string job = Submit(SmallSpec("env", ""));
  const std::map<std::string, std::string> env = {{"GRADHUB_SERVER", *server_},
                                                  {"GRADHUB_TOKEN", token_}};
  RunResult from_env = Raw({"get", job}, env);
  ASSERT_EQ(from_env.exit_code, 0) << from_env.err;
  EXPECT_TRUE(std::regex_search(from_env.out, std::regex("(^|\n)name: +" + job + "\n")));

  // GRADHUB_OUTPUT too.
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(env.begin(), env.end());
    return extra;
  };
  RunResult json = Raw({"get", job}, with({{"GRADHUB_OUTPUT", "json"}}));
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_EQ(ParseJson<v1::Job>(json.out).name(), job);

  // A flag beats its variable, in both directions and on either side of the command.
  RunResult bad_env_server =
      Raw({"get", job, "--server", *server_}, with({{"GRADHUB_SERVER", "127.0.0.1:1"}}));
  EXPECT_EQ(bad_env_server.exit_code, 0) << bad_env_server.err;
  RunResult bad_env_token =
      Raw({"--token", token_, "get", job}, with({{"GRADHUB_TOKEN", "ghk_wrong"}}));
  EXPECT_EQ(bad_env_token.exit_code, 0) << bad_env_token.err;
  RunResult bad_flag_token = Raw({"get", job, "--token", "ghk_wrong"}, env);
  EXPECT_EQ(bad_flag_token.exit_code, 5) << bad_flag_token.err;
  RunResult bad_flag_server = Raw({"--server", "127.0.0.1:1", "get", job}, env);
  EXPECT_EQ(bad_flag_server.exit_code, 6) << bad_flag_server.err;
  RunResult env_only_server = Raw({"get", job}, {{"GRADHUB_SERVER", *server_}});
  EXPECT_EQ(env_only_server.exit_code, 5) << env_only_server.err;  // no token at all
}

TEST_F(CliE2eTest, AdminCreatesTenantsAndTokensAndRevokesThem) {
  const std::string tenant = "adm-" + std::to_string(getpid());
  RunResult created = As(kAdminToken, {"admin", "create-tenant", tenant});
  ASSERT_EQ(created.exit_code, 0) << created.err;
  EXPECT_EQ(As(kAdminToken, {"admin", "create-tenant", tenant}).exit_code, 7);  // ALREADY_EXISTS
  EXPECT_EQ(As(token_, {"admin", "create-tenant", "other"}).exit_code, 5);      // not the admin
  // A retry with the first call's request id gets its tenant; any other call, ALREADY_EXISTS.
  const std::vector<std::string> retried = {"admin", "create-tenant", tenant + "-r", "--request-id",
                                            "r1"};
  EXPECT_EQ(As(kAdminToken, retried).exit_code, 0);
  RunResult again = As(kAdminToken, retried);
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, "tenants/" + tenant + "-r\n");
  EXPECT_EQ(As(kAdminToken, {"admin", "create-tenant", tenant + "-r"}).exit_code, 7);

  RunResult listed = As(kAdminToken, {"admin", "list-tenants"});
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find(tenant), std::string::npos) << listed.out;

  RunResult token = As(kAdminToken, {"--output", "json", "admin", "create-token", tenant});
  ASSERT_EQ(token.exit_code, 0) << token.err;
  const auto response = ParseJson<v1::CreateTokenResponse>(token.out);
  ASSERT_EQ(response.secret().rfind("ghk_", 0), 0u) << token.out;
  // The new token works as its tenant, and stops working once revoked.
  EXPECT_EQ(As(response.secret(), {"list"}).exit_code, 0);
  RunResult revoked = As(kAdminToken, {"admin", "revoke-token", response.token().name()});
  ASSERT_EQ(revoked.exit_code, 0) << revoked.err;
  EXPECT_EQ(As(response.secret(), {"list"}).exit_code, 5);
  EXPECT_EQ(As(kAdminToken, {"admin", "revoke-token", response.token().name()}).exit_code, 0);
}

// One node agent's side of the protocol, for a test that needs a job's rank 0 to have run:
// registers a node of one slot, heartbeats until the scheduler has placed `job` there, and
// ships rank 0's stdout lines as an agent does.
class FakeAgent {
 public:
  FakeAgent(const std::string& server, std::string token, std::string name)
      : stub_(v1::NodeService::NewStub(
            grpc::CreateChannel(server, grpc::InsecureChannelCredentials()))),
        token_(std::move(token)),
        name_(std::move(name)) {}

  bool Register() {
    v1::RegisterNodeRequest request;
    request.mutable_node()->set_name("nodes/" + name_);
    request.mutable_node()->set_slots(1);
    request.mutable_node()->add_data_roots("/data");  // where the tests' specs name files
    v1::RegisterNodeResponse response;
    const grpc::Status status = stub_->RegisterNode(Context().get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    session_ = response.session_id();
    return status.ok();
  }

  // The attempt of `job` placed here, or 0 when none was within 90 s (scheduler passes are
  // spaced by their own duration, which grows on a loaded machine).
  int32_t AwaitPlacement(const std::string& job) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    while (std::chrono::steady_clock::now() < deadline) {
      const v1::HeartbeatResponse beat = Heartbeat({});
      for (const v1::RankAssignment& rank : beat.desired_ranks()) {
        if (rank.job() == job && rank.rank() == 0) return rank.attempt();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return 0;
  }

  v1::HeartbeatResponse Heartbeat(const std::vector<v1::RankStatus>& ranks) {
    v1::HeartbeatRequest request;
    request.set_node("nodes/" + name_);
    request.set_session_id(session_);
    request.set_seq(++seq_);
    for (const v1::RankStatus& rank : ranks) *request.add_ranks() = rank;
    v1::HeartbeatResponse response;
    const grpc::Status status = stub_->Heartbeat(Context().get(), request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }

  // Rank 0's stdout lines numbered from `first_seq` on (a later batch goes on from there).
  bool ShipStdout(const std::string& job, int32_t attempt, const std::vector<std::string>& lines,
                  int64_t first_seq = 1) {
    v1::ReportLogsRequest batch;
    batch.set_job(job);
    batch.set_attempt(attempt);
    batch.set_rank(0);
    batch.set_stream(v1::LogEntry::STDOUT);
    batch.set_first_seq(first_seq);
    for (const std::string& line : lines) batch.add_lines(line);
    auto context = Context();
    v1::ReportLogsResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::ReportLogsRequest>> writer =
        stub_->ReportLogs(context.get(), &response);
    const bool written = writer->Write(batch);
    writer->WritesDone();
    const grpc::Status status = writer->Finish();
    EXPECT_TRUE(written && status.ok()) << status.error_message();
    return status.ok() &&
           response.acked_seq() == first_seq - 1 + static_cast<int64_t>(lines.size());
  }

 private:
  std::unique_ptr<grpc::ClientContext> Context() const {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("authorization", "Bearer " + token_);
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return context;
  }

  std::unique_ptr<v1::NodeService::Stub> stub_;
  std::string token_, name_, session_;
  int64_t seq_ = 0;
};

// The cases whose job's rank 0 runs, on a node of its own behind a fake agent. Last in this
// file: their nodes take jobs, which no other case here expects of the server.
class CliRunningJobTest : public CliE2eTest {
 protected:
  // Registers a node named `label` with one slot, waits until `job` is placed there and reports
  // its rank 0 RUNNING; returns that rank's status (attempt 0, after failing the test, when the
  // job was not placed). Submit the job first, above every other case's pending job, so that
  // the node's one slot is its.
  v1::RankStatus StartOnNewNode(const std::string& job, const std::string& label) {
    RunResult node_token =
        testing::Run({BinaryPath("gradhub-api"), "--database-url", *url_, "create-node-token"});
    EXPECT_EQ(node_token.exit_code, 0) << node_token.err;
    agent_ = std::make_unique<FakeAgent>(
        *server_, node_token.out.substr(0, node_token.out.find('\n')), label);
    v1::RankStatus rank;
    if (!agent_->Register()) return rank;
    const int32_t attempt = agent_->AwaitPlacement(job);
    EXPECT_GT(attempt, 0) << "the scheduler did not place " << job << ":\n"
                          << Gradhub({"describe", job}).out;
    if (attempt == 0) return rank;
    rank.set_job(job);
    rank.set_attempt(attempt);
    rank.set_rank(0);
    rank.set_pid(4242);
    rank.set_state(v1::RankStatus::RUNNING);
    agent_->Heartbeat({rank});
    return rank;
  }

  std::unique_ptr<FakeAgent> agent_;
};

TEST_F(CliRunningJobTest, MetricsPrintsTheHistoryAsATableAPlotAndJson) {
  const std::string label = "metrics-" + std::to_string(getpid());
  const std::string job = Submit(SmallSpec("metrics", "") + "priority: 1000\n");
  const int32_t attempt = StartOnNewNode(job, label).attempt();
  ASSERT_GT(attempt, 0);
  FakeAgent& agent = *agent_;
  // Rank 0's stdout as gradhub-trainer prints it.
  std::vector<std::string> lines = {"gradhub-trainer: starting"};
  for (int step = 10; step <= 40; step += 10) {
    lines.push_back("{\"event\":\"progress\",\"step\":" + std::to_string(step) +
                    ",\"totalSteps\":40,\"epoch\":0,\"loss\":" + std::to_string(4.0 / step) +
                    ",\"lr\":0.1,\"samplesPerSecond\":640}");
    if (step % 20 == 0) {
      lines.push_back("{\"event\":\"eval\",\"step\":" + std::to_string(step) +
                      ",\"totalSteps\":40,\"eval.accuracy\":" + std::to_string(step / 50.0) + "}");
    }
  }
  ASSERT_TRUE(agent.ShipStdout(job, attempt, lines));

  // Text: the table, then the plot below it.
  RunResult text = Gradhub({"metrics", job});
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.err, "");
  const std::vector<std::string> rows = Lines(text.out);
  ASSERT_GE(rows.size(), 5u + 1 + 15 + 3) << text.out;
  EXPECT_TRUE(std::regex_match(rows[0], std::regex("STEP +ATTEMPT +LOSS +LR +SAMPLES/S +EVAL")))
      << rows[0];
  EXPECT_TRUE(std::regex_match(rows[1], std::regex("10 +1 +0.4 +0.1 +640 +-"))) << rows[1];
  EXPECT_TRUE(std::regex_match(rows[2], std::regex("20 +1 +0.2 +0.1 +640 +accuracy=0.4")))
      << rows[2];
  EXPECT_TRUE(std::regex_match(rows[4], std::regex("40 +1 +0.1 +0.1 +640 +accuracy=0.8")))
      << rows[4];
  EXPECT_EQ(rows[5], "");
  EXPECT_EQ(rows[6], "loss by step");
  EXPECT_TRUE(std::regex_match(rows[7], std::regex(" *0\\.4 \\|\\*"))) << text.out;
  EXPECT_THAT(text.out, HasSubstr("+" + std::string(60, '-') + "\n"));
  EXPECT_TRUE(std::regex_search(text.out, std::regex(" 10 +40 step\n$"))) << text.out;

  // JSON: the JobMetrics message.
  RunResult json = Gradhub({"--output", "json", "metrics", job});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const auto metrics = ParseJson<v1::JobMetrics>(json.out);
  EXPECT_EQ(metrics.name(), job);
  EXPECT_EQ(metrics.recorded_points(), 4);
  EXPECT_EQ(metrics.total_steps(), 40);
  ASSERT_EQ(metrics.points_size(), 4);
  EXPECT_EQ(metrics.points(3).eval_metrics().at("accuracy"), 0.8);

  // Fewer points: the first and the last stay; a note on stderr says there are more.
  RunResult few = Gradhub({"metrics", job, "--max-points", "2"});
  ASSERT_EQ(few.exit_code, 0) << few.err;
  EXPECT_EQ(Lines(few.out)[1].substr(0, 3), "10 ");
  EXPECT_EQ(Lines(few.out)[2].substr(0, 3), "40 ");
  EXPECT_THAT(few.err, HasSubstr("2 of 4 recorded points"));
  RunResult too_many = Gradhub({"metrics", job, "--max-points", "20000"});
  EXPECT_EQ(too_many.exit_code, 4) << too_many.err;
  EXPECT_THAT(too_many.err, HasSubstr("max_points"));
  std::string other_tenant;
  EXPECT_EQ(As(NewTenant(&other_tenant), {"metrics", job}).exit_code, 3);

  // A job without a history yet: the header, no plot, a note.
  RunResult empty = Gradhub({"metrics", Submit(SmallSpec("quiet", ""))});
  ASSERT_EQ(empty.exit_code, 0) << empty.err;
  EXPECT_EQ(Lines(empty.out).size(), 1u) << empty.out;
  EXPECT_THAT(empty.err, HasSubstr("no points yet"));

  // Leave nothing running: the job cancelled, the node cordoned (it goes LOST without beats).
  EXPECT_EQ(Gradhub({"cancel", job}).exit_code, 0);
  EXPECT_EQ(As(kAdminToken, {"nodes", "cordon", label}).exit_code, 0);
}

// A finished job's progress is complete: epoch, learning rate and evaluation from the lines
// rank 0 printed, none blanked by the evaluation and "done" lines that come last (shipped after
// the exit, as agents ship them), and every number in plain notation.
TEST_F(CliRunningJobTest, FinishedJobShowsItsWholeProgressInPlainNumbers) {
  const std::string label = "finished-" + std::to_string(getpid());
  const std::string job = Submit(SmallSpec("finished", "") + "priority: 1000\n");
  v1::RankStatus rank = StartOnNewNode(job, label);
  const int32_t attempt = rank.attempt();
  ASSERT_GT(attempt, 0);
  FakeAgent& agent = *agent_;
  // Two epochs of 20 steps, a falling learning rate, 18750.7 samples/s.
  std::vector<std::string> lines;
  for (int step = 10; step <= 40; step += 10) {
    lines.push_back("{\"event\":\"progress\",\"step\":" + std::to_string(step) +
                    ",\"totalSteps\":40,\"epoch\":" + std::to_string((step - 1) / 20) +
                    ",\"loss\":" + std::to_string(4.0 / step) +
                    ",\"lr\":" + std::to_string(0.001 / step) + ",\"samplesPerSecond\":18750.7}");
  }
  ASSERT_TRUE(agent.ShipStdout(job, attempt, lines));
  rank.set_state(v1::RankStatus::SUCCEEDED);
  rank.set_exit_code(0);
  v1::Job finished;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (finished.state() != v1::Job::SUCCEEDED && std::chrono::steady_clock::now() < deadline) {
    agent.Heartbeat({rank});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    finished = GetJson(job);
  }
  ASSERT_EQ(finished.state(), v1::Job::SUCCEEDED) << Gradhub({"describe", job}).out;
  // The trainer's last lines: the final evaluation and its "done" record, after the exit.
  ASSERT_TRUE(agent.ShipStdout(
      job, attempt,
      {R"({"event":"eval","step":40,"totalSteps":40,"eval.accuracy":0.875,"eval.loss":0.25})",
       R"({"event":"done","rank":0,"step":40,"totalSteps":40,"loss":0.09,"trainSeconds":2.5})"},
      lines.size() + 1));

  const v1::Job job_json = GetJson(job);
  EXPECT_EQ(job_json.progress().step(), 40);
  EXPECT_EQ(job_json.progress().epoch(), 1);
  EXPECT_DOUBLE_EQ(job_json.progress().loss(), 0.1);
  EXPECT_DOUBLE_EQ(job_json.progress().learning_rate(), 0.000025);
  EXPECT_DOUBLE_EQ(job_json.progress().samples_per_second(), 18750.7);
  EXPECT_EQ(job_json.progress().eval_metrics().at("accuracy"), 0.875);
  RunResult got = Gradhub({"get", job});
  ASSERT_EQ(got.exit_code, 0) << got.err;
  EXPECT_THAT(got.out, HasSubstr("40/40 steps, epoch 1, loss 0.1, 18751 samples/s, lr 0.000025\n"));
  EXPECT_TRUE(std::regex_search(got.out, std::regex("\neval: +accuracy=0.875, loss=0.25\n")))
      << got.out;
  // watch on a pipe: the ended job's line, exit 0 for SUCCEEDED.
  RunResult watched = Gradhub({"watch", job});
  EXPECT_EQ(watched.exit_code, 0) << watched.err;
  EXPECT_THAT(watched.out, HasSubstr("SUCCEEDED 40/40 loss=0.1 samples/s=18751"));
  EXPECT_THAT(got.out + watched.out, Not(HasSubstr("e+"))) << "no scientific notation";

  EXPECT_EQ(As(kAdminToken, {"nodes", "cordon", label}).exit_code, 0);
}

}  // namespace
}  // namespace gradhub
