// The Gloo backend: the ProcessGroup conformance suite (process_group_conformance.h) over
// shared memory and over TCP with two channels, each plain and sealed, then what only Gloo
// has: the two allreduce paths agreeing bit for bit, channels, the listen address, and
// choosing shared memory.
// Ranks are threads over an InMemoryStore; failure paths with real processes are in
// process_group_death_test.cc, the NCCL instantiation in tests/gpu.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
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

// Runs `body` on `n` ranks, `missing` of them given a shared-memory directory that does not
// exist (as a missing /dev/shm would be); returns what they logged on stderr.
std::string LogOfRanksWithoutTheirDirectory(
    int n, int missing,
    const std::function<void(int, const std::shared_ptr<ProcessGroup>&)>& body) {
  auto store = std::make_shared<InMemoryStore>();
  ::testing::internal::CaptureStderr();
  spawnThreads(n, [&](int rank) {
    auto options = GlooOptionsFor(rank, n, store);
    if (rank == missing) options.gloo->shared_memory_dir = "/nonexistent-gradhub-shm-dir";
    body(rank, CreateProcessGroup(options));
  });
  return ::testing::internal::GetCapturedStderr();
}

TEST(GlooSharedMemoryTest, SegmentThatCannotBeCreatedFallsBackToTcpAndSaysWhyOnce) {
  // Only rank 0 creates the segment, so only its directory matters.
  const std::string log = LogOfRanksWithoutTheirDirectory(2, 0, [](int rank, const auto& pg) {
    EXPECT_FALSE(UsesSharedMemory(pg)) << "rank " << rank;
    at::Tensor tensor = at::full({7}, 1.5);
    pg->AllReduce(tensor)->Wait();
    EXPECT_TRUE(HasValues(tensor, [](int64_t) { return 3.0; }));
  });
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
// Buffers in shared memory (AllocateCollectiveBuffer): reduced in place, the same results.

bool ReducesInPlace(const std::shared_ptr<ProcessGroup>& pg, const at::Tensor& tensor) {
  return dynamic_cast<GlooProcessGroup&>(*pg).ReducesInPlace(tensor);
}

class SharedMemoryBufferMatchesStagedTest : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(SharedMemoryBufferMatchesStagedTest, BitForBitOnEveryRankForEveryOp) {
  const at::ScalarType type = GetParam();
  const int64_t numel = kMiB / static_cast<int64_t>(c10::elementSize(type)) + 7;
  const std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax,
                                     ReduceOp::kMin};
  for (int n : {2, 3}) {
    SCOPED_TRACE(::testing::Message() << n << " ranks");
    // results[in_place][rank][op]
    std::vector<std::vector<std::vector<at::Tensor>>> results(
        2, std::vector<std::vector<at::Tensor>>(n));
    auto store = std::make_shared<InMemoryStore>();
    spawnThreads(n, [&](int rank) {
      auto pg = CreateProcessGroup(GlooOptionsFor(rank, n, store));
      at::Tensor input = at::empty({numel}, at::TensorOptions().dtype(type));
      FillRandom(input, 2000 + rank);
      // At an offset that is no multiple of 64 bytes, so the sub-slices are not aligned.
      at::Tensor buffer = pg->AllocateCollectiveBuffer(numel + 100, input.options());
      at::Tensor shared = buffer.narrow(0, 37, numel);
      ASSERT_TRUE(ReducesInPlace(pg, shared)) << "rank " << rank;
      for (ReduceOp op : ops) {
        // Staged and in place alternate on the one segment.
        at::Tensor staged = input.clone();
        ASSERT_FALSE(ReducesInPlace(pg, staged));
        pg->AllReduce(staged, op)->Wait();
        results[0][rank].push_back(staged);
        shared.copy_(input);
        pg->AllReduce(shared, op)->Wait();
        results[1][rank].push_back(shared.clone());
      }
    });
    for (size_t k = 0; k < ops.size(); ++k) {
      SCOPED_TRACE(::testing::Message() << "op " << ReduceOpName(ops[k]));
      for (int rank = 0; rank < n; ++rank) {
        EXPECT_TRUE(BitwiseEqual(results[1][rank][k], results[0][0][k])) << "rank " << rank;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, SharedMemoryBufferMatchesStagedTest,
                         ::testing::Values(at::kFloat, at::kDouble, at::kHalf, at::kBFloat16,
                                           at::kLong),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(GlooSharedMemoryBufferTest, LeavesMaxOf64MiBAndATenthOfTheFilesystemToOthers) {
  constexpr uint64_t kGiB = uint64_t{1} << 30;
  // A 64 GiB tmpfs keeps 6.4 GiB.
  EXPECT_TRUE(SharedMemoryBuffers::LeavesRoom(kGiB, 8 * kGiB, 64 * kGiB));
  EXPECT_FALSE(SharedMemoryBuffers::LeavesRoom(2 * kGiB, 8 * kGiB, 64 * kGiB));
  // compose's 1 GiB keeps a tenth; 256 MiB keeps 64 MiB; Docker's default 64 MiB all of it.
  EXPECT_TRUE(SharedMemoryBuffers::LeavesRoom(kGiB - kGiB / 10, kGiB, kGiB));
  EXPECT_FALSE(SharedMemoryBuffers::LeavesRoom(kGiB - kGiB / 10 + 1, kGiB, kGiB));
  EXPECT_TRUE(SharedMemoryBuffers::LeavesRoom(192 * kMiB, 256 * kMiB, 256 * kMiB));
  EXPECT_FALSE(SharedMemoryBuffers::LeavesRoom(192 * kMiB + 1, 256 * kMiB, 256 * kMiB));
  EXPECT_FALSE(SharedMemoryBuffers::LeavesRoom(4096, 64 * kMiB, 64 * kMiB));
  // Less free than the reserve already.
  EXPECT_FALSE(SharedMemoryBuffers::LeavesRoom(0, 32 * kMiB, kGiB));
}

TEST(GlooSharedMemoryBufferTest, IsZeroedAndShapedAsAsked) {
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(2, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptionsFor(rank, 2, store));
    at::Tensor buffer =
        pg->AllocateCollectiveBuffer(1000, at::TensorOptions().dtype(at::kBFloat16));
    EXPECT_EQ(buffer.sizes(), at::IntArrayRef({1000}));
    EXPECT_EQ(buffer.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(ReducesInPlace(pg, buffer));
    EXPECT_EQ(buffer.count_nonzero().item<int64_t>(), 0);
    at::Tensor none = pg->AllocateCollectiveBuffer(0, at::TensorOptions().dtype(at::kFloat));
    EXPECT_EQ(none.numel(), 0);
  });
}

TEST(GlooSharedMemoryBufferTest, AFreedBufferIsNoLongerInSharedMemory) {
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(2, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptionsFor(rank, 2, store));
    at::Tensor buffer = pg->AllocateCollectiveBuffer(kMiB, at::TensorOptions().dtype(at::kFloat));
    void* address = buffer.data_ptr();
    buffer = at::Tensor();
    // Only the address is looked up: nothing reads the unmapped memory.
    EXPECT_FALSE(ReducesInPlace(pg, at::from_blob(address, {kMiB}, at::kFloat)));
    // A private tensor that a later mapping may place there is staged, on both ranks alike.
    at::Tensor tensor = at::full({kMiB}, static_cast<double>(rank + 1));
    pg->AllReduce(tensor)->Wait();
    EXPECT_TRUE(HasValues(tensor, [](int64_t) { return 3.0; }));
  });
}

TEST(GlooSharedMemoryBufferTest, NoFileOutlivesTheAllocation) {
  char pattern[] = "/dev/shm/gradhub_buffer_test_XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(2, [&](int rank) {
    auto options = GlooOptionsFor(rank, 2, store);
    options.gloo->shared_memory_dir = dir;
    auto pg = CreateProcessGroup(options);
    at::Tensor buffer = pg->AllocateCollectiveBuffer(kMiB, at::TensorOptions().dtype(at::kFloat));
    pg->Barrier()->Wait();  // both allocated
    EXPECT_TRUE(std::filesystem::is_empty(dir)) << "rank " << rank;
    buffer.fill_(rank + 1);
    pg->AllReduce(buffer)->Wait();
    EXPECT_TRUE(HasValues(buffer, [](int64_t) { return 3.0; }));
  });
  std::filesystem::remove_all(dir);
}

TEST(GlooSharedMemoryBufferTest, ARankThatCannotMapItKeepsEveryRanksPrivateAndSaysWhyOnce) {
  // Every rank creates its own region; rank 1's directory does not exist (the segments,
  // which rank 0 creates, are unaffected).
  const std::string log = LogOfRanksWithoutTheirDirectory(3, 1, [](int rank, const auto& pg) {
    ASSERT_TRUE(UsesSharedMemory(pg));
    for (int i = 0; i < 2; ++i) {
      at::Tensor buffer = pg->AllocateCollectiveBuffer(kMiB, at::TensorOptions().dtype(at::kFloat));
      EXPECT_FALSE(ReducesInPlace(pg, buffer)) << "rank " << rank;
      buffer.fill_(rank);
      pg->AllReduce(buffer)->Wait();
      EXPECT_TRUE(HasValues(buffer, [](int64_t) { return 3.0; }));
    }
  });
  EXPECT_THAT(log, HasSubstr("process group 'default' rank 0/3: gradient buckets stay in private "
                             "memory (allreduced through the shared-memory segment): rank 1: "
                             "creating /nonexistent-gradhub-shm-dir/gradhub-"));
  EXPECT_EQ(log.find("private memory"), log.rfind("private memory")) << log;
}

TEST(GlooSharedMemoryBufferTest, RanksUnderAnRlimitDataCapKeepThemPrivate) {
  // The cap is the process's, so every rank (a thread here) is under it: far above what the
  // test uses, and restored after.
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_DATA, &saved), 0);
  rlimit capped = saved;
  capped.rlim_cur = rlim_t{1} << 42;
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < capped.rlim_cur) {
    capped.rlim_cur = saved.rlim_max;
  }
  ASSERT_EQ(setrlimit(RLIMIT_DATA, &capped), 0);
  auto store = std::make_shared<InMemoryStore>();
  ::testing::internal::CaptureStderr();
  spawnThreads(2, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptionsFor(rank, 2, store));
    at::Tensor buffer = pg->AllocateCollectiveBuffer(kMiB, at::TensorOptions().dtype(at::kFloat));
    EXPECT_FALSE(ReducesInPlace(pg, buffer)) << "rank " << rank;
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(setrlimit(RLIMIT_DATA, &saved), 0);
  EXPECT_THAT(log, HasSubstr("rank 0: RLIMIT_DATA caps this rank's private memory at "));
  EXPECT_THAT(log, HasSubstr("a buffer in shared memory would escape the cap"));
}

TEST(GlooSharedMemoryBufferTest, RanksThatDisagreeFailNamingBothCallsInsteadOfMixingThem) {
  // Rank 0 reduces its shared buffer in place, rank 1 a private tensor of the same size.
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::string> errors(2);
  spawnThreads(2, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptionsFor(rank, 2, store));
    at::Tensor buffer = pg->AllocateCollectiveBuffer(kMiB, at::TensorOptions().dtype(at::kFloat));
    at::Tensor tensor = rank == 0 ? buffer : at::zeros({kMiB});
    try {
      pg->AllReduce(tensor)->Wait();
    } catch (const CommError& e) {
      errors[rank] = e.what();
    }
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(errors[rank], HasSubstr("another shared-memory allreduce")) << "rank " << rank;
    EXPECT_THAT(errors[rank], HasSubstr("in place, 1048576 elements of 4 bytes"));
    EXPECT_THAT(errors[rank], HasSubstr("staged, 1048576 elements of 4 bytes"));
  }
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
