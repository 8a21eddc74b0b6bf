// The contract of gpu_worker/ddp/comm/process_group.h as one test suite that every backend
// runs (as store_conformance.h does for stores). A backend's test binary instantiates it:
//
//   INSTANTIATE_TEST_SUITE_P(Gloo, ProcessGroupConformanceTest,
//                            ::testing::Values(ProcessGroupBackend{...}),
//                            ProcessGroupBackendName);
//
// Ranks run as threads of the test process, each with its own group, over one InMemoryStore
// per test (gloo's test/base_test.h). A test that needs more ranks than the backend can run
// here (NCCL: one GPU per rank) is skipped with the reason, as is every test when the backend
// cannot run at all (no GPU). This header defines the tests: include it in exactly one .cc of
// a test binary.
//
// What it covers: every collective (allreduce with every op and dtype, broadcast from every
// root and of several tensors, allgather into separate and adjacent outputs, barrier; send and
// recv both ways and between collectives, their descriptions and refusals), sizes
// 0 to 1 MiB, collectives in flight at once and issued from another thread, Work (times,
// callbacks, description, Wait with a timeout), subgroups, refused tensors and options (each
// naming the op or field), a rendezvous or a collective whose peer never comes (a CommError
// within the timeout, and a group broken for good), and destruction with work outstanding.
#pragma once

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/store/in_memory_store.h"
#include "tests/unit/ddp/collective_values.h"
#include "tests/unit/ddp/test_ranks.h"

namespace gradhub::ddp {

struct ProcessGroupBackend {
  std::string name;  // The test name suffix: letters, digits, '_'.
  // Why the backend cannot run here at all (e.g. "no GPU visible"), or "".
  std::function<std::string()> unavailable;
  // The most ranks it runs here as threads of one process.
  std::function<int()> max_world;
  // The options of `rank` of `size`: the backend and its own settings. The suite sets rank,
  // size, store, name and timeout over them.
  std::function<ProcessGroupOptions(int rank, int size)> options;
  // A copy of the host tensor where rank `rank`'s group takes its tensors, and back.
  std::function<at::Tensor(const at::Tensor& host, int rank)> to_device;
  std::function<at::Tensor(const at::Tensor& tensor)> to_host;
  // A device whose tensors the backend refuses.
  c10::Device foreign_device = c10::Device(c10::kMeta);
};

inline void PrintTo(const ProcessGroupBackend& backend, std::ostream* os) { *os << backend.name; }

inline std::string ProcessGroupBackendName(
    const ::testing::TestParamInfo<ProcessGroupBackend>& info) {
  return info.param.name;
}

class ProcessGroupConformanceTest : public ::testing::TestWithParam<ProcessGroupBackend> {
 protected:
  // Long enough for a loaded machine; a rank that fails leaves its peers waiting this long.
  static constexpr std::chrono::milliseconds kTimeout = std::chrono::seconds(30);
  static constexpr int64_t kMiB = 1 << 20;

  void SetUp() override {
    const std::string reason = backend().unavailable();
    if (!reason.empty()) GTEST_SKIP() << GetParam().name << " cannot run here: " << reason;
    store_ = std::make_shared<InMemoryStore>();
  }

  const ProcessGroupBackend& backend() const { return GetParam(); }
  int max_world() const { return backend().max_world(); }

  // The worlds of 1 to 3 ranks that the backend runs here.
  std::vector<int> Worlds() const {
    std::vector<int> worlds;
    for (int n = 1; n <= std::min(3, max_world()); ++n) worlds.push_back(n);
    return worlds;
  }

  // Why a test of `world` ranks cannot run here, or "".
  std::string WhyNot(int world) const {
    if (world <= max_world()) return "";
    return backend().name + " runs " + std::to_string(max_world()) +
           " rank(s) here; this test needs " + std::to_string(world);
  }

  ProcessGroupOptions Options(int rank, int size, const std::string& name = "default") const {
    ProcessGroupOptions options = backend().options(rank, size);
    options.rank = rank;
    options.size = size;
    options.store = store_;
    options.name = name;
    options.timeout = kTimeout;
    return options;
  }

  // Runs fn(rank, group) for `world` ranks, each on its own thread with its own group.
  void OnRanks(int world, const std::string& name,
               const std::function<void(int rank, ProcessGroup& group)>& fn) {
    testing::spawnThreads(world, [&](int rank) {
      auto group = CreateProcessGroup(Options(rank, world, name));
      fn(rank, *group);
    });
  }

  at::Tensor OnDevice(const at::Tensor& host, int rank) const {
    return backend().to_device(host, rank);
  }
  at::Tensor OnHost(const at::Tensor& tensor) const { return backend().to_host(tensor); }

  // A tensor of rank `rank` in a world of n on its device: element i is Value(i, rank, n).
  at::Tensor RankTensor(at::ScalarType type, int64_t numel, int rank, int n) const {
    return OnDevice(
        testing::MakeTensor(type, numel, [&](int64_t i) { return testing::Value(i, rank, n); }),
        rank);
  }

  std::shared_ptr<InMemoryStore> store_;
};

inline const std::vector<at::ScalarType>& SupportedDtypes() {
  static const std::vector<at::ScalarType> types = {at::kFloat, at::kDouble, at::kHalf,
                                                    at::kBFloat16, at::kLong};
  return types;
}

// The message of the std::invalid_argument that fn throws ("" and a failure if none).
template <typename Fn>
std::string InvalidArgumentOf(Fn&& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected std::invalid_argument";
  return "";
}

// ---------------------------------------------------------------------------------------
// Results.

TEST_P(ProcessGroupConformanceTest, AllReduceEveryOpAndDtype) {
  using namespace gradhub::ddp::testing;
  for (int n : Worlds()) {
    OnRanks(n, "w" + std::to_string(n), [&](int rank, ProcessGroup& group) {
      for (at::ScalarType type : SupportedDtypes()) {
        const int64_t element = c10::elementSize(type);
        // 1 MiB + 7 elements: in shared memory, two full chunks and a ragged one.
        for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, kMiB / element + 7}) {
          SCOPED_TRACE(::testing::Message() << n << " ranks, rank " << rank << ", " << type << ", "
                                            << numel << " elements");
          at::Tensor sum = RankTensor(type, numel, rank, n);
          group.AllReduce(sum, ReduceOp::kSum)->Wait();
          EXPECT_TRUE(HasValues(OnHost(sum), [&](int64_t i) { return Sum(i, n); }));
          at::Tensor average = RankTensor(type, numel, rank, n);
          group.AllReduce(average, ReduceOp::kAverage)->Wait();
          EXPECT_TRUE(HasValues(OnHost(average), [&](int64_t i) { return Sum(i, n) / n; }));
          at::Tensor max = RankTensor(type, numel, rank, n);
          group.AllReduce(max, ReduceOp::kMax)->Wait();
          EXPECT_TRUE(HasValues(OnHost(max), [&](int64_t i) { return Max(i, n); }));
          at::Tensor min = RankTensor(type, numel, rank, n);
          group.AllReduce(min, ReduceOp::kMin)->Wait();
          EXPECT_TRUE(HasValues(OnHost(min), [&](int64_t i) { return Min(i, n); }));
        }
      }
    });
  }
}

TEST_P(ProcessGroupConformanceTest, BroadcastFromEveryRoot) {
  using namespace gradhub::ddp::testing;
  for (int n : Worlds()) {
    OnRanks(n, "w" + std::to_string(n), [&](int rank, ProcessGroup& group) {
      for (at::ScalarType type : SupportedDtypes()) {
        for (int root = 0; root < n; ++root) {
          for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, kMiB / 4}) {
            SCOPED_TRACE(::testing::Message() << n << " ranks, rank " << rank << ", root " << root
                                              << ", " << type << ", " << numel << " elements");
            at::Tensor tensor = RankTensor(type, numel, rank, n);
            group.Broadcast({tensor}, root)->Wait();
            EXPECT_TRUE(HasValues(OnHost(tensor), [&](int64_t i) { return Value(i, root, n); }));
          }
        }
      }
    });
  }
}

TEST_P(ProcessGroupConformanceTest, BroadcastOfSeveralTensorsOfMixedDtypes) {
  using namespace gradhub::ddp::testing;
  const int n = Worlds().back();
  OnRanks(n, "mixed", [&](int rank, ProcessGroup& group) {
    std::vector<at::Tensor> tensors = {
        RankTensor(at::kFloat, 5, rank, n), RankTensor(at::kLong, 0, rank, n),
        RankTensor(at::kHalf, 3, rank, n), RankTensor(at::kDouble, 1000, rank, n)};
    const int root = n - 1;
    group.Broadcast(tensors, root)->Wait();
    for (const auto& tensor : tensors) {
      EXPECT_TRUE(HasValues(OnHost(tensor), [&](int64_t i) { return Value(i, root, n); }))
          << "rank " << rank << " " << tensor.scalar_type();
    }
  });
}

TEST_P(ProcessGroupConformanceTest, AllGatherIntoSeparateAndAdjacentOutputs) {
  using namespace gradhub::ddp::testing;
  for (int n : Worlds()) {
    OnRanks(n, "w" + std::to_string(n), [&](int rank, ProcessGroup& group) {
      for (at::ScalarType type : SupportedDtypes()) {
        for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, kMiB / 4}) {
          SCOPED_TRACE(::testing::Message() << n << " ranks, rank " << rank << ", " << type << ", "
                                            << numel << " elements");
          at::Tensor input = RankTensor(type, numel, rank, n);
          const at::Tensor zeros = at::zeros({numel}, at::TensorOptions().dtype(type));
          std::vector<at::Tensor> separate;
          for (int r = 0; r < n; ++r) separate.push_back(OnDevice(zeros, rank));
          group.AllGather(separate, input)->Wait();
          for (int r = 0; r < n; ++r) {
            EXPECT_TRUE(HasValues(OnHost(separate[r]), [&](int64_t i) { return Value(i, r, n); }))
                << "outputs[" << r << "]";
          }
          // Slices of one flat tensor: gathered into it directly.
          at::Tensor flat = OnDevice(at::zeros({n, numel}, at::TensorOptions().dtype(type)), rank);
          std::vector<at::Tensor> rows;
          for (int r = 0; r < n; ++r) rows.push_back(flat.select(0, r));
          group.AllGather(rows, input)->Wait();
          for (int r = 0; r < n; ++r) {
            EXPECT_TRUE(HasValues(OnHost(rows[r]), [&](int64_t i) { return Value(i, r, n); }))
                << "row " << r;
          }
        }
      }
    });
  }
}

TEST_P(ProcessGroupConformanceTest, EmptyCollectivesCompleteAtOnceAndKeepTheGroupInStep) {
  using namespace gradhub::ddp::testing;
  const int n = Worlds().back();
  OnRanks(n, "empty", [&](int rank, ProcessGroup& group) {
    at::Tensor empty = RankTensor(at::kFloat, 0, rank, n);
    EXPECT_TRUE(group.AllReduce(empty)->IsCompleted());
    EXPECT_TRUE(group.Broadcast({empty}, n - 1)->IsCompleted());
    std::vector<at::Tensor> outputs;
    for (int r = 0; r < n; ++r) outputs.push_back(RankTensor(at::kFloat, 0, rank, n));
    EXPECT_TRUE(group.AllGather(outputs, empty)->IsCompleted());
    at::Tensor one = RankTensor(at::kFloat, 3, rank, n);
    auto work = group.AllReduce(one);
    work->Wait();
    EXPECT_THAT(work->description(), ::testing::HasSubstr("allreduce #3 "));
    EXPECT_TRUE(HasValues(OnHost(one), [&](int64_t i) { return Sum(i, n); }));
  });
}

// ---------------------------------------------------------------------------------------
// Order, concurrency and Work.

TEST_P(ProcessGroupConformanceTest, CollectivesInFlightAtOnceKeepTheirOwnResults) {
  using namespace gradhub::ddp::testing;
  const int n = Worlds().back();
  OnRanks(n, "in-flight", [&](int rank, ProcessGroup& group) {
    std::vector<at::Tensor> tensors;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 8; ++k) {
      // Different sizes and values per bucket, so a mix-up between them shows.
      const int64_t numel = (k % 2 == 0) ? 1000 * (k + 1) : kMiB / 4;
      tensors.push_back(OnDevice(
          MakeTensor(at::kFloat, numel, [&](int64_t i) { return Value(i + k, rank, n) + k; }),
          rank));
      works.push_back(group.AllReduce(tensors.back()));
    }
    for (int k = 0; k < 8; ++k) {
      works[k]->Wait();
      EXPECT_TRUE(HasValues(OnHost(tensors[k]), [&](int64_t i) { return Sum(i + k, n) + n * k; }))
          << "bucket " << k << " on rank " << rank;
    }
  });
}

TEST_P(ProcessGroupConformanceTest, BarrierCompletesAfterEarlierCollectives) {
  const int n = Worlds().back();
  OnRanks(n, "barrier", [&](int rank, ProcessGroup& group) {
    std::vector<at::Tensor> tensors;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 4; ++k) {
      tensors.push_back(RankTensor(at::kFloat, kMiB, rank, n));
      works.push_back(group.AllReduce(tensors.back()));
    }
    auto barrier = group.Barrier();
    barrier->Wait();
    for (int k = 0; k < 4; ++k) {
      EXPECT_TRUE(works[k]->IsCompleted()) << "allreduce " << k << " on rank " << rank;
      EXPECT_LE(works[k]->end_time(), barrier->end_time());
    }
  });
}

TEST_P(ProcessGroupConformanceTest, BarrierWaitsForTheLateRank) {
  const int n = Worlds().back();
  if (n < 2) GTEST_SKIP() << WhyNot(2);
  constexpr auto kLate = std::chrono::milliseconds(400);
  std::vector<double> waited_ms(n);
  OnRanks(n, "late", [&](int rank, ProcessGroup& group) {
    group.Barrier()->Wait();  // everyone connected and in step
    if (rank == n - 1) std::this_thread::sleep_for(kLate);
    const auto start = std::chrono::steady_clock::now();
    group.Barrier()->Wait();
    waited_ms[rank] =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  });
  // The punctual ranks waited for the late one (minus a little scheduling slack); it did not.
  for (int r = 0; r + 1 < n; ++r) EXPECT_GE(waited_ms[r], kLate.count() * 0.75) << "rank " << r;
  EXPECT_LT(waited_ms[n - 1], kLate.count() * 0.5);
}

TEST_P(ProcessGroupConformanceTest, CollectivesMayBeIssuedFromAnotherThread) {
  using namespace gradhub::ddp::testing;
  const int n = Worlds().back();
  OnRanks(n, "threads", [&](int rank, ProcessGroup& group) {
    at::Tensor tensor = RankTensor(at::kFloat, 100, rank, n);
    std::shared_ptr<Work> work;
    std::thread([&] { work = group.AllReduce(tensor); }).join();
    work->Wait();
    EXPECT_TRUE(HasValues(OnHost(tensor), [&](int64_t i) { return Sum(i, n); }));
  });
}

TEST_P(ProcessGroupConformanceTest, WorkReportsTimesDescriptionAndRunsCallbacks) {
  const int n = Worlds().back();
  OnRanks(n, "work", [&](int rank, ProcessGroup& group) {
    at::Tensor tensor = RankTensor(at::kFloat, kMiB, rank, n);
    const auto issued = Work::Clock::now();
    auto work = group.AllReduce(tensor);
    std::atomic<bool> called{false};
    work->OnCompletion([&] { called = true; });
    work->Wait();
    EXPECT_TRUE(called.load());
    EXPECT_TRUE(work->IsCompleted());
    EXPECT_GE(work->start_time(), issued);
    EXPECT_GE(work->end_time(), work->start_time());
    EXPECT_EQ(work->error(), nullptr);
    EXPECT_THAT(work->description(),
                ::testing::HasSubstr("allreduce #0 (float32, 1048576 elements, sum) in group "
                                     "'work' rank " +
                                     std::to_string(rank) + "/" + std::to_string(n)));
    // Completed: a callback added now runs at once.
    bool late = false;
    work->OnCompletion([&] { late = true; });
    EXPECT_TRUE(late);
  });
}

TEST_P(ProcessGroupConformanceTest, WaitShorterThanTheCollectiveThrowsWhileItGoesOn) {
  using namespace gradhub::ddp::testing;
  if (!WhyNot(2).empty()) GTEST_SKIP() << WhyNot(2);
  OnRanks(2, "short-wait", [&](int rank, ProcessGroup& group) {
    at::Tensor tensor = RankTensor(at::kFloat, 1000, rank, 2);
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto work = group.AllReduce(tensor);
    if (rank == 0) {
      try {
        work->Wait(std::chrono::milliseconds(50));
        ADD_FAILURE() << "Wait(50 ms) returned while the peer was 300 ms late";
      } catch (const CommError& e) {
        EXPECT_THAT(e.what(), ::testing::HasSubstr("not completed after 50 ms"));
      }
    }
    work->Wait();
    EXPECT_TRUE(HasValues(OnHost(tensor), [&](int64_t i) { return Sum(i, 2); }));
  });
}

TEST_P(ProcessGroupConformanceTest, DestroyingTheGroupCompletesOutstandingWork) {
  const int n = Worlds().back();
  std::vector<std::shared_ptr<Work>> works(n);
  testing::spawnThreads(n, [&](int rank) {
    auto group = CreateProcessGroup(Options(rank, n, "destroyed"));
    at::Tensor tensor = RankTensor(at::kFloat, kMiB, rank, n);
    works[rank] = group->AllReduce(tensor);
    group.reset();  // without waiting
    EXPECT_TRUE(works[rank]->IsCompleted()) << "rank " << rank;
    EXPECT_EQ(works[rank]->error(), nullptr) << "rank " << rank;
  });
}

// ---------------------------------------------------------------------------------------
// Subgroups.

TEST_P(ProcessGroupConformanceTest, SubgroupOfRanksZeroAndTwo) {
  using namespace gradhub::ddp::testing;
  if (!WhyNot(3).empty()) GTEST_SKIP() << WhyNot(3);
  testing::spawnThreads(3, [&](int rank) {
    const ProcessGroupOptions parent = Options(rank, 3);
    auto world = CreateProcessGroup(parent);
    auto sub = CreateSubgroup(parent, {0, 2});
    if (rank == 1) {
      EXPECT_EQ(sub, nullptr);
    } else {
      ASSERT_NE(sub, nullptr);
      EXPECT_EQ(sub->rank(), rank == 0 ? 0 : 1);
      EXPECT_EQ(sub->size(), 2);
      EXPECT_EQ(sub->name(), "default/sub-0-2");
      at::Tensor tensor = OnDevice(at::full({7}, static_cast<double>(10 + rank)), rank);
      sub->AllReduce(tensor)->Wait();
      EXPECT_TRUE(HasValues(OnHost(tensor), [](int64_t) { return 10.0 + 12.0; }));
    }
    // The parent is unaffected and still spans everyone.
    at::Tensor all = OnDevice(at::full({3}, static_cast<double>(rank)), rank);
    world->AllReduce(all)->Wait();
    EXPECT_TRUE(HasValues(OnHost(all), [](int64_t) { return 0.0 + 1.0 + 2.0; }));
  });
}

TEST_P(ProcessGroupConformanceTest, SubgroupRefusesUnsortedOrOutOfRangeRanks) {
  const ProcessGroupOptions parent = Options(0, 3);
  EXPECT_THROW(CreateSubgroup(parent, {2, 0}), std::invalid_argument);
  EXPECT_THROW(CreateSubgroup(parent, {0, 0}), std::invalid_argument);
  EXPECT_THROW(CreateSubgroup(parent, {0, 3}), std::invalid_argument);
  EXPECT_THROW(CreateSubgroup(parent, {}), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------
// Refusals: thrown at the call, naming the op and the operand or the field. A refused
// collective takes no sequence number, so the group stays in step.

TEST_P(ProcessGroupConformanceTest, RefusesBadTensorsNamingTheOpAndOperand) {
  using ::testing::HasSubstr;
  const int n = Worlds().back();
  OnRanks(n, "refused", [&](int rank, ProcessGroup& group) {
    const at::Tensor ok = RankTensor(at::kFloat, 2, rank, n);
    const at::Tensor int8 = OnDevice(at::ones({4}, at::kChar), rank);
    const at::Tensor boolean = OnDevice(at::ones({4}, at::kBool), rank);
    const at::Tensor transposed = OnDevice(at::ones({4, 3}), rank).t();
    const at::Tensor foreign = at::empty({2}, at::TensorOptions().device(backend().foreign_device));
    auto refused = [&](auto&& call, const std::vector<std::string>& parts) {
      const std::string message = InvalidArgumentOf(call);
      for (const std::string& part : parts) EXPECT_THAT(message, HasSubstr(part));
    };
    refused([&] { group.AllReduce(int8); }, {"allreduce", "tensor has unsupported dtype int8"});
    refused([&] { group.AllReduce(boolean); }, {"allreduce", "unsupported dtype bool"});
    refused([&] { group.AllReduce(transposed); }, {"allreduce", "tensor is not contiguous"});
    refused([&] { group.AllReduce(at::Tensor()); }, {"allreduce", "tensor is undefined"});
    refused([&] { group.AllReduce(foreign); }, {"allreduce", "tensor is on ", "needs tensors on"});
    refused(
        [&] {
          group.Broadcast({ok, transposed}, 0);
        },
        {"broadcast", "tensors[1] is not contiguous"});
    refused([&] { group.Broadcast({ok}, n); }, {"broadcast", "root " + std::to_string(n)});
    refused([&] { group.Broadcast({ok}, -1); }, {"broadcast", "root -1 is not in [0, "});
    std::vector<at::Tensor> too_few(n - 1, ok);
    refused([&] { group.AllGather(too_few, ok); }, {"allgather", "expected one per rank"});
    std::vector<at::Tensor> outputs(n, ok);
    outputs.back() = RankTensor(at::kFloat, 3, rank, n);
    refused([&] { group.AllGather(outputs, ok); },
            {"allgather", "outputs[" + std::to_string(n - 1) + "] has shape [3]"});
    outputs.back() = RankTensor(at::kDouble, 2, rank, n);
    refused([&] { group.AllGather(outputs, ok); }, {"has dtype float64, input has float32"});
    refused([&] { group.AllGather(std::vector<at::Tensor>(n, int8), int8); },
            {"allgather", "input has unsupported dtype int8"});
    // Still in step: the first collective that ran is #0 on every rank.
    at::Tensor tensor = RankTensor(at::kFloat, 3, rank, n);
    auto work = group.AllReduce(tensor);
    work->Wait();
    EXPECT_THAT(work->description(), HasSubstr("allreduce #0"));
    EXPECT_TRUE(testing::HasValues(OnHost(tensor), [&](int64_t i) { return testing::Sum(i, n); }));
  });
}

TEST_P(ProcessGroupConformanceTest, RefusesBadOptionsNamingTheField) {
  using ::testing::HasSubstr;
  auto refused = [&](ProcessGroupOptions options, const std::string& field) {
    const std::string message = InvalidArgumentOf([&] { CreateProcessGroup(options); });
    EXPECT_THAT(message, HasSubstr(field));
  };
  ProcessGroupOptions options = Options(0, 2);
  options.rank = 2;
  refused(options, "options.rank 2 is not in [0, 2)");
  options = Options(0, 2);
  options.rank = -1;
  refused(options, "options.rank -1");
  options = Options(0, 2);
  options.size = 0;
  refused(options, "options.size must be >= 1, got 0");
  options = Options(0, 2);
  options.store = nullptr;
  refused(options, "options.store is null");
  options = Options(0, 2);
  options.timeout = std::chrono::milliseconds(0);
  refused(options, "options.timeout must be positive");
  options = Options(0, 2);
  options.name = "";
  refused(options, "options.name is empty");
  // The other backend's settings are refused, not ignored.
  options = Options(0, 2);
  if (options.backend == Backend::kGloo) {
    options.nccl = NcclOptions{};
    refused(options, "options.nccl is set, but the backend is gloo");
  } else {
    options.gloo = GlooOptions{};
    refused(options,
            "options.gloo is set, but the backend is " + std::string(BackendName(options.backend)));
  }
}

// ---------------------------------------------------------------------------------------
// Point to point, posted in an order every backend runs (NCCL runs a rank's ops in issue
// order on one stream; the orders only Gloo allows are in p2p_test.cc).

TEST_P(ProcessGroupConformanceTest, SendAndRecvEveryDtypeAndSizeBothWays) {
  using namespace gradhub::ddp::testing;
  if (!WhyNot(2).empty()) GTEST_SKIP() << WhyNot(2);
  OnRanks(2, "p2p", [&](int rank, ProcessGroup& group) {
    for (at::ScalarType type : SupportedDtypes()) {
      const int64_t element = c10::elementSize(type);
      for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, kMiB / element + 7}) {
        SCOPED_TRACE(::testing::Message()
                     << "rank " << rank << ", " << type << ", " << numel << " elements");
        // Rank 0 sends first and then receives; rank 1 the other way round.
        for (int sender : {0, 1}) {
          const uint32_t tag = static_cast<uint32_t>(numel + sender);
          if (rank == sender) {
            group.Send(RankTensor(type, numel, rank, 2), 1 - rank, tag)->Wait();
          } else {
            at::Tensor got = OnDevice(at::zeros({numel}, at::TensorOptions().dtype(type)), rank);
            group.Recv(got, sender, tag)->Wait();
            EXPECT_TRUE(HasValues(OnHost(got), [&](int64_t i) { return Value(i, sender, 2); }));
          }
        }
      }
    }
  });
}

TEST_P(ProcessGroupConformanceTest, SendAndRecvBetweenCollectivesInTheSameOrder) {
  using namespace gradhub::ddp::testing;
  if (!WhyNot(2).empty()) GTEST_SKIP() << WhyNot(2);
  OnRanks(2, "p2p-mixed", [&](int rank, ProcessGroup& group) {
    for (int round = 0; round < 3; ++round) {
      at::Tensor reduced = RankTensor(at::kFloat, 1000, rank, 2);
      auto allreduce = group.AllReduce(reduced);
      at::Tensor message = RankTensor(at::kDouble, 5000, rank, 2);
      auto transfer = rank == 0 ? group.Send(message, 1, 7) : group.Recv(message, 0, 7);
      at::Tensor broadcast = RankTensor(at::kLong, 10, rank, 2);
      auto after = group.Broadcast({broadcast}, 1);
      allreduce->Wait();
      transfer->Wait();
      after->Wait();
      EXPECT_TRUE(HasValues(OnHost(reduced), [&](int64_t i) { return Sum(i, 2); }));
      EXPECT_TRUE(HasValues(OnHost(message), [&](int64_t i) { return Value(i, 0, 2); }));
      EXPECT_TRUE(HasValues(OnHost(broadcast), [&](int64_t i) { return Value(i, 1, 2); }));
    }
  });
}

TEST_P(ProcessGroupConformanceTest, SendAndRecvNameThePeerAndTagAndRefuseBadPeers) {
  using ::testing::HasSubstr;
  if (!WhyNot(2).empty()) GTEST_SKIP() << WhyNot(2);
  OnRanks(2, "p2p-named", [&](int rank, ProcessGroup& group) {
    const at::Tensor ok = RankTensor(at::kFloat, 4, rank, 2);
    const std::string me = std::to_string(rank);
    EXPECT_THAT(
        InvalidArgumentOf([&] { group.Send(ok, rank, 0); }),
        HasSubstr("send in group 'p2p-named' rank " + me + "/2: dst " + me + " is this rank"));
    EXPECT_THAT(InvalidArgumentOf([&] { group.Recv(ok, 2, 0); }),
                HasSubstr("recv in group 'p2p-named' rank " + me + "/2: src 2 is not in [0, 2)"));
    EXPECT_THAT(InvalidArgumentOf([&] { group.Send(ok, -1, 0); }), HasSubstr("dst -1"));
    EXPECT_THAT(InvalidArgumentOf(
                    [&] { group.Recv(OnDevice(at::ones({4}, at::kChar), rank), 1 - rank, 0); }),
                HasSubstr("recv in group 'p2p-named' rank " + me +
                          "/2: tensor has unsupported dtype int8"));
    // Refused calls take no number: the first transfer of each side is #0.
    auto work = rank == 0 ? group.Send(ok, 1, 42) : group.Recv(ok.clone(), 0, 42);
    work->Wait();
    EXPECT_THAT(work->description(),
                HasSubstr(rank == 0 ? "send #0 (float32, 4 elements, to rank 1, tag 42) in group "
                                      "'p2p-named' rank 0/2"
                                    : "recv #0 (float32, 4 elements, from rank 0, tag 42) in "
                                      "group 'p2p-named' rank 1/2"));
  });
}

// ---------------------------------------------------------------------------------------
// Failures: a peer that never comes ends in a CommError within the timeout.

TEST_P(ProcessGroupConformanceTest, RendezvousFailsWithinTheTimeoutWhenAPeerNeverArrives) {
  constexpr auto kShort = std::chrono::milliseconds(300);
  for (int rank : {0, 1}) {  // rank 1 of 2 alone, then rank 0 of 2 alone
    ProcessGroupOptions options = Options(rank, 2, "lonely-" + std::to_string(rank));
    options.timeout = kShort;
    const auto start = std::chrono::steady_clock::now();
    try {
      CreateProcessGroup(options);
      ADD_FAILURE() << "rank " << rank << " of 2 alone joined a group";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("process group 'lonely-" + std::to_string(rank) +
                                                 "' rank " + std::to_string(rank) + "/2"));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GE(seconds, 0.25) << "rank " << rank;
    EXPECT_LT(seconds, 10.0) << "rank " << rank;
  }
}

TEST_P(ProcessGroupConformanceTest, PeerThatNeverJoinsFailsTheCollectiveAndBreaksTheGroup) {
  using ::testing::HasSubstr;
  if (!WhyNot(2).empty()) GTEST_SKIP() << WhyNot(2);
  std::atomic<bool> survivor_done{false};
  testing::spawnThreads(2, [&](int rank) {
    ProcessGroupOptions options = Options(rank, 2, "abandoned");
    options.timeout = std::chrono::milliseconds(500);
    auto group = CreateProcessGroup(options);
    if (rank == 1) {  // alive, but never joins the allreduce
      while (!survivor_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    auto work = group->AllReduce(RankTensor(at::kFloat, kMiB, 0, 2));
    try {
      work->Wait(std::chrono::seconds(10));
      ADD_FAILURE() << "allreduce without its peer completed";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("allreduce #0 (float32, 1048576 elements, sum) in group "
                                      "'abandoned' rank 0/2"));
      EXPECT_THAT(e.what(), HasSubstr("timed out after 500 ms"));
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_GE(seconds, 0.45);
    EXPECT_LT(seconds, 5.0);
    try {
      group->AllReduce(RankTensor(at::kFloat, 3, 0, 2))->Wait();
      ADD_FAILURE() << "a broken group ran an allreduce";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("allreduce #1"));
      EXPECT_THAT(e.what(), HasSubstr("unusable after an earlier failure"));
    }
    survivor_done = true;
  });
}

}  // namespace gradhub::ddp
