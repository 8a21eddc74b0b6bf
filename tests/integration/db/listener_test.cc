// db::Listener and db::Notify against a real PostgreSQL: what arrives (committed only, whole
// payloads, the right channels), and what happens when its connection goes (a killed backend,
// a restarted server): on_reconnected, and notifications again afterwards.
#include "services/common/db/listener.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "tests/integration/db/db_test_util.h"

namespace gradhub::db {
namespace {

using Received = std::pair<std::string, std::string>;  // channel, payload

// What a listener delivered, for the test's thread to wait on.
class Inbox {
 public:
  void Add(const std::string& channel, const std::string& payload) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      received_.emplace_back(channel, payload);
    }
    changed_.notify_all();
  }
  void Reconnected() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++reconnects_;
    }
    changed_.notify_all();
  }
  // Waits (10 s at most) until `payload` arrived on any channel; returns everything so far.
  std::vector<Received> WaitForPayload(const std::string& payload) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait_for(lock, std::chrono::seconds(10), [&] {
      for (const Received& got : received_) {
        if (got.second == payload) return true;
      }
      return false;
    });
    return received_;
  }
  // Waits (30 s at most) for at least `count` reconnects; returns how many there were.
  int WaitForReconnects(int count) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait_for(lock, std::chrono::seconds(30), [&] { return reconnects_ >= count; });
    return reconnects_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<Received> received_;
  int reconnects_ = 0;
};

class ListenerTest : public DatabaseTest {
 protected:
  std::unique_ptr<Listener> StartListener(std::vector<std::string> channels) {
    ListenerOptions options;
    options.connection.url = url_;
    options.connection.application_name = "listener_test";
    options.channels = std::move(channels);
    options.on_notification = [this](const std::string& channel, const std::string& payload) {
      inbox_.Add(channel, payload);
    };
    options.on_reconnected = [this] { inbox_.Reconnected(); };
    auto listener = std::make_unique<Listener>(std::move(options));
    EXPECT_TRUE(listener->Start().ok());
    EXPECT_TRUE(listener->WaitUntilListening(absl::Now() + absl::Seconds(10)));
    return listener;
  }

  Inbox inbox_;
};

TEST_F(ListenerTest, OnlyCommittedNotificationsArriveWithTheirPayloads) {
  auto listener = StartListener({"alpha", "beta"});
  auto pool = MakePool();
  ASSERT_TRUE(
      pool->Transact([](Transaction& tx) { return Notify(tx, "alpha", "committed"); }).ok());
  const absl::Status rolled_back = pool->Transact([](Transaction& tx) -> absl::Status {
    EXPECT_TRUE(Notify(tx, "alpha", "rolled back").ok());
    return absl::AbortedError("roll it back");
  });
  EXPECT_EQ(rolled_back.code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(Notify(*pool, "gamma", "not listened to").ok());
  const std::string odd = "jobs/ü 'quoted' \"double\" $1 \\ ;\nnext line";
  ASSERT_TRUE(Notify(*pool, "beta", odd).ok());
  const std::string longest(kMaxNotifyPayloadBytes, 'x');
  ASSERT_TRUE(Notify(*pool, "alpha", longest).ok());
  // Delivered in commit order, so once the last is here nothing before it is still coming.
  const std::vector<Received> received = inbox_.WaitForPayload(longest);
  const std::vector<Received> expected = {
      {"alpha", "committed"}, {"beta", odd}, {"alpha", longest}};
  EXPECT_EQ(received, expected);
}

TEST_F(ListenerTest, BadNamesAndPayloadsAreRefusedNamingTheField) {
  auto pool = MakePool();
  const absl::Status long_payload =
      Notify(*pool, "alpha", std::string(kMaxNotifyPayloadBytes + 1, 'x'));
  EXPECT_EQ(long_payload.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(long_payload.message().find("payload"), std::string::npos) << long_payload;
  for (const std::string& bad :
       std::vector<std::string>{"", "Upper", "1st", "semi;colon", std::string(64, 'a')}) {
    const absl::Status status = Notify(*pool, bad, "x");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find("channel"), std::string::npos) << status;
  }
  ListenerOptions options;
  options.connection.url = url_;
  options.channels = {"fine", "not fine"};
  options.on_notification = [](const std::string&, const std::string&) {};
  const absl::Status refused = Listener(options).Start();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("channels[1]"), std::string::npos) << refused;
  options.on_notification = nullptr;
  options.channels = {"fine"};
  EXPECT_NE(Listener(options).Start().message().find("on_notification"), std::string::npos);
}

TEST_F(ListenerTest, KilledBackendIsReplacedAndReported) {
  auto listener = StartListener({"alpha"});
  auto pool = MakePool();
  auto killed = pool->Exec(
      "SELECT count(pg_terminate_backend(pid))::bigint AS n FROM pg_stat_activity"
      " WHERE application_name = 'listener_test'");
  ASSERT_TRUE(killed.ok()) << killed.status();
  ASSERT_EQ(killed->row(0).Get<int64_t>("n"), 1);
  EXPECT_EQ(inbox_.WaitForReconnects(1), 1);
  ASSERT_TRUE(listener->WaitUntilListening(absl::Now() + absl::Seconds(10)));
  ASSERT_TRUE(Notify(*pool, "alpha", "after the kill").ok());
  const std::vector<Received> received = inbox_.WaitForPayload("after the kill");
  EXPECT_EQ(received, (std::vector<Received>{{"alpha", "after the kill"}}));
}

TEST_F(ListenerTest, RestartedServerIsRejoinedAndStopStaysPrompt) {
  testing::PostgresServer& server = testing::PostgresServer::Shared();
  if (server.external()) GTEST_SKIP() << "needs our own server to restart";
  auto listener = StartListener({"alpha"});
  server.Stop();
  absl::SleepFor(absl::Seconds(2));  // a few failed connects, backing off
  EXPECT_FALSE(listener->listening());
  server.Start();
  EXPECT_GE(inbox_.WaitForReconnects(1), 1);
  ASSERT_TRUE(listener->WaitUntilListening(absl::Now() + absl::Seconds(10)));
  auto pool = MakePool();
  ASSERT_TRUE(Notify(*pool, "alpha", "after the restart").ok());
  EXPECT_EQ(inbox_.WaitForPayload("after the restart"),
            (std::vector<Received>{{"alpha", "after the restart"}}));
  // Idle and listening: Stop is noticed within stop_check (100 ms).
  const absl::Time stop_began = absl::Now();
  listener->Stop();
  EXPECT_LT(absl::Now() - stop_began, absl::Seconds(1));
  EXPECT_FALSE(listener->listening());
}

}  // namespace
}  // namespace gradhub::db
