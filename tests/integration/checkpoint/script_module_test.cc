// Script ranks' side of the checkpoint store: the REST upload (PUT) over real HTTP on loopback
// with real PostgreSQL, and the `gradhub` Python module (the build's copy, run by Debian's
// /usr/bin/python3 as ranks run it) with a real job token: saves, loads bit for bit, refusals
// once the attempt or the job ended, other jobs NOT_FOUND; and report()'s lines as the trainer's
// parser reads them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "services/checkpoint/checkpoint_rest.h"
#include "services/common/contract/progress_record.h"
#include "services/common/crc32c.h"
#include "tests/integration/checkpoint/checkpoint_test_util.h"
#include "tests/support/subprocess.h"

namespace gradhub::checkpoint::testing {
namespace {

using ::gradhub::testing::RunResult;
using ::gradhub::testing::TempDir;
using ::testing::HasSubstr;

class ScriptModuleTest : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    Serve();
    job_ = InsertJob(*pool_, tenant_a_, "RUNNING", 1);
    token_ = auth_->CreateJobToken(job_, 1, 0)->secret;
  }
  void TearDown() override {
    StopServing();
    CheckpointTest::TearDown();
  }

  // The manager's REST face with `options` on a free loopback port (instead of the one before),
  // and client_ and url_ for it.
  void Serve(CheckpointRestOptions options = {}) {
    StopServing();
    rest_ = std::make_unique<CheckpointRest>(manager_.get(), auth_.get(), metrics_.get(), options);
    const absl::StatusOr<int> port = rest_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    url_ = (options.tls_cert_file.empty() ? "http://127.0.0.1:" : "https://127.0.0.1:") +
           std::to_string(*port);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", *port);
  }
  void StopServing() {
    client_.reset();  // first: a server waits for a kept-alive connection to close
    rest_.reset();
  }

  // `code` run by /usr/bin/python3 with the module and a rank's environment for `job`.
  // `code` run by /usr/bin/python3 with the module and a rank's environment for `job`, and
  // `env` besides.
  RunResult Python(const std::string& code, std::vector<std::string> args = {},
                   const std::string& job = "", const std::string& token = "",
                   std::map<std::string, std::string> env = {}) {
    std::vector<std::string> argv = {"/usr/bin/python3", "-c", code};
    argv.insert(argv.end(), args.begin(), args.end());
    env.insert({{"PYTHONPATH", std::string(std::getenv("GRADHUB_BUILD_DIR")) + "/python"},
                {"GRADHUB_CHECKPOINT_URL", url_},
                {"GRADHUB_JOB_TOKEN", token.empty() ? token_ : token},
                {"GRADHUB_JOB_ID", "jobs/" + (job.empty() ? job_ : job)},
                {"GRADHUB_ATTEMPT", "1"}});
    return gradhub::testing::Run(argv, env);
  }

  // A PUT of `body` for step `step` as the job token, with these extra headers.
  httplib::Result Put(int64_t step, const std::string& body, httplib::Headers headers,
                      const std::string& query = "?attempt=1") {
    headers.emplace("Authorization", "Bearer " + token_);
    return client_->Put(
        ("/v1/jobs/" + job_ + "/checkpoints/" + std::to_string(step) + query).c_str(), headers,
        body, "application/octet-stream");
  }
  static httplib::Headers Sha(const std::string& sha256) {
    return {{"X-Checkpoint-Sha256", sha256}};
  }
  httplib::Headers AsRank() const { return {{"Authorization", "Bearer " + token_}}; }

  std::unique_ptr<CheckpointRest> rest_;
  std::unique_ptr<httplib::Client> client_;
  std::string url_, job_, token_;
};

// What the Python script below saves at step 10: bytes(range(256)) * 4096.
std::string Pattern() {
  std::string bytes;
  for (int i = 0; i < 4096 * 256; ++i) bytes += static_cast<char>(i % 256);
  return bytes;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream all;
  all << in.rdbuf();
  return all.str();
}

TEST_F(ScriptModuleTest, TheModuleSavesTwiceAndLoadsTheLatestBitForBit) {
  TempDir dir;
  const std::string data = Blob((5 << 20) + 123, 7);
  std::ofstream(dir.path() + "/state.bin", std::ios::binary) << data;
  const RunResult run = Python(R"(
import gradhub, hashlib, sys
print(gradhub.save_checkpoint(10, bytes(range(256)) * 4096))
print(gradhub.save_checkpoint(20, sys.argv[1]))
step, data = gradhub.load_latest_checkpoint()
print(step, hashlib.sha256(data).hexdigest())
print(*gradhub.load_latest_checkpoint(sys.argv[2]))
)",
                               {dir.path() + "/state.bin", dir.path() + "/restored.bin"});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out,
            absl::StrCat("10\n20\n20 ", Sha256Hex(data), "\n20 ", dir.path(), "/restored.bin\n"));
  EXPECT_TRUE(ReadFile(dir.path() + "/restored.bin") == data);
  auto latest = manager_->GetLatest(Admin(), JobName(job_));
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->sha256(), Sha256Hex(data));
  EXPECT_EQ(latest->attempt(), 1);
  EXPECT_EQ(latest->metadata().at("writer"), "gradhub-python");
  auto first = ReadAll(Admin(), CheckpointName(job_, 10));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(*first == Pattern());
  // Saving the same bytes at a saved step again (a retry) is a success; other bytes are not.
  const RunResult again = Python(R"(
import gradhub
print(gradhub.save_checkpoint(10, bytes(range(256)) * 4096))
gradhub.save_checkpoint(10, b"other bytes")
)");
  EXPECT_EQ(again.out, "10\n");
  EXPECT_NE(again.exit_code, 0);
  EXPECT_THAT(again.err, HasSubstr("already has a committed checkpoint with other bytes"));
}

TEST_F(ScriptModuleTest, AJobWithoutCheckpointsLoadsNone) {
  const RunResult run = Python("import gradhub; print(gradhub.load_latest_checkpoint())");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, "None\n");
}

TEST_F(ScriptModuleTest, TheTokenOfAnOlderAttemptOrAnEndedJobIsRefused) {
  Save(job_, 1, 10, Blob(100));
  Restart(*pool_, job_);  // attempt 2: the rank's token was for attempt 1
  for (const char* call :
       {"gradhub.save_checkpoint(20, b'late')", "gradhub.load_latest_checkpoint()"}) {
    const RunResult run = Python(std::string("import gradhub\n") + call);
    EXPECT_NE(run.exit_code, 0) << call;
    EXPECT_THAT(run.err, HasSubstr("HTTP 401 UNAUTHENTICATED")) << call;
  }
  const std::string ended = InsertJob(*pool_, tenant_a_, "RUNNING", 1);
  const std::string token = auth_->CreateJobToken(ended, 1, 0)->secret;
  ASSERT_TRUE(pool_->Exec("UPDATE jobs SET state = 'FAILED' WHERE id = $1::uuid", {ended}).ok());
  const RunResult run =
      Python("import gradhub; gradhub.load_latest_checkpoint()", {}, ended, token);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("HTTP 401 UNAUTHENTICATED"));
}

TEST_F(ScriptModuleTest, AnotherJobsCheckpointsAreNotFoundAndNothingIsDeleted) {
  const std::string other = InsertJob(*pool_, tenant_a_, "RUNNING", 1);
  const v1::Checkpoint theirs = Save(other, 1, 10, Blob(100));
  const RunResult run = Python("import gradhub; gradhub.save_checkpoint(30, b'x')", {}, other);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("HTTP 404 NOT_FOUND"));
  EXPECT_EQ(client_->Get(("/v1/jobs/" + other + "/checkpoints:latest").c_str(), AsRank())->status,
            404);
  EXPECT_EQ(client_->Get(("/v1/" + theirs.name() + ":download").c_str(), AsRank())->status, 404);
  EXPECT_EQ(client_->Delete(("/v1/" + theirs.name()).c_str(), AsRank())->status, 403);
  const v1::Checkpoint ours = Save(job_, 1, 10, Blob(100));
  auto refused = client_->Delete(("/v1/" + ours.name()).c_str(), AsRank());
  EXPECT_EQ(refused->status, 403);
  EXPECT_THAT(refused->body, HasSubstr("PERMISSION_DENIED"));
  EXPECT_EQ(client_->Get(("/v1/jobs/" + job_ + "/checkpoints").c_str(), AsRank())->status, 403);
  EXPECT_EQ(ListAll(Admin(), job_).size(), 1u);
  EXPECT_EQ(ListAll(Admin(), other).size(), 1u);
}

TEST_F(ScriptModuleTest, APutCommitsAndASecondPutOfTheStepIs409WithTheCommittedSha256) {
  const std::string data = Blob(3 << 20, 5);
  httplib::Headers headers = Sha(Sha256Hex(data));
  headers.emplace("X-Checkpoint-Metadata", "format=raw,epoch=3");
  auto put = Put(40, data, headers);
  ASSERT_EQ(put->status, 200) << put->body;
  EXPECT_THAT(put->body, HasSubstr("\"step\":\"40\""));
  EXPECT_THAT(put->body, HasSubstr(Sha256Hex(data)));
  auto committed = manager_->GetLatest(Admin(), JobName(job_));
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(committed->metadata().at("epoch"), "3");
  EXPECT_TRUE(*ReadAll(Admin(), committed->name()) == data);

  auto again = Put(40, Blob(10), Sha(Sha256Hex(Blob(10))));
  EXPECT_EQ(again->status, 409);
  EXPECT_THAT(again->body, HasSubstr("ALREADY_EXISTS"));
  EXPECT_EQ(again->get_header_value("X-Checkpoint-Sha256"), Sha256Hex(data));
}

TEST_F(ScriptModuleTest, AWrongSha256IsDataLossAndNothingIsKept) {
  const std::string data = Blob(100000, 2);
  auto put = Put(50, data, Sha(Sha256Hex("other bytes")));
  EXPECT_EQ(put->status, 500);
  EXPECT_THAT(put->body, HasSubstr("DATA_LOSS"));
  EXPECT_EQ(Count("SELECT count(*) AS n FROM checkpoints WHERE job_id = $1::uuid", {job_}), 0);
  EXPECT_EQ(Put(50, data, Sha(Sha256Hex(data)))->status, 200);
}

// The CRC-32C instead of the sha256 (what the module sends where the engine is loaded): checked
// against the store's CRC of what arrived, the sha256 content key computed by the store, and
// both digests in the 409 of a step already committed.
TEST_F(ScriptModuleTest, AnUploadCheckedByItsCrc32cAloneRecordsTheStoresSha256) {
  const std::string data = Blob(300000, 4);
  const auto crc = [](const std::string& bytes) {
    return httplib::Headers{{"X-Checkpoint-Crc32c", absl::StrFormat("%08x", Crc32c(bytes))}};
  };
  auto wrong = Put(70, data, crc("other bytes"));
  EXPECT_EQ(wrong->status, 500);
  EXPECT_THAT(wrong->body, HasSubstr("DATA_LOSS"));
  EXPECT_EQ(Count("SELECT count(*) AS n FROM checkpoints WHERE job_id = $1::uuid", {job_}), 0);
  EXPECT_EQ(Put(70, data, {{"X-Checkpoint-Crc32c", "E3069283"}})->status, 400);  // not lowercase
  EXPECT_THAT(Put(70, data, {{"X-Checkpoint-Crc32c", "e306928"}})->body,
              HasSubstr("X-Checkpoint-Crc32c"));

  auto put = Put(70, data, crc(data));
  ASSERT_EQ(put->status, 200) << put->body;
  EXPECT_THAT(put->body, HasSubstr(Sha256Hex(data)));
  auto committed = manager_->GetLatest(Admin(), JobName(job_));
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_EQ(committed->sha256(), Sha256Hex(data));
  EXPECT_EQ(committed->crc32c(), Crc32c(data));
  EXPECT_TRUE(*ReadAll(Admin(), committed->name()) == data);

  auto again = Put(70, data, crc(data));
  EXPECT_EQ(again->status, 409);
  EXPECT_EQ(again->get_header_value("X-Checkpoint-Crc32c"), crc(data).begin()->second);
  EXPECT_EQ(again->get_header_value("X-Checkpoint-Sha256"), Sha256Hex(data));
  // Both headers: each is checked.
  httplib::Headers both = crc(Blob(10));
  both.emplace("X-Checkpoint-Sha256", Sha256Hex(Blob(10)));
  EXPECT_EQ(Put(71, Blob(10), both)->status, 200);
  both = crc("other bytes");
  both.emplace("X-Checkpoint-Sha256", Sha256Hex(Blob(10)));
  EXPECT_EQ(Put(72, Blob(10), both)->status, 500);
}

// A rank whose script imported torch checks its checkpoints with the engine's CRC-32C, one that
// did not with SHA-256; both load bit for bit what either saved.
TEST_F(ScriptModuleTest, WithTorchImportedTheModuleChecksByCrc32cAndLoadsWhatSha256Saved) {
  if (!std::filesystem::exists(std::string(std::getenv("GRADHUB_BUILD_DIR")) +
                               "/python/gradhub/_build_info.py")) {
    GTEST_SKIP() << "gradhub._C is not built here (see gpu_worker/python/bindings)";
  }
  const RunResult saved = Python(R"(
import gradhub, gradhub._checksums as checks
print(checks.new().header)
gradhub.save_checkpoint(10, bytes(range(256)) * 4096)
)");
  ASSERT_EQ(saved.exit_code, 0) << saved.err;
  EXPECT_EQ(saved.out, "X-Checkpoint-Sha256\n");
  const RunResult crc = Python(R"(
import torch, gradhub, gradhub._checksums as checks, gradhub._engine
engine = gradhub._engine.load()
print(checks.new().header, hex(engine.crc32c(b"123456789")),
      hex(engine.crc32c(memoryview(b"56789"), engine.crc32c(bytearray(b"1234")))))
step, data = gradhub.load_latest_checkpoint()
print(step, data == bytes(range(256)) * 4096)
gradhub.save_checkpoint(20, data[::-1])
step, again = gradhub.load_latest_checkpoint()
print(step, again == data[::-1])
)");
  ASSERT_EQ(crc.exit_code, 0) << crc.err;
  EXPECT_EQ(crc.out, "X-Checkpoint-Crc32c 0xe3069283 0xe3069283\n10 True\n20 True\n");
  auto committed = manager_->GetLatest(Admin(), JobName(job_));
  ASSERT_TRUE(committed.ok()) << committed.status();
  std::string reversed = Pattern();
  std::reverse(reversed.begin(), reversed.end());
  EXPECT_EQ(committed->sha256(), Sha256Hex(reversed));
  EXPECT_EQ(committed->crc32c(), Crc32c(reversed));
}

TEST_F(ScriptModuleTest, BadHeadersAndTheWrongCallerAreRefusedNamingWhatIsWrong) {
  const std::string data = Blob(1000);
  const std::string sha = Sha256Hex(data);
  auto no_sha = Put(60, data, {});
  EXPECT_EQ(no_sha->status, 400);
  EXPECT_THAT(no_sha->body, HasSubstr("X-Checkpoint-Sha256 or X-Checkpoint-Crc32c"));
  EXPECT_EQ(Put(60, data, Sha("ABC"))->status, 400);
  EXPECT_THAT(Put(60, data, Sha(sha), "")->body, HasSubstr("attempt"));
  httplib::Headers metadata = Sha(sha);
  metadata.emplace("X-Checkpoint-Metadata", "no-equals-sign");
  EXPECT_THAT(Put(60, data, metadata)->body, HasSubstr("X-Checkpoint-Metadata"));
  EXPECT_EQ(Put(60, data, Sha(sha), "?attempt=2")->status, 403);  // not the token's attempt
  auto as_tenant =
      client_->Put(("/v1/jobs/" + job_ + "/checkpoints/60?attempt=1").c_str(),
                   {{"Authorization", "Bearer " + token_a_}, {"X-Checkpoint-Sha256", sha}}, data,
                   "application/octet-stream");
  EXPECT_EQ(as_tenant->status, 403);
  // No Content-Length: a chunked body.
  httplib::Headers chunked = Sha(sha);
  chunked.emplace("Authorization", "Bearer " + token_);
  auto unsized = client_->Put(("/v1/jobs/" + job_ + "/checkpoints/60?attempt=1").c_str(), chunked,
                              [&](size_t, httplib::DataSink& sink) {
                                sink.write(data.data(), data.size());
                                sink.done();
                                return true;
                              },
                              "application/octet-stream");
  EXPECT_EQ(unsized->status, 411);
  EXPECT_THAT(unsized->body, HasSubstr("Content-Length"));
  EXPECT_EQ(Count("SELECT count(*) AS n FROM checkpoints WHERE job_id = $1::uuid", {job_}), 0);
}

TEST_F(ScriptModuleTest, ARefusedBodyIsStillReadSoTheConnectionGoesOn) {
  client_->set_keep_alive(true);
  auto refused = Put(70, Blob(2 << 20), {});  // no sha256: refused before the body
  EXPECT_EQ(refused->status, 400);
  auto next = client_->Get(("/v1/jobs/" + job_ + "/checkpoints:latest").c_str(), AsRank());
  ASSERT_TRUE(next);
  EXPECT_EQ(next->status, 404);
  EXPECT_THAT(next->body, HasSubstr("no committed checkpoint"));
  auto unrouted = client_->Put("/v1/no/such/route", AsRank(), Blob(100000), "text/plain");
  EXPECT_EQ(unrouted->status, 404);
  EXPECT_EQ(client_->Get("/healthz")->status, 200);
}

TEST_F(ScriptModuleTest, AnUploadOverTheLimitIs413) {
  CheckpointRestOptions options;
  options.max_upload_bytes = 1000;
  Serve(options);
  const std::string data = Blob(1001);
  auto over = Put(1, data, Sha(Sha256Hex(data)));
  EXPECT_EQ(over->status, 413);
  EXPECT_THAT(over->body, HasSubstr("1000 bytes"));
  EXPECT_EQ(Put(1, data.substr(1), Sha(Sha256Hex(data.substr(1))))->status, 200);
}

TEST_F(ScriptModuleTest, OverHttpsTheStoresCertificateIsCheckedAgainstGradhubTlsCa) {
  TempDir dir;
  const std::string cert = dir.path() + "/cert.pem", key = dir.path() + "/key.pem";
  const RunResult made = gradhub::testing::Run(
      {"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
       "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  CheckpointRestOptions options;
  options.tls_cert_file = cert;
  options.tls_key_file = key;
  Serve(options);
  const std::string code = R"(
import gradhub
gradhub.save_checkpoint(5, b"over tls")
print(gradhub.load_latest_checkpoint())
)";
  const RunResult verified = Python(code, {}, "", "", {{"GRADHUB_TLS_CA", cert}});
  ASSERT_EQ(verified.exit_code, 0) << verified.err;
  EXPECT_EQ(verified.out, "(5, b'over tls')\n");
  const RunResult unknown_ca = Python(code);  // the system's CAs do not know this one
  EXPECT_NE(unknown_ca.exit_code, 0);
  EXPECT_THAT(unknown_ca.err, HasSubstr("GRADHUB_TLS_CA"));
}

// ProgressRecord fields for the Python report() calls below.
std::vector<ProgressRecord> ExpectedRecords() {
  std::vector<ProgressRecord> records(5);
  records[0].step = 0;
  records[1].step = 7;
  records[1].total_steps = 100;
  records[1].epoch = 1;
  records[1].loss = 0.1;
  records[1].learning_rate = 3e-4;
  records[1].samples_per_second = 1234.5678912345;
  records[2].step = 8;
  records[2].loss = std::nan("");  // prints as null, which reads back as unset
  records[3].event = ProgressEvent::kEval;
  records[3].step = 8;
  records[3].eval_metrics = {{"accuracy", 0.875}, {"loss", 1.0 / 3}, {"x\"\n", 2.5e-12}};
  records[4].step = int64_t{1} << 62;
  records[4].loss = 123456789012.0;
  return records;
}

TEST_F(ScriptModuleTest, ReportPrintsTheTrainersRecordsByteForByte) {
  const RunResult run = Python(R"(
import gradhub
print("a line that is not a record")
gradhub.report(0)
gradhub.report(7, 0.1, epoch=1, learning_rate=3e-4, samples_per_second=1234.5678912345,
               total_steps=100)
gradhub.report(8, float("nan"), metrics={"loss": 1 / 3, "accuracy": 0.875, 'x"\n': 2.5e-12})
gradhub.report(2**62, 123456789012)
)");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::vector<std::string> lines = absl::StrSplit(run.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 6u) << run.out;
  EXPECT_FALSE(ParseProgressRecord(lines[0]).has_value());
  const std::vector<ProgressRecord> expected = ExpectedRecords();
  for (size_t i = 0; i < expected.size(); ++i) {
    const std::string& line = lines[i + 1];
    EXPECT_EQ(line, FormatProgressRecord(expected[i])) << i;
    const std::optional<ProgressRecord> parsed = ParseProgressRecord(line);
    ASSERT_TRUE(parsed.has_value()) << line;
    EXPECT_EQ(parsed->step, expected[i].step) << line;
    EXPECT_EQ(parsed->event, expected[i].event) << line;
    EXPECT_EQ(parsed->loss.has_value(),
              expected[i].loss.has_value() && std::isfinite(*expected[i].loss))
        << line;
    EXPECT_EQ(parsed->eval_metrics.size(), expected[i].eval_metrics.size()) << line;
  }
}

}  // namespace
}  // namespace gradhub::checkpoint::testing
