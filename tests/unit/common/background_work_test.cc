// OrderedWorker: order, the memory bound, draining, and several producers; BackgroundSha256 on
// top of it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "services/common/background_sha256.h"
#include "services/common/ordered_worker.h"

namespace gradhub {
namespace {

TEST(OrderedWorkerTest, RunsTasksInTheOrderGiven) {
  std::vector<int> order;
  {
    OrderedWorker worker(1 << 20);
    for (int i = 0; i < 100; ++i) worker.Submit(1, [&order, i] { order.push_back(i); });
    worker.Drain();
    EXPECT_EQ(order.size(), 100u);
  }
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(OrderedWorkerTest, SubmitBlocksWhileTheQueueHoldsMoreThanItsBound) {
  OrderedWorker worker(10);
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  worker.Submit(8, [&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ++ran;
  });
  worker.Submit(8, [&] { ++ran; });  // 8 < 10: admitted while the first runs
  std::atomic<bool> third_submitted{false};
  std::thread producer([&] {
    worker.Submit(1, [&] { ++ran; });  // 16 >= 10: waits for room
    third_submitted = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(third_submitted);
  release = true;
  producer.join();
  worker.Drain();
  EXPECT_EQ(ran, 3);
}

TEST(OrderedWorkerTest, ATaskLargerThanTheBoundIsStillAdmitted) {
  OrderedWorker worker(10);
  bool ran = false;
  worker.Submit(1000, [&] { ran = true; });
  worker.Drain();
  EXPECT_TRUE(ran);
}

TEST(OrderedWorkerTest, TheDestructorRunsWhatIsQueued) {
  std::atomic<int> ran{0};
  {
    OrderedWorker worker(1 << 20);
    for (int i = 0; i < 10; ++i) {
      worker.Submit(1, [&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ++ran;
      });
    }
  }
  EXPECT_EQ(ran, 10);
}

TEST(OrderedWorkerTest, TasksFromSeveralThreadsAllRunAndDrainWaitsForEveryone) {
  std::atomic<int> ran{0};
  OrderedWorker worker(1);  // the smallest bound: producers wait for each other's tasks
  std::vector<std::thread> producers;
  for (int p = 0; p < 4; ++p) {
    producers.emplace_back([&] {
      for (int i = 0; i < 100; ++i) worker.Submit(1, [&] { ++ran; });
    });
  }
  for (std::thread& producer : producers) producer.join();
  worker.Drain();
  EXPECT_EQ(ran, 400);
}

TEST(BackgroundSha256Test, EqualsTheHashOfTheWholeInPieces) {
  std::string whole;
  BackgroundSha256 sha(4096);  // a small bound, so Update waits for the hashing thread
  for (int i = 0; i < 50; ++i) {
    std::string piece(1000 + i * 37, static_cast<char>('a' + i % 26));
    whole += piece;
    sha.Update(std::move(piece));
  }
  EXPECT_EQ(sha.Hex(), Sha256Hex(whole));
  // Update may go on after Hex().
  sha.Update("tail");
  EXPECT_EQ(sha.Hex(), Sha256Hex(whole + "tail"));
}

TEST(BackgroundSha256Test, NothingGivenIsTheEmptyHash) {
  BackgroundSha256 sha;
  sha.Update("");
  EXPECT_EQ(sha.Hex(), Sha256Hex(""));
}

}  // namespace
}  // namespace gradhub
