// The contract of RendezvousStore (services/api/rendezvous_store.h), as one test suite that the
// store runs over every RendezvousBackend (the house model: tests/unit/ddp/store_conformance.h).
// A test file instantiates it with factories:
//
//   INSTANTIATE_TEST_SUITE_P(Backends, RendezvousStoreConformanceTest,
//       ::testing::Values(RendezvousStoreFactory{"InMemory", ...}), RendezvousStoreFactoryName);
//
// The factory is called once per test and must return a store over an empty backend; whatever
// the backend needs cleaned up afterwards (a pool, a database) belongs in the shared_ptr's
// deleter. This header defines the tests: include it in exactly one .cc of a test binary.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "services/api/rendezvous_store.h"

namespace gradhub::api {

struct RendezvousStoreFactory {
  std::string name;  // The test name suffix: letters, digits, '_'.
  std::function<std::shared_ptr<RendezvousStore>(RendezvousStoreOptions)> make;
};

inline void PrintTo(const RendezvousStoreFactory& factory, std::ostream* os) {
  *os << factory.name;
}

inline std::string RendezvousStoreFactoryName(
    const ::testing::TestParamInfo<RendezvousStoreFactory>& info) {
  return info.param.name;
}

// Polls `predicate` until it holds or `limit` passes.
inline bool EventuallyTrue(const std::function<bool()>& predicate,
                           std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!predicate()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// The outcome of one Get/Wait, filled by its callback from any thread.
class Outcome {
 public:
  RendezvousStore::GetCallback OnGet() {
    return [this](absl::StatusOr<std::string> result) { Complete(std::move(result)); };
  }
  RendezvousStore::WaitCallback OnWait() {
    return [this](absl::Status status) {
      if (status.ok()) {
        Complete(std::string());
      } else {
        Complete(std::move(status));
      }
    };
  }
  bool Await(std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
    return EventuallyTrue([this] { return calls() > 0; }, limit);
  }
  int calls() const { return calls_.load(); }
  absl::StatusOr<std::string> result() {
    std::lock_guard<std::mutex> lock(mu_);
    return result_;
  }

 private:
  void Complete(absl::StatusOr<std::string> result) {
    std::lock_guard<std::mutex> lock(mu_);
    result_ = std::move(result);
    ++calls_;
  }
  std::mutex mu_;
  absl::StatusOr<std::string> result_ = absl::UnknownError("not completed");
  std::atomic<int> calls_{0};
};

class RendezvousStoreConformanceTest : public ::testing::TestWithParam<RendezvousStoreFactory> {
 protected:
  void SetUp() override { store_ = Make(); }
  void TearDown() override { store_.reset(); }

  std::shared_ptr<RendezvousStore> Make(RendezvousStoreOptions options = {}) {
    auto store = GetParam().make(std::move(options));
    EXPECT_NE(store, nullptr);
    return store;
  }
  static std::string Key(const std::string& name) { return "jobs/j1/attempts/1/" + name; }

  std::shared_ptr<RendezvousStore> store_;
};

TEST_P(RendezvousStoreConformanceTest, SetThenGetReturnsBytesVerbatim) {
  const std::string bytes("a\0b\xff\x01", 5);
  ASSERT_TRUE(store_->Set(Key(std::string("bin\0key", 7)), bytes).ok());
  Outcome got;
  EXPECT_EQ(store_->Get(Key(std::string("bin\0key", 7)), absl::Seconds(1), got.OnGet()),
            RendezvousStore::kNoWaiter);
  ASSERT_EQ(got.calls(), 1);
  EXPECT_EQ(got.result().value(), bytes);
  ASSERT_TRUE(store_->Set(Key("bin"), "").ok());
  EXPECT_TRUE(store_->Check({Key("bin")}).value()) << "an empty value is present";
}

TEST_P(RendezvousStoreConformanceTest, GetBlocksUntilSetAndTimesOutNamingTheKey) {
  Outcome blocked;
  const RendezvousStore::WaiterId id = store_->Get(Key("k"), absl::Seconds(5), blocked.OnGet());
  EXPECT_NE(id, RendezvousStore::kNoWaiter);
  EXPECT_EQ(blocked.calls(), 0);
  ASSERT_TRUE(store_->Set(Key("k"), "v").ok());
  EXPECT_EQ(blocked.calls(), 1) << "a Set on this store completes its waiters inline";
  EXPECT_EQ(blocked.result().value(), "v");

  Outcome timed_out;
  store_->Get(Key("never"), absl::Milliseconds(50), timed_out.OnGet());
  ASSERT_TRUE(timed_out.Await());
  EXPECT_EQ(timed_out.result().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(timed_out.result().status().message().find("attempts/1/never"), std::string::npos)
      << timed_out.result().status();
}

TEST_P(RendezvousStoreConformanceTest, WaitNeedsEveryKeyAndNamesOnlyTheMissing) {
  Outcome all;
  store_->Wait({Key("a"), Key("b"), Key("c")}, absl::Seconds(5), all.OnWait());
  ASSERT_TRUE(store_->Set(Key("a"), "1").ok());
  ASSERT_TRUE(store_->Add(Key("b"), 1).ok());
  EXPECT_EQ(all.calls(), 0);
  ASSERT_TRUE(store_->Set(Key("c"), "3").ok());
  EXPECT_EQ(all.calls(), 1);
  EXPECT_TRUE(all.result().ok()) << all.result().status();

  Outcome partial;
  store_->Wait({Key("a"), Key("x")}, absl::Milliseconds(50), partial.OnWait());
  ASSERT_TRUE(partial.Await());
  const std::string message(partial.result().status().message());
  EXPECT_NE(message.find("attempts/1/x"), std::string::npos) << message;
  EXPECT_EQ(message.find("attempts/1/a"), std::string::npos) << message;
}

TEST_P(RendezvousStoreConformanceTest, AddCountsAndRefusesNonCounters) {
  EXPECT_EQ(store_->Add(Key("n"), 5).value(), 5);
  EXPECT_EQ(store_->Add(Key("n"), -7).value(), -2);
  Outcome got;
  store_->Get(Key("n"), absl::Seconds(1), got.OnGet());
  EXPECT_EQ(got.result().value(), "-2");
  ASSERT_TRUE(store_->Set(Key("text"), "abc").ok());
  const absl::StatusOr<int64_t> refused = store_->Add(Key("text"), 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("abc"), std::string::npos) << refused.status();
}

TEST_P(RendezvousStoreConformanceTest, AddOverflowIsOutOfRange) {
  ASSERT_TRUE(store_->Add(Key("n"), INT64_MAX).ok());
  EXPECT_EQ(store_->Add(Key("n"), 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(store_->Add(Key("n"), -1).value(), INT64_MAX - 1);
  ASSERT_TRUE(store_->Add(Key("m"), INT64_MIN).ok());
  EXPECT_EQ(store_->Add(Key("m"), -1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_P(RendezvousStoreConformanceTest, ConcurrentAddsCountExactly) {
  constexpr int kThreads = 4;
  constexpr int kAddsEach = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAddsEach; ++i) EXPECT_TRUE(store_->Add(Key("count"), 1).ok());
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(store_->Add(Key("count"), 0).value(), kThreads * kAddsEach);
}

TEST_P(RendezvousStoreConformanceTest, DeletePrefixIsAPlainStringPrefixOfAnAttempt) {
  for (const char* key : {"jobs/a/attempts/1/x", "jobs/a/attempts/1/y", "jobs/a/attempts/10/x",
                          "jobs/a/attempts/2/x"}) {
    ASSERT_TRUE(store_->Set(key, "v").ok());
  }
  EXPECT_EQ(store_->DeletePrefix("jobs/a/attempts/1/").value(), 2);
  EXPECT_EQ(store_->DeletePrefix("jobs/a/attempts/1/").value(), 0) << "idempotent";
  EXPECT_FALSE(store_->Check({"jobs/a/attempts/1/x"}).value());
  // std::string: two bare literals would make a vector from an iterator range.
  EXPECT_TRUE(
      store_->Check({std::string("jobs/a/attempts/10/x"), std::string("jobs/a/attempts/2/x")})
          .value());
  EXPECT_EQ(store_->size(), 2u);
}

TEST_P(RendezvousStoreConformanceTest, InvalidArgumentsNameTheField) {
  auto message = [](const absl::Status& status) { return std::string(status.message()); };
  EXPECT_EQ(message(store_->Set("", "v")), "key: must not be empty");
  EXPECT_EQ(message(store_->Set("elsewhere/k", "v")).rfind("key: ", 0), 0u);
  EXPECT_EQ(message(store_->Set(Key("k"), std::string((1 << 20) + 1, 'v'))).rfind("value: ", 0),
            0u);
  EXPECT_EQ(message(store_->Check({Key("k"), ""}).status()), "keys[1]: must not be empty");
  EXPECT_EQ(message(store_->DeletePrefix("").status()), "prefix: must not be empty");
  Outcome wait;
  store_->Wait({Key("ok"), "bad"}, absl::Seconds(1), wait.OnWait());
  EXPECT_EQ(wait.result().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(message(wait.result().status()).rfind("keys[1]: ", 0), 0u);
}

TEST_P(RendezvousStoreConformanceTest, TimeoutsDefaultAndCap) {
  EXPECT_EQ(store_->EffectiveTimeout(absl::ZeroDuration()), absl::Seconds(300));
  EXPECT_EQ(store_->EffectiveTimeout(absl::Seconds(-1)), absl::Seconds(300));
  EXPECT_EQ(store_->EffectiveTimeout(absl::Seconds(7)), absl::Seconds(7));
  EXPECT_EQ(store_->EffectiveTimeout(absl::Hours(5)), absl::Hours(1));
}

TEST_P(RendezvousStoreConformanceTest, WaitersExpireInDeadlineOrder) {
  std::mutex mu;
  std::vector<std::string> order;
  auto record = [&](std::string name) {
    return [&, name](absl::StatusOr<std::string> result) {
      EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded);
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(name);
    };
  };
  // 400 ms apart: each deadline counts from its own call, so the three calls must take less
  // than the gap. With 100 ms gaps the PostgreSQL backend's 200 ms waiter expired after its
  // 300 ms one once in a full parallel ctest (2c4e0ce): its two later calls took over 100 ms.
  store_->Get(Key("a"), absl::Milliseconds(1200), record("1200"));
  store_->Get(Key("b"), absl::Milliseconds(400), record("400"));
  store_->Get(Key("c"), absl::Milliseconds(800), record("800"));
  EXPECT_EQ(store_->pending_waiters(), 3u);
  // Wait for the callbacks, not pending_waiters(): a waiter leaves the count before its
  // callback runs (callbacks run outside the store's lock).
  ASSERT_TRUE(EventuallyTrue([&] {
    std::lock_guard<std::mutex> lock(mu);
    return order.size() == 3;
  }));
  EXPECT_EQ(store_->pending_waiters(), 0u);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(order, (std::vector<std::string>{"400", "800", "1200"}));
}

TEST_P(RendezvousStoreConformanceTest, AKeyDeletedBeforeTheLastArrivesIsWaitedForAgain) {
  ASSERT_TRUE(store_->Set(Key("a"), "1").ok());
  Outcome both;
  store_->Wait({Key("a"), Key("b")}, absl::Seconds(5), both.OnWait());
  ASSERT_TRUE(store_->DeletePrefix(Key("a")).ok());
  ASSERT_TRUE(store_->Set(Key("b"), "2").ok());
  EXPECT_EQ(both.calls(), 0) << "completed although a was gone";
  EXPECT_EQ(store_->pending_waiters(), 1u);
  ASSERT_TRUE(store_->Set(Key("a"), "3").ok());
  EXPECT_EQ(both.calls(), 1);
  EXPECT_TRUE(both.result().ok()) << both.result().status();
}

TEST_P(RendezvousStoreConformanceTest, PresentKeysCompleteInlineAndShutdownIsFinal) {
  ASSERT_TRUE(store_->Set(Key("k"), "v").ok());
  Outcome present;
  EXPECT_EQ(store_->Get(Key("k"), absl::Seconds(1), present.OnGet()), RendezvousStore::kNoWaiter);
  EXPECT_EQ(present.result().value(), "v");

  Outcome pending;
  const RendezvousStore::WaiterId id =
      store_->Wait({Key("missing")}, absl::Seconds(5), pending.OnWait());
  EXPECT_NE(id, RendezvousStore::kNoWaiter);
  store_->Shutdown();
  EXPECT_EQ(pending.result().status().code(), absl::StatusCode::kUnavailable);
  store_->CancelWait(id);  // Already completed: no second callback.
  EXPECT_EQ(pending.calls(), 1);

  Outcome after;
  store_->Wait({Key("missing")}, absl::Seconds(5), after.OnWait());
  EXPECT_EQ(after.result().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store_->pending_waiters(), 0u);
  EXPECT_TRUE(store_->Set(Key("still"), "works").ok());
}

TEST_P(RendezvousStoreConformanceTest, CancelWaitCompletesOnceWithCancelled) {
  Outcome cancelled;
  const RendezvousStore::WaiterId id = store_->Get(Key("k"), absl::Seconds(5), cancelled.OnGet());
  store_->CancelWait(id);
  EXPECT_EQ(cancelled.result().status().code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(store_->Set(Key("k"), "v").ok());
  EXPECT_EQ(cancelled.calls(), 1);
  EXPECT_EQ(store_->pending_waiters(), 0u);
}

TEST_P(RendezvousStoreConformanceTest, EveryWaiterCompletesExactlyOnceUnderConcurrency) {
  // Sets, Waits, cancels, timeouts and a final Shutdown racing: each callback runs once.
  constexpr int kThreads = 8;
  constexpr int kOpsEach = 200;
  std::atomic<int> registered{0};
  std::atomic<int> completed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOpsEach; ++i) {
        const std::string key = Key("k" + std::to_string((i * 7 + t) % 40));
        switch ((i + t) % 4) {
          case 0:
            EXPECT_TRUE(store_->Set(key, "v").ok());
            break;
          case 1:
            EXPECT_TRUE(store_->DeletePrefix(key).ok());
            break;
          case 2: {
            ++registered;
            const RendezvousStore::WaiterId id =
                store_->Wait({key, Key("k" + std::to_string(i % 40))}, absl::Milliseconds(i % 5),
                             [&](absl::Status) { ++completed; });
            if (i % 3 == 0) store_->CancelWait(id);
            break;
          }
          default:
            ++registered;
            store_->Get(key, absl::Milliseconds(50),
                        [&](absl::StatusOr<std::string>) { ++completed; });
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  store_->Shutdown();
  EXPECT_EQ(store_->pending_waiters(), 0u);
  ASSERT_TRUE(EventuallyTrue([&] { return completed == registered; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(completed.load(), registered.load());
}

}  // namespace gradhub::api
