// Point to point on the Gloo backend (gloo/point_to_point.h): what only Gloo promises beyond
// the conformance suite's orders -- transfers posted in any order on the two sides, tags
// independent of each other, many in flight, never waiting behind a collective -- and its
// size check, timeout and the slots it uses. Plain and sealed, on one and on two channels.
// Ranks are threads over an InMemoryStore with real gloo TCP between them; a peer process
// that dies is in process_group_death_test.cc, the wire (sealing, tampering) in
// encrypted_process_group_test.cc.
#include <ATen/ATen.h>
#include <gloo/types.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gpu_worker/ddp/comm/gloo/point_to_point.h"
#include "gpu_worker/ddp/comm/gloo/task_threads.h"
#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/comm/work.h"
#include "gpu_worker/ddp/store/in_memory_store.h"
#include "tests/unit/ddp/collective_values.h"
#include "tests/unit/ddp/test_ranks.h"

namespace gradhub::ddp {
namespace {

using ::testing::HasSubstr;
using testing::HasValues;
using testing::MakeTensor;
using Clock = std::chrono::steady_clock;

constexpr int64_t kMiB = 1 << 20;

struct Variant {
  std::string name;
  int channels = 1;
  bool encrypt = false;
};

class GlooPointToPointTest : public ::testing::TestWithParam<Variant> {
 protected:
  ProcessGroupOptions Options(int rank, int size, const std::string& name,
                              std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    ProcessGroupOptions options;
    options.rank = rank;
    options.size = size;
    options.store = store_;
    options.name = name;
    options.timeout = timeout;
    GlooOptions& gloo = options.gloo.emplace();
    gloo.shared_memory = false;  // allreduces over TCP too, beside the transfers
    gloo.channels = GetParam().channels;
    gloo.encrypt_traffic = GetParam().encrypt;
    return options;
  }

  // Runs fn(rank, its group) for `world` ranks, each on its own thread.
  void OnRanks(int world, const std::string& name,
               const std::function<void(int rank, ProcessGroup& group)>& fn) {
    testing::spawnThreads(
        world, [&](int rank) { fn(rank, *CreateProcessGroup(Options(rank, world, name))); });
  }

  // Runs fn(group) as rank 0 of a group of two whose rank 1 is alive but never sends.
  void WithASilentPeer(const std::string& name, std::chrono::milliseconds timeout,
                       const std::function<void(std::shared_ptr<ProcessGroup>& group)>& fn) {
    std::atomic<bool> done{false};
    testing::spawnThreads(2, [&](int rank) {
      auto group = CreateProcessGroup(Options(rank, 2, name, timeout));
      if (rank == 1) {
        while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return;
      }
      fn(group);
      done = true;
    });
  }

  std::shared_ptr<InMemoryStore> store_ = std::make_shared<InMemoryStore>();
};

// Distinct per sender and message, exact in every dtype (small integers).
double Payload(int64_t i, int sender, int message) {
  return static_cast<double>((i * 7 + sender * 3 + message) % 97);
}

at::Tensor Message(at::ScalarType type, int64_t numel, int sender, int message) {
  return MakeTensor(type, numel, [&](int64_t i) { return Payload(i, sender, message); });
}

TEST_P(GlooPointToPointTest, RingOfSendsWithReceivesPostedBeforeOrAfter) {
  constexpr int n = 3;
  constexpr int64_t kNumel = 4 * kMiB / 4;  // 4 MiB: more than a socket buffer holds
  OnRanks(n, "ring", [&](int rank, ProcessGroup& group) {
    const int next = (rank + 1) % n, previous = (rank + n - 1) % n;
    for (bool receive_first : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "rank " << rank << ", receive first " << receive_first);
      const int message = receive_first ? 1 : 0;
      at::Tensor got = at::zeros({kNumel});
      std::shared_ptr<Work> send, recv;
      if (receive_first) recv = group.Recv(got, previous, 3);
      send = group.Send(Message(at::kFloat, kNumel, rank, message), next, 3);
      if (!receive_first) recv = group.Recv(got, previous, 3);
      recv->Wait();  // the receive first: a blocking send would deadlock the ring here
      send->Wait();
      EXPECT_TRUE(HasValues(got, [&](int64_t i) { return Payload(i, previous, message); }));
    }
  });
}

TEST_P(GlooPointToPointTest, TwoTagsBetweenOnePairCompleteOutOfOrder) {
  OnRanks(2, "tags", [&](int rank, ProcessGroup& group) {
    if (rank == 0) {
      // Tag 1 is sent only once the receiver has got tag 2, posted after it.
      auto first = group.Send(Message(at::kFloat, kMiB, 0, 1), 1, 1);
      auto second = group.Send(Message(at::kFloat, 1000, 0, 2), 1, 2);
      second->Wait();
      first->Wait();
      return;
    }
    at::Tensor one = at::zeros({kMiB}), two = at::zeros({1000});
    auto second = group.Recv(two, 0, 2);
    second->Wait();
    EXPECT_TRUE(HasValues(two, [](int64_t i) { return Payload(i, 0, 2); }));
    group.Recv(one, 0, 1)->Wait();
    EXPECT_TRUE(HasValues(one, [](int64_t i) { return Payload(i, 0, 1); }));
  });
}

TEST_P(GlooPointToPointTest, SixtyFourSendsOutstandingBeforeAnyReceive) {
  constexpr int kSends = 64;
  OnRanks(2, "many", [&](int rank, ProcessGroup& group) {
    if (rank == 0) {
      std::vector<std::shared_ptr<Work>> sends;
      for (int k = 0; k < kSends; ++k) {
        // Tags 0 and 1 alternate: each tag's messages match in their issue order.
        sends.push_back(group.Send(Message(at::kDouble, 1000 + k, 0, k), 1, k % 2));
      }
      for (auto& send : sends) send->Wait();
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // every send is waiting
    std::vector<at::Tensor> got;
    std::vector<std::shared_ptr<Work>> recvs;
    for (int k = 0; k < kSends; ++k) got.push_back(at::zeros({1000 + k}, at::kDouble));
    for (int k = 0; k < kSends; ++k) recvs.push_back(group.Recv(got[k], 0, k % 2));
    for (int k = kSends - 1; k >= 0; --k) recvs[k]->Wait();  // waited for in reverse
    for (int k = 0; k < kSends; ++k) {
      EXPECT_TRUE(HasValues(got[k], [&](int64_t i) { return Payload(i, 0, k); }))
          << "message " << k;
    }
  });
}

// The elements of `type` that make a payload of exactly the inline limit (the largest that
// rides in its header's message).
int64_t InlineLimit(at::ScalarType type) {
  return static_cast<int64_t>(kPointToPointInlineMaxBytes) /
         static_cast<int64_t>(c10::elementSize(type));
}

TEST_P(GlooPointToPointTest, EveryDtypeBothWaysAtOnce) {
  OnRanks(2, "dtypes", [&](int rank, ProcessGroup& group) {
    for (at::ScalarType type : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong}) {
      for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, InlineLimit(type),
                            InlineLimit(type) + 1, kMiB + 7}) {
        SCOPED_TRACE(::testing::Message() << "rank " << rank << ", " << type << ", " << numel);
        at::Tensor got = at::zeros({numel}, at::TensorOptions().dtype(type));
        auto send = group.Send(Message(type, numel, rank, 5), 1 - rank, 9);
        auto recv = group.Recv(got, 1 - rank, 9);
        recv->Wait();
        send->Wait();
        EXPECT_TRUE(HasValues(got, [&](int64_t i) { return Payload(i, 1 - rank, 5); }));
      }
    }
  });
}

TEST_P(GlooPointToPointTest, SizeMismatchFailsTheRecvNamingBothSizesAndKeepsThePairInStep) {
  OnRanks(2, "mismatch", [&](int rank, ProcessGroup& group) {
    if (rank == 0) {
      group.Send(Message(at::kFloat, 1024, 0, 0), 1, 4)->Wait();
      group.Send(Message(at::kDouble, 512, 0, 1), 1, 4)->Wait();  // 4096 bytes as well
      group.Send(Message(at::kFloat, 10, 0, 2), 1, 4)->Wait();
      return;
    }
    auto refused = [&](at::Tensor into, const std::string& sizes) {
      try {
        group.Recv(into, 0, 4)->Wait();
        ADD_FAILURE() << "a Recv of the wrong size completed";
      } catch (const CommError& e) {
        EXPECT_THAT(e.what(), HasSubstr("from rank 0, tag 4) in group 'mismatch' rank 1/2: size "
                                        "mismatch: rank 0 sent " +
                                        sizes));
      }
      EXPECT_TRUE(into.eq(0).all().item<bool>()) << "the refused tensor was written";
    };
    refused(at::zeros({512}),
            "1024 float32 elements (4096 bytes), this rank expects 512 float32 "
            "elements (2048 bytes)");
    refused(at::zeros({1024}),
            "512 float64 elements (4096 bytes), this rank expects 1024 float32 "
            "elements (4096 bytes)");
    // The pair is still in step and the group usable.
    at::Tensor good = at::zeros({10});
    group.Recv(good, 0, 4)->Wait();
    EXPECT_TRUE(HasValues(good, [](int64_t i) { return Payload(i, 0, 2); }));
  });
}

// Mismatches on either side of the inline limit: an inline payload where a larger one is
// expected (its receive stays posted), a larger one where an inline one is (drained from its
// slot), and two larger ones of different sizes (drained); then a transfer of each kind, in step.
TEST_P(GlooPointToPointTest, SizeMismatchAcrossTheInlineLimitFailsTheRecvAndKeepsThePairInStep) {
  const int64_t small = 1024;
  const int64_t large = InlineLimit(at::kFloat) + 1;
  OnRanks(2, "mismatch-inline", [&](int rank, ProcessGroup& group) {
    const std::vector<std::pair<int64_t, int64_t>> sent_expected = {
        {small, large}, {large, small}, {large, 2 * large}};
    if (rank == 0) {
      int message = 0;
      for (const auto& [sent, expected] : sent_expected) {
        group.Send(Message(at::kFloat, sent, 0, message++), 1, 6)->Wait();
      }
      group.Send(Message(at::kFloat, small, 0, 7), 1, 6)->Wait();
      group.Send(Message(at::kFloat, large, 0, 8), 1, 6)->Wait();
      return;
    }
    for (const auto& [sent, expected] : sent_expected) {
      SCOPED_TRACE(::testing::Message() << sent << " sent, " << expected << " expected");
      at::Tensor into = at::zeros({expected});
      try {
        group.Recv(into, 0, 6)->Wait();
        ADD_FAILURE() << "a Recv of the wrong size completed";
      } catch (const CommError& e) {
        EXPECT_THAT(e.what(), HasSubstr("size mismatch: rank 0 sent " + std::to_string(sent) +
                                        " float32 elements (" + std::to_string(4 * sent) +
                                        " bytes), this rank expects " + std::to_string(expected) +
                                        " float32 elements"));
      }
      EXPECT_TRUE(into.eq(0).all().item<bool>()) << "the refused tensor was written";
    }
    at::Tensor good_small = at::zeros({small});
    at::Tensor good_large = at::zeros({large});
    group.Recv(good_small, 0, 6)->Wait();
    group.Recv(good_large, 0, 6)->Wait();
    EXPECT_TRUE(HasValues(good_small, [](int64_t i) { return Payload(i, 0, 7); }));
    EXPECT_TRUE(HasValues(good_large, [](int64_t i) { return Payload(i, 0, 8); }));
  });
}

TEST_P(GlooPointToPointTest, TransfersAndAllReducesInterleaveOnOneGroup) {
  using testing::Sum;
  OnRanks(2, "interleaved", [&](int rank, ProcessGroup& group) {
    for (int round = 0; round < 4; ++round) {
      at::Tensor reduced = testing::MakeTensor(
          at::kFloat, kMiB / 4, [&](int64_t i) { return testing::Value(i, rank, 2); });
      at::Tensor got = at::zeros({5000});
      auto send = group.Send(Message(at::kFloat, 5000, rank, round), 1 - rank, round);
      auto allreduce = group.AllReduce(reduced);
      auto recv = group.Recv(got, 1 - rank, round);
      allreduce->Wait();
      recv->Wait();
      send->Wait();
      EXPECT_TRUE(HasValues(reduced, [](int64_t i) { return Sum(i, 2); }));
      EXPECT_TRUE(HasValues(got, [&](int64_t i) { return Payload(i, 1 - rank, round); }));
    }
  });
}

TEST_P(GlooPointToPointTest, ATransferDoesNotWaitBehindACollective) {
  constexpr auto kLate = std::chrono::milliseconds(500);
  OnRanks(2, "independent", [&](int rank, ProcessGroup& group) {
    at::Tensor reduced = at::ones({1000});
    if (rank == 0) {
      auto allreduce = group.AllReduce(reduced);  // its peer comes kLate later
      auto send = group.Send(Message(at::kFloat, 100, 0, 0), 1, 0);
      send->Wait();
      EXPECT_FALSE(allreduce->IsCompleted()) << "the allreduce was expected to wait for rank 1";
      allreduce->Wait();
      EXPECT_LT(send->end_time(), allreduce->end_time());
      return;
    }
    at::Tensor got = at::zeros({100});
    group.Recv(got, 0, 0)->Wait();
    std::this_thread::sleep_for(kLate);
    group.AllReduce(reduced)->Wait();
    EXPECT_TRUE(HasValues(got, [](int64_t i) { return Payload(i, 0, 0); }));
  });
}

TEST_P(GlooPointToPointTest, ARecvWhosePeerNeverSendsFailsAtTheTimeoutAndBreaksTheGroup) {
  constexpr auto kTimeout = std::chrono::milliseconds(500);
  WithASilentPeer("silent", kTimeout, [&](std::shared_ptr<ProcessGroup>& group) {
    const auto start = Clock::now();
    try {
      group->Recv(at::zeros({10}), 1, 5)->Wait(std::chrono::seconds(10));
      ADD_FAILURE() << "a Recv without a Send completed";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("recv #0 (float32, 10 elements, from rank 1, tag 5) in "
                                      "group 'silent' rank 0/2: timed out after 500 ms"));
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    EXPECT_GE(seconds, 0.45);
    EXPECT_LT(seconds, 5.0);
    try {
      group->Send(at::ones({3}), 1, 5)->Wait();
      ADD_FAILURE() << "a broken group ran a Send";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("send #0"));
      EXPECT_THAT(e.what(), HasSubstr("unusable after an earlier failure"));
    }
  });
}

TEST_P(GlooPointToPointTest, DestroyingTheGroupWaitsForItsTransfers) {
  testing::spawnThreads(2, [&](int rank) {
    auto group = CreateProcessGroup(Options(rank, 2, "destroyed"));
    at::Tensor got = at::zeros({kMiB});
    auto work =
        rank == 0 ? group->Send(Message(at::kFloat, kMiB, 0, 0), 1, 0) : group->Recv(got, 0, 0);
    group.reset();  // without waiting
    EXPECT_TRUE(work->IsCompleted()) << "rank " << rank;
    EXPECT_EQ(work->error(), nullptr) << "rank " << rank;
    work->Wait();  // after its group: nothing left for the waiter to claim
    if (rank == 1) {
      EXPECT_TRUE(HasValues(got, [](int64_t i) { return Payload(i, 0, 0); }));
    }
  });
}

// Steps 2 to 4 run on whichever thread claims a transfer first (point_to_point.h): a receive
// waited for at once is mostly finished by its waiter, not by its task thread.
TEST_P(GlooPointToPointTest, AWaiterFinishesTheTransferItClaimsOnItsOwnThread) {
  constexpr int kMessages = 100;
  std::atomic<int> on_waiter{0};
  OnRanks(2, "claims", [&](int rank, ProcessGroup& group) {
    for (int message = 0; message < kMessages; ++message) {
      if (rank == 0) {
        group.Send(Message(at::kFloat, 8, 0, message), 1, 0)->Wait();
        continue;
      }
      at::Tensor got = at::zeros({8});
      auto work = group.Recv(got, 0, 0);
      // Counted only inside Wait(): a Work complete already runs the callback at once, here.
      std::atomic<bool> waiting{false};
      const std::thread::id waiter = std::this_thread::get_id();
      work->OnCompletion([&, waiter] {
        if (std::this_thread::get_id() == waiter && waiting) ++on_waiter;
      });
      waiting = true;
      work->Wait();
      EXPECT_TRUE(HasValues(got, [&](int64_t i) { return Payload(i, 0, message); }));
    }
  });
  EXPECT_GT(on_waiter.load(), 0) << "every receive was finished by its task thread";
}

// Destruction lets no waiter claim a transfer from then on and waits for those that did.
TEST_P(GlooPointToPointTest, DestroyingTheGroupWaitsForAWaiterFinishingATransfer) {
  constexpr auto kTimeout = std::chrono::milliseconds(500);
  WithASilentPeer("waited", kTimeout, [&](std::shared_ptr<ProcessGroup>& group) {
    std::promise<std::shared_ptr<Work>> issued;
    std::thread waiter([&] {
      auto work = group->Recv(at::zeros({10}), 1, 5);
      issued.set_value(work);
      EXPECT_THROW(work->Wait(), CommError);  // at the group's timeout
    });
    const std::shared_ptr<Work> work = issued.get_future().get();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    group.reset();
    EXPECT_TRUE(work->IsCompleted()) << "the group went while its transfer was being finished";
    waiter.join();
  });
}

INSTANTIATE_TEST_SUITE_P(Gloo, GlooPointToPointTest,
                         ::testing::Values(Variant{"Tcp", 1, false},
                                           Variant{"TcpTwoChannels", 2, false},
                                           Variant{"Sealed", 1, true},
                                           Variant{"SealedTwoChannels", 2, true}),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------
// The parts.

TEST(PointToPointSlotTest, NeverAGlooCollectiveSlotAndDistinctPerPartTagAndIndex) {
  constexpr int32_t kFloat = static_cast<int32_t>(at::kFloat);
  for (uint32_t tag : {0u, 1u, 0xffffffffu}) {
    for (uint64_t index : {uint64_t{0}, uint64_t{1}, uint64_t{0xffffff}}) {
      const uint64_t header = PointToPointSlot(tag, index);
      const uint64_t payload = PointToPointPayloadSlot(tag, index, 4096, 1024, kFloat);
      EXPECT_EQ(header >> 56, 0x80u);
      EXPECT_EQ(payload >> 56, 0x81u);
      EXPECT_EQ((header >> 24) & 0xffffffffu, tag);
      EXPECT_EQ(header & 0xffffff, index);
      // gloo's collectives: prefixes 0x01 to 0x08 and the sealed ones' 0x47, with any delta.
      for (uint8_t prefix : {0x01, 0x04, 0x07, 0x08, 0x47}) {
        const uint64_t collective = gloo::Slot::build(prefix, tag);
        EXPECT_NE(header >> 56, collective >> 56);
        EXPECT_NE(payload >> 56, collective >> 56);
      }
    }
  }
  EXPECT_NE(PointToPointSlot(1, 0), PointToPointSlot(2, 0));
  EXPECT_NE(PointToPointSlot(1, 0), PointToPointSlot(1, 1));
  EXPECT_EQ(PointToPointSlot(1, 0), PointToPointSlot(1, uint64_t{1} << 24));  // wraps
}

TEST(PointToPointSlotTest, APayloadsSlotTellsApartItsTagIndexAndEveryPartOfItsSize) {
  constexpr int32_t kFloat = static_cast<int32_t>(at::kFloat);
  constexpr int32_t kDouble = static_cast<int32_t>(at::kDouble);
  const uint64_t slot = PointToPointPayloadSlot(3, 7, 4096, 1024, kFloat);
  EXPECT_EQ(slot, PointToPointPayloadSlot(3, 7, 4096, 1024, kFloat));  // both ends agree
  EXPECT_NE(slot, PointToPointPayloadSlot(4, 7, 4096, 1024, kFloat));
  EXPECT_NE(slot, PointToPointPayloadSlot(3, 8, 4096, 1024, kFloat));
  EXPECT_NE(slot, PointToPointPayloadSlot(3, 7, 2048, 512, kFloat));
  EXPECT_NE(slot, PointToPointPayloadSlot(3, 7, 4096, 512, kDouble));  // same bytes
  EXPECT_NE(slot, PointToPointPayloadSlot(3, 7, 4096, 1024, kDouble));
  // k's bits above the header slot's 24 count too: a receive left posted by a size mismatch
  // is not met again 2^24 transfers later.
  EXPECT_NE(slot, PointToPointPayloadSlot(3, 7 + (uint64_t{1} << 24), 4096, 1024, kFloat));
  // One size: one to one in (tag, k), as the header's slot is.
  std::set<uint64_t> seen;
  for (uint32_t tag = 0; tag < 64; ++tag) {
    for (uint64_t index = 0; index < 256; ++index) {
      EXPECT_TRUE(seen.insert(PointToPointPayloadSlot(tag, index, 32, 8, kFloat)).second);
    }
  }
}

// Work::LetWaiterFinish: a Wait() of at least the group's timeout runs the waiter's part
// first; a shorter one must be free to give up, so it leaves that part to the backend.
TEST(WorkTest, AWaitOfTheGroupsTimeoutRunsTheWaitersPartFirst) {
  Work work("send #0 in group 'g' rank 0/2", std::chrono::seconds(10));
  bool ran = false;
  work.LetWaiterFinish([&] {
    ran = true;
    work.Complete();
  });
  work.Wait();
  EXPECT_TRUE(ran);
}

TEST(WorkTest, AShorterWaitLeavesTheWaitersPartToTheBackend) {
  Work work("send #0 in group 'g' rank 0/2", std::chrono::seconds(10));
  bool ran = false;
  work.LetWaiterFinish([&] { ran = true; });
  EXPECT_THROW(work.Wait(std::chrono::milliseconds(20)), CommError);
  EXPECT_FALSE(ran);
}

TEST(TaskThreadsTest, TasksThatWaitForLaterTasksAllRun) {
  // Task k waits until task k + 1 has started: only a thread per task gets them all done.
  constexpr int kTasks = 16;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<bool> started(kTasks + 1, false);
  started[kTasks] = true;
  std::atomic<int> finished{0};
  {
    TaskThreads threads("test");
    for (int k = 0; k < kTasks; ++k) {
      threads.Run([&, k] {
        std::unique_lock<std::mutex> lock(mu);
        started[k] = true;
        cv.notify_all();
        cv.wait(lock, [&] { return started[k + 1]; });
        ++finished;
      });
    }
    EXPECT_GE(threads.threads(), 1u);
  }  // destruction waits for every task
  EXPECT_EQ(finished.load(), kTasks);
}

TEST(TaskThreadsTest, IdleThreadsAreReused) {
  TaskThreads threads("test");
  for (int k = 0; k < 20; ++k) {
    std::atomic<bool> ran{false};
    threads.Run([&] { ran = true; });
    while (!ran) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // back to idle
  }
  EXPECT_LE(threads.threads(), 3u);  // one, but for a thread descheduled between tasks
}

}  // namespace
}  // namespace gradhub::ddp
