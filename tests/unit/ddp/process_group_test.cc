// The Gloo backend: the ProcessGroup conformance suite (process_group_conformance.h) over
// shared memory and over TCP with two channels, each plain and sealed, then what only Gloo
// has: the two allreduce paths agreeing bit for bit, channels, the listen address, and
// choosing shared memory.
// Ranks are threads over an InMemoryStore; failure paths with real processes are in
// process_group_death_test.cc, the NCCL instantiation in tests/gpu.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gpu_worker/ddp/comm/gloo/gloo_process_group.h"
#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/store/in_memory_store.h"
#include "tests/unit/ddp/collective_values.h"
#include "tests/unit/ddp/process_group_conformance.h"
#include "tests/unit/ddp/test_ranks.h"

namespace gradhub::ddp {
namespace {

using testing::BitwiseEqual;
using ::testing::HasSubstr;
using testing::HasValues;
using testing::MakeTensor;
using testing::spawnThreads;
using testing::Sum;
using testing::Value;
using Clock = std::chrono::steady_clock;

constexpr int64_t kMiB = 1 << 20;

ProcessGroupBackend GlooBackend(const std::string& name, GlooOptions gloo) {
  ProcessGroupBackend backend;
  backend.name = name;
  backend.unavailable = [] { return std::string(); };
  backend.max_world = [] { return 3; };
  backend.options = [gloo](int, int) {
    ProcessGroupOptions options;
    options.backend = Backend::kGloo;
    options.gloo = gloo;
    return options;
  };
  backend.to_device = [](const at::Tensor& host, int) { return host.clone(); };
  backend.to_host = [](const at::Tensor& tensor) { return tensor; };
  backend.foreign_device = c10::Device(c10::kMeta);
  return backend;
}

GlooOptions TcpTwoChannels() {
  GlooOptions gloo;
  gloo.shared_memory = false;
  gloo.channels = 2;  // back-to-back collectives run on alternate connections
  return gloo;
}

// GlooOptions::encrypt_traffic: every message over TCP sealed (tests of the sealing itself
// are in encrypted_process_group_test.cc).
GlooOptions Sealed(GlooOptions gloo) {
  gloo.encrypt_traffic = true;
  return gloo;
}

INSTANTIATE_TEST_SUITE_P(
    Gloo, ProcessGroupConformanceTest,
    ::testing::Values(GlooBackend("SharedMemory", GlooOptions{}),
                      GlooBackend("TcpTwoChannels", TcpTwoChannels()),
                      GlooBackend("SealedTcpTwoChannels", Sealed(TcpTwoChannels())),
                      GlooBackend("SealedWithSharedMemory", Sealed(GlooOptions{}))),
    ProcessGroupBackendName);

ProcessGroupOptions GlooOptionsFor(int rank, int size, std::shared_ptr<Store> store,
                                   std::string name = "default", bool shared_memory = true) {
  ProcessGroupOptions options;
  options.backend = Backend::kGloo;
  options.rank = rank;
  options.size = size;
  options.store = std::move(store);
  options.name = std::move(name);
  // Short, so that a failing rank leaves its peers waiting seconds, not a minute.
  options.timeout = std::chrono::seconds(30);
  options.gloo.emplace().shared_memory = shared_memory;
  return options;
}

bool UsesSharedMemory(const std::shared_ptr<ProcessGroup>& pg) {
  auto* gloo = dynamic_cast<GlooProcessGroup*>(pg.get());
  return gloo != nullptr && gloo->uses_shared_memory();
}

// Fills `tensor` with reproducible values that are not small integers, so that rounding in
// the reduction shows (in float16 and bfloat16 especially).
void FillRandom(at::Tensor& tensor, int seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  at::Tensor values = at::randn({tensor.numel()}, generator, at::kDouble) * 100;
  if (tensor.scalar_type() == at::kLong) values = values.round();
  tensor.copy_(values);
}

std::string PathName(bool shared_memory) { return shared_memory ? "shm" : "tcp"; }

// ---------------------------------------------------------------------------------------
// Both paths reduce with the same kernels: for two ranks the results are the same bit for
// bit, rounding included, and on every rank; for three, shared memory sums in rank order.
class SharedMemoryMatchesTcpTest : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(SharedMemoryMatchesTcpTest, BitForBitOnEveryRank) {
  const at::ScalarType type = GetParam();
  const int64_t numel = kMiB / static_cast<int64_t>(c10::elementSize(type)) + 7;
  for (int n : {2, 3}) {
    SCOPED_TRACE(::testing::Message() << n << " ranks");
    const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax,
                                       ReduceOp::kMin};
    // results[path][rank][op]
    std::vector<std::vector<std::vector<at::Tensor>>> results(
        2, std::vector<std::vector<at::Tensor>>(n));
    std::vector<at::Tensor> inputs(n);
    auto store = std::make_shared<InMemoryStore>();
    spawnThreads(n, [&](int rank) {
      inputs[rank] = at::empty({numel}, at::TensorOptions().dtype(type));
      FillRandom(inputs[rank], 1000 + rank);
      for (bool shared_memory : {true, false}) {
        auto pg = CreateProcessGroup(
            GlooOptionsFor(rank, n, store, PathName(shared_memory), shared_memory));
        ASSERT_EQ(UsesSharedMemory(pg), shared_memory);
        for (ReduceOp op : ops) {
          at::Tensor tensor = inputs[rank].clone();
          pg->AllReduce(tensor, op)->Wait();
          results[shared_memory][rank].push_back(tensor);
        }
      }
    });
    for (size_t k = 0; k < ops.size(); ++k) {
      SCOPED_TRACE(::testing::Message() << "op " << static_cast<int>(ops[k]));
      for (int rank = 1; rank < n; ++rank) {
        EXPECT_TRUE(BitwiseEqual(results[1][rank][k], results[1][0][k])) << "rank " << rank;
      }
      if (n == 2) {
        EXPECT_TRUE(BitwiseEqual(results[1][0][k], results[0][0][k])) << "shared memory vs TCP";
      }
    }
    // ATen adds float16 and bfloat16 through float too, one rounding per addition.
    at::Tensor sum = inputs[0];
    for (int rank = 1; rank < n; ++rank) sum = sum + inputs[rank];
    EXPECT_TRUE(BitwiseEqual(results[1][0][0], sum));
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, SharedMemoryMatchesTcpTest,
                         ::testing::Values(at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                           at::kLong),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

// ---------------------------------------------------------------------------------------
// 100 MiB: the size of a few gradient buckets; gloo splits it into many segments.

class GlooLargeAllReduceTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(GlooLargeAllReduceTest, Float32SumAndAverage) {
  const int n = std::get<0>(GetParam());
  const bool shared_memory = std::get<1>(GetParam());
  const int64_t numel = 100 * kMiB / 4;
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(n, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptionsFor(rank, n, store, "default", shared_memory));
    at::Tensor tensor = MakeTensor(at::kFloat, numel, [&](int64_t i) { return Value(i, rank, n); });
    pg->AllReduce(tensor, ReduceOp::kSum)->Wait();
    EXPECT_TRUE(HasValues(tensor, [&](int64_t i) { return Sum(i, n); })) << "rank " << rank;
    // Now every rank holds the sums; averaging them gives them back.
    pg->AllReduce(tensor, ReduceOp::kAverage)->Wait();
    EXPECT_TRUE(HasValues(tensor, [&](int64_t i) { return Sum(i, n); })) << "rank " << rank;
  });
}

INSTANTIATE_TEST_SUITE_P(TwoAndThreeRanks, GlooLargeAllReduceTest,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()),
                         [](const auto& info) {
                           return std::to_string(std::get<0>(info.param)) + "ranks_" +
                                  PathName(std::get<1>(info.param));
                         });

class GlooLargeTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooLargeTest, Broadcast100MiBFloat32FromLastRank) {
  const int n = GetParam();
  const int64_t numel = 100 * kMiB / 4;
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(n, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptionsFor(rank, n, store));
    at::Tensor tensor = MakeTensor(at::kFloat, numel, [&](int64_t i) { return Value(i, rank, n); });
    pg->Broadcast({tensor}, n - 1)->Wait();
    EXPECT_TRUE(HasValues(tensor, [&](int64_t i) { return Value(i, n - 1, n); }))
        << "rank " << rank;
  });
}

INSTANTIATE_TEST_SUITE_P(TwoAndThreeRanks, GlooLargeTest, ::testing::Values(2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// ---------------------------------------------------------------------------------------
// Options and the listen address. (Collectives in flight over one and two channels are in
// the conformance suite's two instantiations.)

TEST(GlooProcessGroupTest, RefusesZeroChannelsNamingTheField) {
  auto options = GlooOptionsFor(0, 1, std::make_shared<InMemoryStore>());
  options.gloo->channels = 0;
  try {
    CreateProcessGroup(options);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("options.gloo.channels must be >= 1, got 0"));
  }
}

TEST(GlooProcessGroupTest, DefaultHostnameFallsBackToSomethingPeersReach) {
  // Empty hostname: the machine's name if it resolves and binds, else 127.0.0.1. Either way
  // the ranks must reach each other on this machine.
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(2, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptionsFor(rank, 2, store));
    auto* gloo = dynamic_cast<GlooProcessGroup*>(pg.get());
    ASSERT_NE(gloo, nullptr);
    EXPECT_FALSE(gloo->listen_hostname().empty());
    EXPECT_EQ(gloo->channels(), GlooOptions{}.channels);
    pg->Barrier()->Wait();
  });
}

// ---------------------------------------------------------------------------------------
// Choosing shared memory: every rank on one host and willing, and the segment set up
// everywhere; otherwise every rank uses TCP.

TEST(GlooSharedMemoryTest, UsedByDefaultOnOneHostNotForAWorldOfOne) {
  for (int n : {2, 3}) {
    auto store = std::make_shared<InMemoryStore>();
    spawnThreads(n, [&](int rank) {
      auto pg = CreateProcessGroup(GlooOptionsFor(rank, n, store));
      EXPECT_TRUE(UsesSharedMemory(pg)) << "rank " << rank << " of " << n;
    });
  }
  auto alone = CreateProcessGroup(GlooOptionsFor(0, 1, std::make_shared<InMemoryStore>()));
  EXPECT_FALSE(UsesSharedMemory(alone));
}

TEST(GlooSharedMemoryTest, OneRankWithoutItMakesEveryRankUseTcp) {
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(3, [&](int rank) {
    auto pg =
        CreateProcessGroup(GlooOptionsFor(rank, 3, store, "default", /*shared_memory=*/rank != 1));
    EXPECT_FALSE(UsesSharedMemory(pg)) << "rank " << rank;
    at::Tensor tensor = at::full({kMiB}, static_cast<double>(rank));
    pg->AllReduce(tensor)->Wait();
    EXPECT_TRUE(HasValues(tensor, [](int64_t) { return 3.0; }));
  });
}

TEST(GlooSharedMemoryTest, SegmentThatCannotBeCreatedFallsBackToTcpAndSaysWhyOnce) {
  // Only rank 0 creates the segment, so only its directory matters; one that does not exist
  // fails as a missing /dev/shm would.
  auto store = std::make_shared<InMemoryStore>();
  ::testing::internal::CaptureStderr();
  spawnThreads(2, [&](int rank) {
    auto options = GlooOptionsFor(rank, 2, store);
    if (rank == 0) options.gloo->shared_memory_dir = "/nonexistent-gradhub-shm-dir";
    auto pg = CreateProcessGroup(options);
    EXPECT_FALSE(UsesSharedMemory(pg)) << "rank " << rank;
    at::Tensor tensor = at::full({7}, 1.5);
    pg->AllReduce(tensor)->Wait();
    EXPECT_TRUE(HasValues(tensor, [](int64_t) { return 3.0; }));
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("process group 'default' rank 0/2: shared-memory allreduce "
                             "unavailable, using TCP: rank 0: creating "
                             "/nonexistent-gradhub-shm-dir/gradhub-"));
  EXPECT_THAT(log, HasSubstr("No such file or directory"));
  EXPECT_EQ(log.find("using TCP"), log.rfind("using TCP")) << "logged more than once: " << log;
}

TEST(GlooSharedMemoryTest, NoSegmentFileOutlivesConstruction) {
  // A directory of its own (on /dev/shm, a tmpfs like in production), so other test
  // processes' segments cannot show up in it.
  char pattern[] = "/dev/shm/gradhub_pg_test_XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(2, [&](int rank) {
    auto options = GlooOptionsFor(rank, 2, store);
    options.gloo->shared_memory_dir = dir;
    options.gloo->channels = 2;  // a segment per channel
    auto pg = CreateProcessGroup(options);
    EXPECT_TRUE(UsesSharedMemory(pg)) << "rank " << rank;
    pg->Barrier()->Wait();  // both constructed
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << "rank " << rank;
    std::vector<at::Tensor> tensors = {at::ones({kMiB}), at::ones({kMiB})};
    auto first = pg->AllReduce(tensors[0]);   // channel 0
    auto second = pg->AllReduce(tensors[1]);  // channel 1
    first->Wait();
    second->Wait();
    EXPECT_TRUE(HasValues(tensors[0], [](int64_t) { return 2.0; }));
    EXPECT_TRUE(HasValues(tensors[1], [](int64_t) { return 2.0; }));
  });
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------------------
// NCCL where this build or machine lacks it.

TEST(NcclProcessGroupTest, RefusedInABuildWithoutNcclOrWithoutAGpu) {
  // Where NCCL and a GPU are both here, tests/gpu's nccl_process_group_test runs the suite.
  ProcessGroupOptions options;
  options.backend = Backend::kNccl;
  options.store = std::make_shared<InMemoryStore>();
  options.name = "nccl-refused";
  std::shared_ptr<ProcessGroup> group;
  try {
    group = CreateProcessGroup(options);
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("process group 'nccl-refused' rank 0/1"));
    EXPECT_THAT(e.what(), ::testing::AnyOf(HasSubstr("no NCCL"), HasSubstr("none is visible")));
  }
  if (group != nullptr) GTEST_SKIP() << "NCCL and a GPU are usable here";
}

}  // namespace
}  // namespace gradhub::ddp
