// The contract of gpu_worker/ddp/store.h, as one test suite that every Store backend runs
// (Ray's store_client_test_base.h). A backend's test file instantiates it with a factory:
//
//   INSTANTIATE_TEST_SUITE_P(Backends, StoreConformanceTest,
//       ::testing::Values(StoreFactory{"InMemory", [] { return std::make_shared<...>(); }}),
//       StoreFactoryName);
//
// The factory is called once per test and must return an empty store; whatever the store
// needs cleaned up afterwards (a temp dir, a server) belongs in the shared_ptr's deleter.
// This header defines the tests, so include it in exactly one .cc of a test binary.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_worker/ddp/store.h"

namespace gradhub::ddp {

struct StoreFactory {
  std::string name;  // The test name suffix: letters, digits, '_'.
  std::function<std::shared_ptr<Store>()> make;
  // False for a backend that cannot list its keys (TcpStore): its DeletePrefix must refuse
  // with std::logic_error rather than delete some of the keys.
  bool deletes_by_prefix = true;
};

inline void PrintTo(const StoreFactory& factory, std::ostream* os) { *os << factory.name; }

inline std::string StoreFactoryName(const ::testing::TestParamInfo<StoreFactory>& info) {
  return info.param.name;
}

class StoreConformanceTest : public ::testing::TestWithParam<StoreFactory> {
 protected:
  // Short enough that the suite stays fast, long enough that a store answering at once
  // instead of waiting is caught by the elapsed-time checks.
  static constexpr std::chrono::milliseconds kShortTimeout{100};
  // For waits that should succeed: reaching it means the test failed.
  static constexpr std::chrono::milliseconds kLongTimeout{5000};

  void SetUp() override {
    store_ = GetParam().make();
    ASSERT_NE(store_, nullptr);
  }
  void TearDown() override { store_.reset(); }

  // Runs `fn` after `delay` on another thread; join it before the test ends. An exception
  // fails the test instead of terminating the binary.
  static std::thread After(std::chrono::milliseconds delay, std::function<void()> fn) {
    return std::thread([delay, fn = std::move(fn)] {
      std::this_thread::sleep_for(delay);
      Guarded(fn);
    });
  }

  static void Guarded(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "thread threw: " << e.what();
    }
  }

  std::shared_ptr<Store> store_;
};

TEST_P(StoreConformanceTest, SetThenGetReturnsTheValue) {
  store_->Set("a", "1");
  EXPECT_EQ(store_->Get("a", kShortTimeout), "1");
}

TEST_P(StoreConformanceTest, ValuesAreBytes) {
  const std::string binary("\0a\0\xff\n\0", 6);
  store_->Set("binary", binary);
  std::string got = store_->Get("binary", kShortTimeout);
  EXPECT_EQ(got.size(), 6u);
  EXPECT_EQ(got, binary);

  store_->Set("empty", "");
  EXPECT_EQ(store_->Get("empty", kShortTimeout), "");
  EXPECT_TRUE(store_->Check({"empty"}));

  std::string big(1 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 7 + i / 4096) % 256);
  store_->Set("big", big);
  EXPECT_TRUE(store_->Get("big", kShortTimeout) == big) << "1 MiB value came back different";
}

TEST_P(StoreConformanceTest, SetOverwrites) {
  store_->Set("a", "a longer first value");
  store_->Set("a", "short");
  EXPECT_EQ(store_->Get("a", kShortTimeout), "short");
}

TEST_P(StoreConformanceTest, GetNeverSeesAPartialValue) {
  const std::string a(32 * 1024, 'a'), b(32 * 1024, 'b');
  store_->Set("torn", a);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    Guarded([&] {
      for (int i = 0; i < 100; ++i) store_->Set("torn", i % 2 ? a : b);
    });
    done = true;
  });
  int torn = 0;
  while (!done) {
    std::string value = store_->Get("torn", kShortTimeout);
    if (value != a && value != b) ++torn;
  }
  writer.join();
  EXPECT_EQ(torn, 0) << "Get returned a value that was never set";
}

TEST_P(StoreConformanceTest, GetOfMissingKeyTimesOutNamingTheKey) {
  auto start = std::chrono::steady_clock::now();
  try {
    store_->Get("missing/key", kShortTimeout);
    FAIL() << "Get of a missing key returned";
  } catch (const StoreTimeoutError& e) {
    auto elapsed = std::chrono::steady_clock::now() - start;
    EXPECT_GE(elapsed, kShortTimeout);
    EXPECT_LT(elapsed, std::chrono::seconds(2));
    EXPECT_NE(std::string(e.what()).find("missing/key"), std::string::npos) << e.what();
  }
}

TEST_P(StoreConformanceTest, GetWaitsForAnotherThreadToSet) {
  auto start = std::chrono::steady_clock::now();
  std::thread setter = After(std::chrono::milliseconds(50), [&] { store_->Set("late", "here"); });
  std::string value;
  EXPECT_NO_THROW(value = store_->Get("late", kLongTimeout));
  setter.join();
  EXPECT_EQ(value, "here");
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(50));
}

TEST_P(StoreConformanceTest, WaitAndCheckSeveralKeys) {
  EXPECT_TRUE(store_->Check({}));
  EXPECT_FALSE(store_->Check({"w1", "w2"}));
  store_->Set("w1", "x");
  EXPECT_TRUE(store_->Check({"w1"}));
  EXPECT_FALSE(store_->Check({"w1", "w2"}));

  // The timeout names what is missing and only that.
  try {
    store_->Wait({"w1", "w2"}, kShortTimeout);
    FAIL() << "Wait returned with w2 missing";
  } catch (const StoreTimeoutError& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("w2"), std::string::npos) << message;
    EXPECT_EQ(message.find("w1"), std::string::npos) << message;
  }

  std::thread setter = After(std::chrono::milliseconds(20), [&] { store_->Set("w2", "y"); });
  EXPECT_NO_THROW(store_->Wait({"w1", "w2"}, kLongTimeout));
  setter.join();
  EXPECT_TRUE(store_->Check({"w1", "w2"}));
}

TEST_P(StoreConformanceTest, AddIsAtomicAcrossThreads) {
  constexpr int kThreads = 8;
  constexpr int kAdds = 100;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Guarded([&] {
        for (int i = 0; i < kAdds; ++i) seen[t].push_back(store_->Add("counter", 1));
      });
    });
  }
  for (auto& thread : threads) thread.join();

  EXPECT_EQ(store_->Get("counter", kShortTimeout), std::to_string(kThreads * kAdds));
  // Each Add returned its own new value: together they are exactly 1..800.
  std::vector<int64_t> all;
  for (const auto& values : seen) all.insert(all.end(), values.begin(), values.end());
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(kThreads * kAdds);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<int64_t>(i) + 1;
  EXPECT_EQ(all, expected);
}

TEST_P(StoreConformanceTest, CountersShareTheKeySpaceWithValues) {
  EXPECT_EQ(store_->Add("c", 5), 5);  // A missing counter starts at 0.
  EXPECT_EQ(store_->Add("c", -7), -2);
  EXPECT_EQ(store_->Get("c", kShortTimeout), "-2");
  EXPECT_TRUE(store_->Check({"c"}));

  store_->Set("n", "41");
  EXPECT_EQ(store_->Add("n", 1), 42);
  EXPECT_EQ(store_->Get("n", kShortTimeout), "42");
}

TEST_P(StoreConformanceTest, AddOnAValueThrowsAndKeepsIt) {
  store_->Set("v", "hello");
  EXPECT_THROW(store_->Add("v", 1), StoreError);
  store_->Set("v2", "12abc");
  EXPECT_THROW(store_->Add("v2", 1), StoreError);
  EXPECT_EQ(store_->Get("v", kShortTimeout), "hello");
  EXPECT_EQ(store_->Get("v2", kShortTimeout), "12abc");
}

TEST_P(StoreConformanceTest, DeletePrefixRemovesOnlyMatchingKeys) {
  if (!GetParam().deletes_by_prefix) {
    store_->Set("del/a", "v");
    EXPECT_THROW(store_->DeletePrefix("del/"), std::logic_error);
    EXPECT_TRUE(store_->Check({"del/a"}));
    return;
  }
  for (const char* key : {"del/a", "del/b", "del/c/d", "delx", "de", "keep/del/a"}) {
    store_->Set(key, "v");
  }
  store_->Add("del/counter", 1);
  EXPECT_EQ(store_->DeletePrefix("del/"), 4);
  EXPECT_FALSE(store_->Check({"del/a"}));
  EXPECT_FALSE(store_->Check({"del/b"}));
  EXPECT_FALSE(store_->Check({"del/c/d"}));
  EXPECT_FALSE(store_->Check({"del/counter"}));
  EXPECT_TRUE(store_->Check({"delx", "de", "keep/del/a"}));
  EXPECT_EQ(store_->DeletePrefix("del/"), 0);
  EXPECT_EQ(store_->DeletePrefix("nothing"), 0);

  // A deleted key can be set again; a deleted counter starts over.
  EXPECT_EQ(store_->Add("del/counter", 1), 1);
  EXPECT_EQ(store_->DeletePrefix(""), 4);  // Every key.
  EXPECT_FALSE(store_->Check({"delx"}));
}

TEST_P(StoreConformanceTest, UnusualKeysWorkAndStayDistinct) {
  // Pairs that a careless encoding would merge ("a/b" and "a%2Fb") or that name paths
  // ("..", "../x", "/abs").
  const std::vector<std::string> keys = {"a/b",   "a%2Fb", "a_2Fb", "a b",     "a+b",
                                         "..",    ".",     "../x",  "/abs",    "abs",
                                         "a/./b", "a//b",  "a\nb",  "\xc3\xa9"};
  for (size_t i = 0; i < keys.size(); ++i) store_->Set(keys[i], "value" + std::to_string(i));
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(store_->Get(keys[i], kShortTimeout), "value" + std::to_string(i)) << "key #" << i;
  }
  EXPECT_TRUE(store_->Check(keys));
  if (!GetParam().deletes_by_prefix) return;
  EXPECT_EQ(store_->DeletePrefix("a/"), 3);  // "a/b", "a/./b", "a//b".
  EXPECT_TRUE(store_->Check({"a%2Fb", "a b", "..", "../x", "/abs", "abs"}));
}

}  // namespace gradhub::ddp
