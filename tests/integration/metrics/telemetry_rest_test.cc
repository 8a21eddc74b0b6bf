// POST /v1/telemetry (script ranks' telemetry, telemetry_intake.h) against gradhub-metrics as a
// real process on a real PostgreSQL: a job token's batch shows at /metrics as a trainer's does;
// it reports only for its own job, attempt and rank, over REST and gRPC alike, and only while
// its attempt lasts (an open gRPC stream included); node tokens report for none, the admin
// token for any rank; errors come in the REST servers' shape, naming what is wrong; with TLS
// the HTTP port serves HTTPS only; and the gradhub Python module, run as a rank runs it, gets
// its reports there.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <thread>

#include "gradhub/v1/telemetry.grpc.pb.h"
#include "tests/integration/metrics/metrics_test_util.h"
#include "tests/support/raw_http_client.h"

namespace gradhub::metrics {
namespace {

using ::testing::HasSubstr;

// A batch of `steps` (a loss of 1/step each) in the proto3 JSON mapping, as the module sends it.
std::string BatchJson(const std::string& job, int attempt, int rank, int first, int last) {
  std::string steps;
  for (int step = first; step <= last; ++step) {
    steps += (steps.empty() ? "" : ",") + std::string("{\"step\":\"") + std::to_string(step) +
             "\",\"loss\":" + std::to_string(1.0 / step) +
             ",\"learningRate\":0.01,\"samplesPerSecond\":250,\"evalMetrics\":{\"accuracy\":0.5}}";
  }
  return "{\"job\":\"" + job + "\",\"attempt\":" + std::to_string(attempt) +
         ",\"rank\":" + std::to_string(rank) + ",\"steps\":[" + steps + "],\"droppedSteps\":\"0\"}";
}

// The same as a gRPC batch: one step.
v1::TelemetryBatch Batch(const std::string& job, int attempt, int rank, int64_t step) {
  v1::TelemetryBatch batch;
  batch.set_job(job);
  batch.set_attempt(attempt);
  batch.set_rank(rank);
  batch.add_steps()->set_step(step);
  return batch;
}

std::string RankSeries(const std::string& name, const std::string& job, int rank) {
  return name + "{job_id=\"" + job.substr(5) + "\",rank=\"" + std::to_string(rank) + "\"}";
}

std::string JobSeries(const std::string& name, const std::string& job,
                      const std::string& more_labels = "") {
  return name + "{job_id=\"" + job.substr(5) + "\"" + more_labels + "}";
}

// Each sample of `expected` (series name, value) of rank `rank` of `job` in `exposition`.
void ExpectRank(const std::string& exposition, const std::string& job, int rank,
                const std::map<std::string, double>& expected) {
  for (const auto& [name, value] : expected) {
    EXPECT_EQ(SampleOf(exposition, RankSeries(name, job, rank)), value) << name;
  }
}

struct Answer {
  int status = 0;  // 0: nothing answered
  std::string body;
};

class TelemetryRestTest : public MetricsDatabaseTest {
 protected:
  void SetUp() override {
    MetricsDatabaseTest::SetUp();
    metrics_ = std::make_unique<MetricsProcess>(url_);
    ASSERT_TRUE(metrics_->Start());
    job_ = InsertJob(2);
    other_job_ = InsertJob(2);
    job_token_ = JobToken(job_, 1, 1);
  }

  Answer Post(const std::string& token, const std::string& body) {
    httplib::Client client("127.0.0.1", metrics_->http_port());
    httplib::Headers headers;
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
    auto response = client.Post("/v1/telemetry", headers, body, "application/json");
    if (!response) return {};
    return {response->status, response->body};
  }

  // A ReportTelemetry stream as `token`, open until Finish.
  struct OpenStream {
    OpenStream(const std::string& address, const std::string& token)
        : stub(v1::TelemetryService::NewStub(
              grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {
      context.AddMetadata("authorization", "Bearer " + token);
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      writer = stub->ReportTelemetry(&context, &response);
    }
    grpc::Status Finish() {
      writer->WritesDone();
      return writer->Finish();
    }
    std::unique_ptr<v1::TelemetryService::Stub> stub;
    grpc::ClientContext context;
    v1::ReportTelemetryResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::TelemetryBatch>> writer;
  };

  grpc::Status Stream(const std::string& token, const v1::TelemetryBatch& batch) {
    OpenStream stream(metrics_->address(), token);
    stream.writer->Write(batch);
    return stream.Finish();
  }

  std::unique_ptr<MetricsProcess> metrics_;
  std::string job_, other_job_, job_token_;
};

TEST_F(TelemetryRestTest, AJobTokensBatchShowsAtMetrics) {
  const Answer answer = Post(job_token_, BatchJson(job_, 1, 1, 1, 4));
  ASSERT_EQ(answer.status, 200) << answer.body;
  EXPECT_EQ(answer.body, "{\"acceptedSteps\":\"4\"}\n");
  const std::string text = metrics_->Scrape();
  ExpectRank(text, job_, 1,
             {{"gradhub_training_loss", 0.25},
              {"gradhub_training_step", 4},
              {"gradhub_samples_per_second", 250}});
  EXPECT_EQ(SampleOf(text, JobSeries("gradhub_eval_metric", job_, ",name=\"accuracy\"")), 0.5);
  // The same steps again are duplicates: answered, not accepted.
  EXPECT_EQ(Post(job_token_, BatchJson(job_, 1, 1, 3, 4)).body, "{}\n");
  EXPECT_EQ(
      SampleOf(metrics_->Scrape(), "gradhub_telemetry_dropped_total{reason=\"duplicate_step\"}"),
      2);
}

// The gradhub module as a script rank runs it (/usr/bin/python3, the rank's environment):
// report()'s steps reach the scrape, NaN loss, eval metrics and the carried learning rate
// included, and its last steps go at exit.
TEST_F(TelemetryRestTest, TheModulesReportsShowAtMetrics) {
  const testing::RunResult run = testing::Run(
      {"/usr/bin/python3", "-c",
       "import gradhub\n"
       "gradhub.report(1, 0.5, learning_rate=0.02, samples_per_second=120.0)\n"
       "gradhub.report(2, float('nan'), metrics={'top1': 0.25})\n"
       "gradhub.report(3, 0.125)\n"},
      {{"PYTHONPATH", std::string(std::getenv("GRADHUB_BUILD_DIR")) + "/python"},
       {"GRADHUB_METRICS_URL", "http://127.0.0.1:" + std::to_string(metrics_->http_port())},
       {"GRADHUB_JOB_TOKEN", job_token_},
       {"GRADHUB_JOB_ID", job_.substr(5)},
       {"GRADHUB_ATTEMPT", "1"},
       {"GRADHUB_RANK", "1"}});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.err, "");
  const std::string text = metrics_->Scrape();
  ExpectRank(text, job_, 1,
             {{"gradhub_training_step", 3},
              {"gradhub_training_loss", 0.125},
              {"gradhub_samples_per_second", 120}});
  EXPECT_EQ(SampleOf(text, JobSeries("gradhub_learning_rate", job_)), 0.02);
  EXPECT_EQ(SampleOf(text, JobSeries("gradhub_eval_metric", job_, ",name=\"top1\"")), 0.25);
  EXPECT_EQ(SampleOf(text, "gradhub_telemetry_steps_total"), 3);
}

TEST_F(TelemetryRestTest, AJobTokenReportsForItsOwnJobAttemptAndRankOnly) {
  for (const auto& [body, field] : {std::pair{BatchJson(other_job_, 1, 1, 1, 1), "job:"},
                                    std::pair{BatchJson(job_, 1, 0, 1, 1), "rank:"},
                                    std::pair{BatchJson(job_, 2, 1, 1, 1), "attempt:"}}) {
    const Answer answer = Post(job_token_, body);
    EXPECT_EQ(answer.status, 403) << body;
    EXPECT_THAT(answer.body, HasSubstr("\"status\":\"PERMISSION_DENIED\""));
    EXPECT_THAT(answer.body, HasSubstr(std::string("\"message\":\"") + field));
  }
  // Over gRPC the same rule ends the stream.
  v1::TelemetryBatch other_rank;
  other_rank.set_job(job_);
  other_rank.set_attempt(1);
  other_rank.set_rank(0);
  other_rank.add_steps()->set_step(1);
  const grpc::Status refused = Stream(job_token_, other_rank);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("rank:"));
  other_rank.set_rank(1);
  EXPECT_TRUE(Stream(job_token_, other_rank).ok());
  // Nothing refused was recorded.
  const std::string text = metrics_->Scrape();
  EXPECT_TRUE(std::isnan(SampleOf(text, RankSeries("gradhub_training_step", job_, 0))));
  EXPECT_TRUE(std::isnan(SampleOf(text, RankSeries("gradhub_training_step", other_job_, 1))));
  EXPECT_EQ(SampleOf(text, RankSeries("gradhub_training_step", job_, 1)), 1);
}

// Every rank reports with its own job token: a node token reports for none, over REST or gRPC.
// The admin token reports for any rank (an operator, a trainer started by hand).
TEST_F(TelemetryRestTest, ANodeTokenReportsForNoRankTheAdminTokenForAny) {
  const Answer refused = Post(node_token_, BatchJson(job_, 1, 0, 1, 2));
  EXPECT_EQ(refused.status, 403);
  EXPECT_THAT(refused.body, HasSubstr("job token"));
  EXPECT_EQ(Stream(node_token_, Batch(job_, 1, 0, 1)).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_EQ(Post(kAdminToken, BatchJson(job_, 1, 0, 1, 2)).status, 200);
  ASSERT_EQ(Post(kAdminToken, BatchJson(other_job_, 1, 1, 1, 3)).status, 200);
  const std::string text = metrics_->Scrape();
  EXPECT_EQ(SampleOf(text, RankSeries("gradhub_training_step", job_, 0)), 2);
  EXPECT_EQ(SampleOf(text, RankSeries("gradhub_training_step", other_job_, 1)), 3);
}

// Over gRPC, as a trainer reports: its job token streams its own rank's batches; another job's
// or another attempt's end the stream PERMISSION_DENIED; once its attempt ended the token is
// refused at the stream's start (UNAUTHENTICATED).
TEST_F(TelemetryRestTest, OverGrpcAJobTokenStreamsItsOwnRankOnlyWhileItsAttemptLasts) {
  EXPECT_TRUE(Stream(job_token_, Batch(job_, 1, 1, 1)).ok());
  const grpc::Status other_job = Stream(job_token_, Batch(other_job_, 1, 1, 2));
  EXPECT_EQ(other_job.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(other_job.error_message(), HasSubstr("job:"));
  const grpc::Status other_attempt = Stream(job_token_, Batch(job_, 2, 1, 2));
  EXPECT_EQ(other_attempt.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(other_attempt.error_message(), HasSubstr("attempt:"));
  SetJob(job_, "RUNNING", 2);
  EXPECT_EQ(Stream(job_token_, Batch(job_, 1, 1, 3)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(Stream(JobToken(job_, 2, 1), Batch(job_, 2, 1, 1)).ok());
  SetJob(job_, "SUCCEEDED", 2);
  EXPECT_EQ(Stream(JobToken(job_, 2, 1), Batch(job_, 2, 1, 2)).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

// A stream opened while the attempt was current does not outlive it by more than
// kSenderRecheck (5 s): the token is checked again, and the stream ends UNAUTHENTICATED.
TEST_F(TelemetryRestTest, AJobTokensOpenStreamEndsWithinTheRecheckTimeOnceItsAttemptEnded) {
  OpenStream stream(metrics_->address(), job_token_);
  ASSERT_TRUE(stream.writer->Write(Batch(job_, 1, 1, 1)));
  SetJob(job_, "RUNNING", 2);
  const auto start = std::chrono::steady_clock::now();
  int64_t step = 2;
  while (stream.writer->Write(Batch(job_, 1, 1, step++)) &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  const grpc::Status ended = stream.Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAUTHENTICATED) << ended.error_message();
  // 5 s and the stream's end reaching this client, with room for a loaded machine; without
  // the recheck it would last the loop's 20 s.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(12));
}

TEST_F(TelemetryRestTest, AnEndedAttemptsTokenAndOtherTokensAreRefused) {
  EXPECT_EQ(Post("", BatchJson(job_, 1, 1, 1, 1)).status, 401);
  api::Authenticator auth(pool_.get(), "");
  ASSERT_TRUE(auth.CreateTenant("other", "").ok());
  auto tenant_token = auth.CreateTenantToken("other", "");
  ASSERT_TRUE(tenant_token.ok());
  EXPECT_EQ(Post(tenant_token->secret, BatchJson(job_, 1, 1, 1, 1)).status, 403);
  // The job went on to attempt 2: attempt 1's token is no token any more.
  SetJob(job_, "RUNNING", 2);
  const Answer ended = Post(job_token_, BatchJson(job_, 1, 1, 1, 1));
  EXPECT_EQ(ended.status, 401);
  EXPECT_THAT(ended.body, HasSubstr("UNAUTHENTICATED"));
}

TEST_F(TelemetryRestTest, MalformedBodiesAre400NamingTheProblem) {
  Answer answer = Post(job_token_, "{\"job\": ");
  EXPECT_EQ(answer.status, 400);
  EXPECT_THAT(answer.body, HasSubstr("\"status\":\"INVALID_ARGUMENT\""));
  EXPECT_THAT(answer.body, HasSubstr("request body: not a TelemetryBatch in JSON"));
  answer = Post(job_token_, "{\"job\":\"" + job_ + "\",\"attempt\":1,\"rank\":1,\"lossy\":1}");
  EXPECT_EQ(answer.status, 400);
  EXPECT_THAT(answer.body, HasSubstr("lossy"));
  answer = Post(kAdminToken, BatchJson("jobs/nope", 1, 1, 1, 1));
  EXPECT_EQ(answer.status, 400);
  EXPECT_THAT(answer.body, HasSubstr("job: 'jobs/nope' is not jobs/<job id>"));
  answer = Post(kAdminToken, BatchJson(job_, 0, 1, 1, 1));
  EXPECT_EQ(answer.status, 400);
  EXPECT_THAT(answer.body, HasSubstr("attempt: must be at least 1"));
  // Over the 1 MiB limit: 413 in the same shape, unread. The server answers and closes while
  // the body still comes, so a client that only reads once it has sent all of it may find
  // the connection reset first (httplib's did, and died of SIGPIPE): this one reads as it sends.
  testing::RawHttpClient client(metrics_->http_port());
  ASSERT_TRUE(
      client.Send("POST /v1/telemetry HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  "Authorization: Bearer " +
                  job_token_ + "\r\nContent-Type: application/json\r\nContent-Length: " +
                  std::to_string(2 << 20) + "\r\n\r\n"));
  client.SendBodyUntilAnswered(2 << 20, /*chunked=*/false, absl::Seconds(10));
  const std::string oversized =
      client.ReadRestOfResponse(client.ReadHead(absl::Seconds(10)), absl::Seconds(10));
  EXPECT_THAT(oversized, ::testing::StartsWith("HTTP/1.1 413")) << oversized;
  EXPECT_THAT(oversized, HasSubstr("\"code\":413"));
}

// A pipeline stage's fields in the proto3 JSON mapping become its stage's series; a negative
// stage is refused by name.
TEST_F(TelemetryRestTest, APipelineStagesStepsShowWithTheirStage) {
  const std::string step =
      "{\"step\":\"1\",\"loss\":0.5,\"pipelineStage\":1,\"p2pBytes\":\"65536\","
      "\"p2pWaitSeconds\":0.25,\"bubbleFraction\":0.2,\"peakActivationBytes\":\"1048576\"}";
  const std::string body =
      "{\"job\":\"" + job_ + "\",\"attempt\":1,\"rank\":1,\"steps\":[" + step + "]}";
  const Answer answer = Post(job_token_, body);
  ASSERT_EQ(answer.status, 200) << answer.body;
  const std::string text = metrics_->Scrape();
  const std::string labels = ",rank=\"1\",stage=\"1\"";
  EXPECT_EQ(SampleOf(text, JobSeries("gradhub_pipeline_p2p_bytes_total", job_, labels)), 65536);
  EXPECT_EQ(SampleOf(text, JobSeries("gradhub_pipeline_p2p_wait_seconds_total", job_, labels)),
            0.25);
  EXPECT_EQ(SampleOf(text, JobSeries("gradhub_pipeline_bubble_fraction", job_, labels)), 0.2);
  EXPECT_EQ(SampleOf(text, JobSeries("gradhub_pipeline_peak_activation_bytes", job_, labels)),
            1048576);
  std::string negative = body;
  negative.replace(negative.find("\"pipelineStage\":1"), 17, "\"pipelineStage\":-1");
  const Answer refused = Post(job_token_, negative);
  EXPECT_EQ(refused.status, 400);
  EXPECT_THAT(refused.body, HasSubstr("steps[0].pipeline_stage: must not be negative"));
}

// With a certificate the HTTP port serves HTTPS only (tokens cross it), /metrics included.
TEST_F(TelemetryRestTest, WithACertificateTheHttpPortServesHttpsOnly) {
  testing::TempDir dir;
  const std::string cert = dir.path() + "/cert.pem", key = dir.path() + "/key.pem";
  const testing::RunResult made = testing::Run(
      {"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
       "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  MetricsProcess metrics(url_, {"--tls-cert", cert, "--tls-key", key});
  ASSERT_TRUE(metrics.Start());
  EXPECT_EQ(metrics.Get("/healthz").first, 0);  // plain HTTP gets no answer
  httplib::SSLClient client("127.0.0.1", metrics.http_port());
  client.set_ca_cert_path(cert.c_str());
  auto healthz = client.Get("/healthz");
  ASSERT_TRUE(healthz);
  EXPECT_EQ(healthz->status, 200);
  auto post = client.Post("/v1/telemetry", "{}", "application/json");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 401);
}

}  // namespace
}  // namespace gradhub::metrics
