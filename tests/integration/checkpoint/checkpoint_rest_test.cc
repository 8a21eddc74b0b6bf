// CheckpointRest over real HTTP on loopback: raw downloads with their sha256 header and Range,
// list, latest, delete, tenant isolation, and the health and metrics endpoints.
#include "services/checkpoint/checkpoint_rest.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "absl/strings/str_format.h"
#include "tests/integration/checkpoint/checkpoint_test_util.h"

namespace gradhub::checkpoint::testing {
namespace {

using ::testing::HasSubstr;

class CheckpointRestTest : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    rest_ = std::make_unique<CheckpointRest>(manager_.get(), auth_.get(), metrics_.get());
    const absl::StatusOr<int> port = rest_->Start("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", *port);
    job_ = InsertJob(*pool_, tenant_a_);
    a_ = {{"Authorization", "Bearer " + token_a_}};
    b_ = {{"Authorization", "Bearer " + token_b_}};
  }
  void TearDown() override {
    rest_.reset();
    CheckpointTest::TearDown();
  }

  httplib::Headers With(httplib::Headers headers, const std::string& range) {
    headers.emplace("Range", range);
    return headers;
  }

  std::unique_ptr<CheckpointRest> rest_;
  std::unique_ptr<httplib::Client> client_;
  std::string job_;
  httplib::Headers a_, b_;
};

TEST_F(CheckpointRestTest, DownloadsRawBytesWithTheirSha256AndServesRanges) {
  const std::string data = Blob(300000, 9);
  const v1::Checkpoint saved = Save(job_, 1, 10, data);
  const std::string path = "/v1/" + saved.name() + ":download";
  auto whole = client_->Get(path.c_str(), a_);
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  EXPECT_EQ(whole->get_header_value("Content-Type"), "application/octet-stream");
  EXPECT_EQ(whole->get_header_value("X-Checkpoint-Sha256"), Sha256Hex(data));
  EXPECT_TRUE(whole->body == data);

  auto tail = client_->Get(path.c_str(), With(a_, "bytes=250000-"));
  ASSERT_EQ(tail->status, 206) << tail->body;
  EXPECT_EQ(tail->get_header_value("Content-Range"), "bytes 250000-299999/300000");
  EXPECT_TRUE(tail->body == data.substr(250000));

  auto beyond = client_->Get(path.c_str(), With(a_, "bytes=300000-"));
  EXPECT_EQ(beyond->status, 416);
  EXPECT_EQ(beyond->get_header_value("Content-Range"), "bytes */300000");
  EXPECT_THAT(beyond->body, HasSubstr("OUT_OF_RANGE"));
  auto closed = client_->Get(path.c_str(), With(a_, "bytes=0-99"));
  EXPECT_EQ(closed->status, 416);
  EXPECT_THAT(closed->body, HasSubstr("bytes=N-"));  // the error body, whole
}

TEST_F(CheckpointRestTest, ADownloadOffersTheCrc32cWhereItCoversTheSha256) {
  // Checked chunks: the store hashed the bytes it received, so its CRC covers the sha256.
  const v1::Checkpoint checked = Save(job_, 1, 10, Blob(300000, 9));
  auto first = client_->Get(("/v1/" + checked.name() + ":download").c_str(), a_);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->get_header_value("X-Checkpoint-Crc32c"),
            absl::StrFormat("%08x", Crc32c(Blob(300000, 9))));
  // Chunks without crc32c: the store digested them as it wrote them, so its CRC covers it.
  const std::string data = Blob(200000, 4);
  auto upload = Start(Admin(), job_, 1, 20, static_cast<int64_t>(data.size()));
  ASSERT_TRUE(upload.ok()) << upload.status();
  ASSERT_TRUE(Write(Admin(), *upload, data, 0, data.size(), 64 << 10, ChunkCrc::kLeftOut).ok());
  auto committed = Commit(Admin(), *upload, Sha256Hex(data));
  ASSERT_TRUE(committed.ok()) << committed.status();
  auto whole = client_->Get(("/v1/" + committed->name() + ":download").c_str(), a_);
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200) << whole->body;
  EXPECT_EQ(whole->get_header_value("X-Checkpoint-Crc32c"), absl::StrFormat("%08x", Crc32c(data)));
}

TEST_F(CheckpointRestTest, ADownloadPastTheCallersTransferLimitIs429) {
  const v1::Checkpoint saved = Save(job_, 1, 10, Blob(1000));
  std::vector<std::unique_ptr<CheckpointDownload>> held;  // the tenant's transfers in progress
  for (int i = 0; i < CheckpointManagerOptions().max_transfers_per_caller; ++i) {
    auto download = manager_->OpenDownload(As(token_a_), saved.name(), 0);
    ASSERT_TRUE(download.ok()) << download.status();
    held.push_back(*std::move(download));
  }
  const std::string path = "/v1/" + saved.name() + ":download";
  auto refused = client_->Get(path.c_str(), a_);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 429);
  EXPECT_THAT(refused->body, HasSubstr("--max-transfers-per-caller"));
  held.clear();
  auto served = client_->Get(path.c_str(), a_);
  ASSERT_TRUE(served);
  EXPECT_EQ(served->status, 200);
  EXPECT_TRUE(served->body == Blob(1000));
}
TEST_F(CheckpointRestTest, ACorruptBlobCutsTheDownloadShort) {
  const std::string data = Blob(4 << 20, 3);
  const v1::Checkpoint saved = Save(job_, 1, 10, data);
  FlipByte(BlobPathOf(saved), 100);
  auto response = client_->Get(("/v1/" + saved.name() + ":download").c_str(), a_);
  // Either no response at all or one shorter than announced: never the whole corrupt blob.
  EXPECT_TRUE(!response || response->body.size() < data.size());
  EXPECT_EQ(ListAll(Admin(), job_)[0].state(), v1::Checkpoint::BAD);
  auto again = client_->Get(("/v1/" + saved.name() + ":download").c_str(), a_);
  ASSERT_TRUE(again);
  EXPECT_EQ(again->status, 500);
  EXPECT_THAT(again->body, HasSubstr("DATA_LOSS"));
}

TEST_F(CheckpointRestTest, ListLatestAndDelete) {
  Save(job_, 1, 10, Blob(10));
  const v1::Checkpoint newest = Save(job_, 1, 20, Blob(20));
  auto list = client_->Get(
      ("/v1/jobs/" + job_ + "/checkpoints?pageSize=1&filter=state%3DCOMMITTED").c_str(), a_);
  ASSERT_EQ(list->status, 200) << list->body;
  EXPECT_THAT(list->body, HasSubstr(newest.name()));
  EXPECT_THAT(list->body, HasSubstr("nextPageToken"));
  auto latest = client_->Get(("/v1/jobs/" + job_ + "/checkpoints:latest").c_str(), a_);
  ASSERT_EQ(latest->status, 200) << latest->body;
  EXPECT_THAT(latest->body, HasSubstr("\"step\":\"20\""));
  auto bad_filter = client_->Get(("/v1/jobs/" + job_ + "/checkpoints?filter=size%3D1").c_str(), a_);
  EXPECT_EQ(bad_filter->status, 400);
  EXPECT_THAT(bad_filter->body, HasSubstr("INVALID_ARGUMENT"));

  auto deleted = client_->Delete(("/v1/" + newest.name()).c_str(), a_);
  ASSERT_EQ(deleted->status, 200) << deleted->body;
  EXPECT_EQ(client_->Delete(("/v1/" + newest.name()).c_str(), a_)->status, 404);
  latest = client_->Get(("/v1/jobs/" + job_ + "/checkpoints:latest").c_str(), a_);
  EXPECT_THAT(latest->body, HasSubstr("\"step\":\"10\""));
}

TEST_F(CheckpointRestTest, AnotherTenantGetsNotFoundEverywhere) {
  const v1::Checkpoint saved = Save(job_, 1, 10, Blob(10));
  for (const std::string& path :
       {"/v1/jobs/" + job_ + "/checkpoints", "/v1/jobs/" + job_ + "/checkpoints:latest",
        "/v1/" + saved.name() + ":download"}) {
    auto response = client_->Get(path.c_str(), b_);
    EXPECT_EQ(response->status, 404) << path;
    EXPECT_THAT(response->body, HasSubstr("\"status\":\"NOT_FOUND\"")) << path;
  }
  EXPECT_EQ(client_->Delete(("/v1/" + saved.name()).c_str(), b_)->status, 404);
  EXPECT_EQ(client_->Get(("/v1/" + saved.name() + ":download").c_str())->status, 401);
  EXPECT_EQ(client_->Get(("/v1/" + saved.name() + ":download").c_str(), a_)->status, 200);
}

TEST_F(CheckpointRestTest, ErrorsTheHttpLayerAnswersCarryTheirOwnCode) {
  const v1::Checkpoint saved = Save(job_, 1, 10, Blob(10));
  const std::string huge(100 * 1024, ' ');  // over the 64 KiB body limit
  auto oversized = client_->Delete(("/v1/" + saved.name()).c_str(), a_, huge, "application/json");
  ASSERT_EQ(oversized->status, 413);
  EXPECT_THAT(oversized->body, HasSubstr("\"code\":413"));
  EXPECT_THAT(oversized->body, HasSubstr("RESOURCE_EXHAUSTED"));
  auto unrouted = client_->Get("/v1/no/such/route", a_);
  ASSERT_EQ(unrouted->status, 404);
  EXPECT_THAT(unrouted->body, HasSubstr("\"code\":404"));
}

TEST_F(CheckpointRestTest, HealthReadinessAndMetrics) {
  EXPECT_EQ(client_->Get("/healthz")->status, 200);
  EXPECT_EQ(client_->Get("/readyz")->status, 200);
  const v1::Checkpoint saved = Save(job_, 1, 10, Blob(1000));
  ASSERT_TRUE(Start(Admin(), job_, 1, 20, 10).ok());
  ASSERT_EQ(client_->Get(("/v1/" + saved.name() + ":download").c_str(), a_)->status, 200);
  auto metrics = client_->Get("/metrics");
  ASSERT_EQ(metrics->status, 200);
  EXPECT_THAT(metrics->body, HasSubstr("gradhub_checkpoint_received_bytes_total 1000"));
  EXPECT_THAT(metrics->body,
              HasSubstr("gradhub_checkpoint_sent_bytes_total{transport=\"rest\"} 1000"));
  EXPECT_THAT(metrics->body, HasSubstr("gradhub_checkpoint_commit_duration_seconds_count 1"));
  EXPECT_THAT(metrics->body, HasSubstr("gradhub_checkpoint_uploads_in_progress 1"));
  ASSERT_TRUE(pool_->Exec("DELETE FROM schema_migrations WHERE version = 4").ok());
  EXPECT_EQ(client_->Get("/readyz")->status, 503);
}

}  // namespace
}  // namespace gradhub::checkpoint::testing
