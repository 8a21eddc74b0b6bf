// ProcessGroup backends: collective correctness (ranks as threads over an InMemoryStore),
// argument errors, subgroups, and the NCCL backend on one GPU where there is one.
// Failure paths with real processes are in process_group_death_test.cc.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gpu_worker/ddp/comm/gloo/gloo_process_group.h"
#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/store/in_memory_store.h"
#include "gpu_worker/devices/devices.h"
#include "gradhub/build_config.h"
#include "tests/unit/ddp/test_ranks.h"

#if GRADHUB_HAVE_NCCL
#include <cuda_runtime.h>
#endif

namespace gradhub::ddp {
namespace {

using ::testing::HasSubstr;
using testing::spawnThreads;
using Clock = std::chrono::steady_clock;

constexpr int64_t kMiB = 1 << 20;

ProcessGroupOptions GlooOptions(int rank, int size, std::shared_ptr<Store> store,
                                std::string name = "default", bool shared_memory = true) {
  ProcessGroupOptions options;
  options.backend = Backend::kGloo;
  options.rank = rank;
  options.size = size;
  options.store = std::move(store);
  options.name = std::move(name);
  // Short, so that a failing rank leaves its peers waiting seconds, not a minute.
  options.timeout = std::chrono::seconds(30);
  options.shared_memory = shared_memory;
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

bool BitwiseEqual(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

double ToDouble(float v) { return v; }
double ToDouble(double v) { return v; }
double ToDouble(int64_t v) { return static_cast<double>(v); }
double ToDouble(at::Half v) { return static_cast<float>(v); }
double ToDouble(at::BFloat16 v) { return static_cast<float>(v); }

// Calls fn(T{}) with the C++ type of a supported dtype.
template <typename Fn>
void VisitType(at::ScalarType type, Fn&& fn) {
  switch (type) {
    case at::kFloat:
      fn(float{});
      return;
    case at::kDouble:
      fn(double{});
      return;
    case at::kHalf:
      fn(at::Half{});
      return;
    case at::kBFloat16:
      fn(at::BFloat16{});
      return;
    case at::kLong:
      fn(int64_t{});
      return;
    default:
      FAIL() << "test does not handle dtype " << type;
  }
}

template <typename Fn>
at::Tensor MakeTensor(at::ScalarType type, int64_t numel, Fn value) {
  at::Tensor tensor = at::empty({numel}, at::TensorOptions().dtype(type));
  VisitType(type, [&](auto tag) {
    using T = decltype(tag);
    T* data = tensor.data_ptr<T>();
    for (int64_t i = 0; i < numel; ++i) data[i] = static_cast<T>(static_cast<float>(value(i)));
  });
  return tensor;
}

// Every element equals expected(i); on failure names the first wrong one and how many are.
template <typename Fn>
::testing::AssertionResult HasValues(const at::Tensor& tensor, Fn expected) {
  int64_t wrong = 0, first = -1;
  double first_got = 0, first_want = 0;
  VisitType(tensor.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* data = tensor.data_ptr<T>();
    for (int64_t i = 0; i < tensor.numel(); ++i) {
      const double got = ToDouble(data[i]);
      const double want = expected(i);
      if (got != want) {
        if (wrong++ == 0) {
          first = i;
          first_got = got;
          first_want = want;
        }
      }
    }
  });
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << wrong << " of " << tensor.numel() << " elements wrong, first at " << first << ": got "
         << first_got << ", want " << first_want;
}

// Rank r's element i in a world of n: n * ((i + r) % 5 + 1). Sums, averages (sum / n) and
// maxima are then small integers, exact in every dtype, bfloat16 included.
double Value(int64_t i, int rank, int n) { return n * static_cast<double>((i + rank) % 5 + 1); }
double Sum(int64_t i, int n) {
  double sum = 0;
  for (int r = 0; r < n; ++r) sum += Value(i, r, n);
  return sum;
}
double Max(int64_t i, int n) {
  double best = Value(i, 0, n);
  for (int r = 1; r < n; ++r) best = std::max(best, Value(i, r, n));
  return best;
}
double Min(int64_t i, int n) {
  double best = Value(i, 0, n);
  for (int r = 1; r < n; ++r) best = std::min(best, Value(i, r, n));
  return best;
}

int64_t ElementSize(at::ScalarType type) { return c10::elementSize(type); }

// ---------------------------------------------------------------------------------------
// Collective correctness: every dtype, 2 and 3 ranks, sizes 0, 1, 7 and 1 MiB; allreduce both
// through shared memory and over TCP (the other collectives always go over TCP).

struct WorldAndType {
  int world;
  at::ScalarType type;
};

std::string Name(const WorldAndType& param) {
  return std::to_string(param.world) + "ranks_" + c10::toString(param.type);
}
std::string ParamName(const ::testing::TestParamInfo<WorldAndType>& info) {
  return Name(info.param);
}

const auto kWorldsAndTypes = ::testing::Values(
    WorldAndType{2, at::kFloat}, WorldAndType{2, at::kDouble}, WorldAndType{2, at::kHalf},
    WorldAndType{2, at::kBFloat16}, WorldAndType{2, at::kLong}, WorldAndType{3, at::kFloat},
    WorldAndType{3, at::kDouble}, WorldAndType{3, at::kHalf}, WorldAndType{3, at::kBFloat16},
    WorldAndType{3, at::kLong});

std::string PathName(bool shared_memory) { return shared_memory ? "shm" : "tcp"; }

class GlooAllReduceTest
    : public ::testing::TestWithParam<std::tuple<WorldAndType, bool /*shared_memory*/>> {};

TEST_P(GlooAllReduceTest, SumAverageMaxMin) {
  const int n = std::get<0>(GetParam()).world;
  const at::ScalarType type = std::get<0>(GetParam()).type;
  const bool shared_memory = std::get<1>(GetParam());
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(n, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptions(rank, n, store, "default", shared_memory));
    EXPECT_EQ(UsesSharedMemory(pg), shared_memory);
    // 1 MiB + 7 elements: in shared memory, two full chunks and a ragged one.
    for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, kMiB / ElementSize(type),
                          kMiB / ElementSize(type) + 7}) {
      SCOPED_TRACE(::testing::Message() << "rank " << rank << ", " << numel << " elements");
      auto input = [&](int64_t i) { return Value(i, rank, n); };

      at::Tensor sum = MakeTensor(type, numel, input);
      pg->AllReduce(sum, ReduceOp::kSum)->Wait();
      EXPECT_TRUE(HasValues(sum, [&](int64_t i) { return Sum(i, n); }));

      at::Tensor average = MakeTensor(type, numel, input);
      pg->AllReduce(average, ReduceOp::kAverage)->Wait();
      EXPECT_TRUE(HasValues(average, [&](int64_t i) { return Sum(i, n) / n; }));

      at::Tensor max = MakeTensor(type, numel, input);
      pg->AllReduce(max, ReduceOp::kMax)->Wait();
      EXPECT_TRUE(HasValues(max, [&](int64_t i) { return Max(i, n); }));

      at::Tensor min = MakeTensor(type, numel, input);
      pg->AllReduce(min, ReduceOp::kMin)->Wait();
      EXPECT_TRUE(HasValues(min, [&](int64_t i) { return Min(i, n); }));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, GlooAllReduceTest,
                         ::testing::Combine(kWorldsAndTypes, ::testing::Bool()),
                         [](const auto& info) {
                           return Name(std::get<0>(info.param)) + "_" +
                                  PathName(std::get<1>(info.param));
                         });

// Both paths reduce with the same kernels: for two ranks the results are the same bit for
// bit, rounding included, and on every rank; for three, shared memory sums in rank order.
class SharedMemoryMatchesTcpTest : public ::testing::TestWithParam<at::ScalarType> {};

TEST_P(SharedMemoryMatchesTcpTest, BitForBitOnEveryRank) {
  const at::ScalarType type = GetParam();
  const int64_t numel = kMiB / ElementSize(type) + 7;
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
        auto pg =
            CreateProcessGroup(GlooOptions(rank, n, store, PathName(shared_memory), shared_memory));
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

class GlooCollectivesTest : public ::testing::TestWithParam<WorldAndType> {};

TEST_P(GlooCollectivesTest, BroadcastFromFirstAndLastRoot) {
  const int n = GetParam().world;
  const at::ScalarType type = GetParam().type;
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(n, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptions(rank, n, store));
    // Root 0 and the last rank (root 2 with three ranks).
    for (int root : {0, n - 1}) {
      for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, kMiB / ElementSize(type)}) {
        SCOPED_TRACE(::testing::Message()
                     << "rank " << rank << ", root " << root << ", " << numel << " elements");
        at::Tensor tensor = MakeTensor(type, numel, [&](int64_t i) { return Value(i, rank, n); });
        pg->Broadcast({tensor}, root)->Wait();
        EXPECT_TRUE(HasValues(tensor, [&](int64_t i) { return Value(i, root, n); }));
      }
    }
  });
}

TEST_P(GlooCollectivesTest, AllGatherIntoSeparateAndAdjacentOutputs) {
  const int n = GetParam().world;
  const at::ScalarType type = GetParam().type;
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(n, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptions(rank, n, store));
    for (int64_t numel : {int64_t{0}, int64_t{1}, int64_t{7}, kMiB / ElementSize(type)}) {
      SCOPED_TRACE(::testing::Message() << "rank " << rank << ", " << numel << " elements");
      at::Tensor input = MakeTensor(type, numel, [&](int64_t i) { return Value(i, rank, n); });

      std::vector<at::Tensor> separate;
      for (int r = 0; r < n; ++r) separate.push_back(at::zeros({numel}, input.options()));
      pg->AllGather(separate, input)->Wait();
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(HasValues(separate[r], [&](int64_t i) { return Value(i, r, n); }))
            << "outputs[" << r << "]";
      }

      // Slices of one flat tensor: gathered in place, without a temporary.
      at::Tensor flat = at::zeros({n, numel}, input.options());
      std::vector<at::Tensor> rows;
      for (int r = 0; r < n; ++r) rows.push_back(flat[r]);
      pg->AllGather(rows, input)->Wait();
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(HasValues(rows[r], [&](int64_t i) { return Value(i, r, n); })) << "row " << r;
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, GlooCollectivesTest, kWorldsAndTypes, ParamName);

// ---------------------------------------------------------------------------------------
// 100 MiB: the size of a few gradient buckets; gloo splits it into many segments.

class GlooLargeAllReduceTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(GlooLargeAllReduceTest, Float32SumAndAverage) {
  const int n = std::get<0>(GetParam());
  const bool shared_memory = std::get<1>(GetParam());
  const int64_t numel = 100 * kMiB / 4;
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(n, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptions(rank, n, store, "default", shared_memory));
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
    auto pg = CreateProcessGroup(GlooOptions(rank, n, store));
    at::Tensor tensor = MakeTensor(at::kFloat, numel, [&](int64_t i) { return Value(i, rank, n); });
    pg->Broadcast({tensor}, n - 1)->Wait();
    EXPECT_TRUE(HasValues(tensor, [&](int64_t i) { return Value(i, n - 1, n); }))
        << "rank " << rank;
  });
}

INSTANTIATE_TEST_SUITE_P(TwoAndThreeRanks, GlooLargeTest, ::testing::Values(2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// ---------------------------------------------------------------------------------------

TEST(GlooProcessGroupTest, BroadcastOfSeveralTensorsOfMixedDtypes) {
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(3, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptions(rank, 3, store));
    auto value = [&](int64_t i) { return Value(i, rank, 3); };
    std::vector<at::Tensor> tensors = {
        MakeTensor(at::kFloat, 5, value), MakeTensor(at::kLong, 0, value),
        MakeTensor(at::kHalf, 3, value), MakeTensor(at::kDouble, 1000, value)};
    pg->Broadcast(tensors, 2)->Wait();
    for (const auto& tensor : tensors) {
      EXPECT_TRUE(HasValues(tensor, [&](int64_t i) { return Value(i, 2, 3); }))
          << "rank " << rank << " " << tensor.scalar_type();
    }
  });
}

TEST(GlooProcessGroupTest, SizeZeroCompletesAtOnce) {
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(2, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptions(rank, 2, store));
    auto empty = at::zeros({0});
    EXPECT_TRUE(pg->AllReduce(empty)->IsCompleted());
    EXPECT_TRUE(pg->Broadcast({empty}, 1)->IsCompleted());
    EXPECT_TRUE(pg->AllGather({at::zeros({0}), at::zeros({0})}, empty)->IsCompleted());
    // And the group stays in step for what follows.
    auto one = at::ones({3});
    pg->AllReduce(one)->Wait();
    EXPECT_TRUE(HasValues(one, [](int64_t) { return 2.0; }));
  });
}

TEST(GlooProcessGroupTest, WorldOfOneNeedsNoPeers) {
  auto pg = CreateProcessGroup(GlooOptions(0, 1, std::make_shared<InMemoryStore>()));
  auto tensor = MakeTensor(at::kFloat, 7, [](int64_t i) { return Value(i, 0, 1); });
  pg->AllReduce(tensor, ReduceOp::kAverage)->Wait();
  EXPECT_TRUE(HasValues(tensor, [](int64_t i) { return Value(i, 0, 1); }));
  pg->Broadcast({tensor}, 0)->Wait();
  std::vector<at::Tensor> outputs = {at::zeros({7})};
  pg->AllGather(outputs, tensor)->Wait();
  EXPECT_TRUE(HasValues(outputs[0], [](int64_t i) { return Value(i, 0, 1); }));
  pg->Barrier()->Wait();
}

TEST(GlooProcessGroupTest, BarrierWaitsForTheLateRank) {
  constexpr auto kLate = std::chrono::milliseconds(400);
  auto store = std::make_shared<InMemoryStore>();
  std::vector<double> waited_ms(3);
  spawnThreads(3, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptions(rank, 3, store));
    pg->Barrier()->Wait();  // everyone connected and in step
    if (rank == 2) std::this_thread::sleep_for(kLate);
    const auto start = Clock::now();
    pg->Barrier()->Wait();
    waited_ms[rank] = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  });
  // The punctual ranks waited for the late one (minus a little scheduling slack); it did not.
  EXPECT_GE(waited_ms[0], kLate.count() * 0.75);
  EXPECT_GE(waited_ms[1], kLate.count() * 0.75);
  EXPECT_LT(waited_ms[2], kLate.count() * 0.5);
}

TEST(GlooProcessGroupTest, BarrierCompletesAfterEarlierCollectives) {
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(2, [&](int rank) {
    ProcessGroupOptions options = GlooOptions(rank, 2, store);
    options.channels = 2;
    auto pg = CreateProcessGroup(options);
    std::vector<at::Tensor> tensors;
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < 4; ++k) {  // spread over both channels
      tensors.push_back(at::ones({kMiB}));
      works.push_back(pg->AllReduce(tensors.back()));
    }
    auto barrier = pg->Barrier();
    barrier->Wait();
    for (int k = 0; k < 4; ++k) {
      EXPECT_TRUE(works[k]->IsCompleted()) << "allreduce " << k << " on rank " << rank;
      EXPECT_LE(works[k]->end_time(), barrier->end_time());
    }
  });
}

TEST(GlooProcessGroupTest, EightAllReducesInFlightAtOnce) {
  for (int channels : {1, 2, 3}) {
    SCOPED_TRACE(::testing::Message() << channels << " channels");
    auto store = std::make_shared<InMemoryStore>();
    spawnThreads(3, [&](int rank) {
      auto options = GlooOptions(rank, 3, store);
      options.channels = channels;
      auto pg = CreateProcessGroup(options);
      std::vector<at::Tensor> tensors;
      std::vector<std::shared_ptr<Work>> works;
      for (int k = 0; k < 8; ++k) {
        // Different sizes and values per bucket, so a mix-up between them shows.
        const int64_t numel = (k % 2 == 0) ? 1000 * (k + 1) : kMiB / 4;
        tensors.push_back(
            MakeTensor(at::kFloat, numel, [&](int64_t i) { return Value(i + k, rank, 3) + k; }));
        works.push_back(pg->AllReduce(tensors.back()));
      }
      for (int k = 0; k < 8; ++k) {
        works[k]->Wait();
        EXPECT_TRUE(HasValues(tensors[k], [&](int64_t i) { return Sum(i + k, 3) + 3 * k; }))
            << "bucket " << k << " on rank " << rank;
        EXPECT_NE(works[k]->start_time(), Work::Clock::time_point{});
        EXPECT_GE(works[k]->end_time(), works[k]->start_time());
      }
    });
  }
}

TEST(GlooProcessGroupTest, CollectivesIssuedFromSeveralThreadsInAgreedOrder) {
  // The Reducer issues from the autograd thread while the main thread may issue a barrier;
  // what counts is one order per group. Here each rank issues from a helper thread.
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(2, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptions(rank, 2, store));
    at::Tensor tensor = at::ones({100});
    std::shared_ptr<Work> work;
    std::thread([&] { work = pg->AllReduce(tensor); }).join();
    work->Wait();
    EXPECT_TRUE(HasValues(tensor, [](int64_t) { return 2.0; }));
  });
}

TEST(GlooProcessGroupTest, WorkReportsTimesAndRunsCallbacks) {
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(2, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptions(rank, 2, store));
    const auto issued = Work::Clock::now();
    auto work = pg->AllReduce(at::ones({kMiB}));
    std::atomic<bool> called{false};
    work->OnCompletion([&] { called = true; });
    work->Wait();
    EXPECT_TRUE(called.load());
    EXPECT_GE(work->start_time(), issued);
    EXPECT_GE(work->end_time(), work->start_time());
    EXPECT_EQ(work->error(), nullptr);
    EXPECT_THAT(work->description(), HasSubstr("allreduce #0 (float32, 1048576 elements, sum) "
                                               "in group 'default' rank " +
                                               std::to_string(rank) + "/2"));
  });
}

// ---------------------------------------------------------------------------------------
// Argument errors are thrown at the call, name the op and the argument, and take no
// sequence number (the group stays in step).

template <typename Fn>
std::string ThrownMessage(Fn&& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected std::invalid_argument";
  return "";
}

TEST(GlooProcessGroupTest, RejectsBadArgumentsNamingTheOp) {
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(2, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptions(rank, 2, store));
    const auto int8 = at::ones({4}, at::TensorOptions().dtype(at::kChar));
    const auto boolean = at::ones({4}, at::TensorOptions().dtype(at::kBool));
    const auto transposed = at::ones({4, 3}).t();

    std::string message = ThrownMessage([&] { pg->AllReduce(int8); });
    EXPECT_THAT(message, HasSubstr("allreduce"));
    EXPECT_THAT(message, HasSubstr("unsupported dtype int8"));
    message = ThrownMessage([&] { pg->AllReduce(boolean); });
    EXPECT_THAT(message, HasSubstr("allreduce"));
    EXPECT_THAT(message, HasSubstr("unsupported dtype bool"));
    message = ThrownMessage([&] { pg->AllReduce(transposed); });
    EXPECT_THAT(message, HasSubstr("allreduce"));
    EXPECT_THAT(message, HasSubstr("not contiguous"));
    message = ThrownMessage([&] { pg->AllReduce(at::Tensor()); });
    EXPECT_THAT(message, HasSubstr("allreduce"));
    EXPECT_THAT(message, HasSubstr("undefined"));

    message = ThrownMessage([&] { pg->Broadcast({at::ones({2}), transposed}, 0); });
    EXPECT_THAT(message, HasSubstr("broadcast"));
    EXPECT_THAT(message, HasSubstr("tensors[1] is not contiguous"));
    message = ThrownMessage([&] { pg->Broadcast({at::ones({2})}, 2); });
    EXPECT_THAT(message, HasSubstr("broadcast"));
    EXPECT_THAT(message, HasSubstr("root 2"));

    message = ThrownMessage([&] { pg->AllGather({at::ones({2}), at::ones({3})}, at::ones({2})); });
    EXPECT_THAT(message, HasSubstr("allgather"));
    EXPECT_THAT(message, HasSubstr("outputs[1] has shape [3]"));
    message = ThrownMessage([&] { pg->AllGather({at::ones({2})}, at::ones({2})); });
    EXPECT_THAT(message, HasSubstr("allgather"));
    EXPECT_THAT(message, HasSubstr("one per rank"));
    message = ThrownMessage([&] {
      pg->AllGather({at::ones({2}), at::ones({2}, at::kDouble)}, at::ones({2}));
    });
    EXPECT_THAT(message, HasSubstr("outputs[1] has dtype float64"));
    message = ThrownMessage([&] { pg->AllGather({int8, int8}, int8); });
    EXPECT_THAT(message, HasSubstr("allgather"));
    EXPECT_THAT(message, HasSubstr("input has unsupported dtype int8"));

    // Still in step: the first real collective is #0 on every rank.
    at::Tensor ok = at::ones({3});
    auto work = pg->AllReduce(ok);
    work->Wait();
    EXPECT_THAT(work->description(), HasSubstr("allreduce #0"));
    EXPECT_TRUE(HasValues(ok, [](int64_t) { return 2.0; }));
  });
}

TEST(GlooProcessGroupTest, RejectsInconsistentOptions) {
  auto store = std::make_shared<InMemoryStore>();
  EXPECT_THROW(CreateProcessGroup(GlooOptions(2, 2, store)), std::invalid_argument);
  EXPECT_THROW(CreateProcessGroup(GlooOptions(0, 1, nullptr)), std::invalid_argument);
  auto options = GlooOptions(0, 1, store);
  options.channels = 0;
  EXPECT_THROW(CreateProcessGroup(options), std::invalid_argument);
}

TEST(GlooProcessGroupTest, DefaultHostnameFallsBackToSomethingPeersReach) {
  // Empty hostname: the machine's name if it resolves and binds, else 127.0.0.1. Either way
  // the ranks must reach each other on this machine.
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(2, [&](int rank) {
    auto pg = CreateProcessGroup(GlooOptions(rank, 2, store));
    auto* gloo = dynamic_cast<GlooProcessGroup*>(pg.get());
    ASSERT_NE(gloo, nullptr);
    EXPECT_FALSE(gloo->listen_hostname().empty());
    EXPECT_EQ(gloo->channels(), ProcessGroupOptions{}.channels);
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
      auto pg = CreateProcessGroup(GlooOptions(rank, n, store));
      EXPECT_TRUE(UsesSharedMemory(pg)) << "rank " << rank << " of " << n;
    });
  }
  auto alone = CreateProcessGroup(GlooOptions(0, 1, std::make_shared<InMemoryStore>()));
  EXPECT_FALSE(UsesSharedMemory(alone));
}

TEST(GlooSharedMemoryTest, OneRankWithoutItMakesEveryRankUseTcp) {
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(3, [&](int rank) {
    auto pg =
        CreateProcessGroup(GlooOptions(rank, 3, store, "default", /*shared_memory=*/rank != 1));
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
    auto options = GlooOptions(rank, 2, store);
    if (rank == 0) options.shared_memory_dir = "/nonexistent-gradhub-shm-dir";
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
    auto options = GlooOptions(rank, 2, store);
    options.shared_memory_dir = dir;
    options.channels = 2;  // a segment per channel
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

TEST(GlooSharedMemoryTest, PeerThatNeverComesTimesOutAndBreaksTheGroup) {
  auto store = std::make_shared<InMemoryStore>();
  std::atomic<bool> survivor_done{false};
  spawnThreads(2, [&](int rank) {
    auto options = GlooOptions(rank, 2, store);
    options.timeout = std::chrono::milliseconds(500);
    auto pg = CreateProcessGroup(options);
    ASSERT_TRUE(UsesSharedMemory(pg));
    if (rank == 1) {  // alive, but never joins the allreduce
      while (!survivor_done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    const auto start = Clock::now();
    auto work = pg->AllReduce(at::ones({kMiB}));
    try {
      work->Wait(std::chrono::seconds(10));
      ADD_FAILURE() << "allreduce without its peer completed";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("allreduce #0 (float32, 1048576 elements, sum) in group "
                                      "'default' rank 0/2: timed out after 500 ms waiting for "
                                      "rank 1"));
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    EXPECT_GE(seconds, 0.45);
    EXPECT_LT(seconds, 2.0);
    try {
      pg->AllReduce(at::ones({3}))->Wait();
      ADD_FAILURE() << "a broken group ran an allreduce";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("unusable after an earlier failure"));
    }
    survivor_done = true;
  });
}

// ---------------------------------------------------------------------------------------
// Subgroups.

TEST(SubgroupTest, RanksZeroAndTwoOfThree) {
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(3, [&](int rank) {
    const auto parent = GlooOptions(rank, 3, store);
    auto world = CreateProcessGroup(parent);
    auto sub = CreateSubgroup(parent, {0, 2});
    if (rank == 1) {
      EXPECT_EQ(sub, nullptr);
    } else {
      ASSERT_NE(sub, nullptr);
      EXPECT_EQ(sub->rank(), rank == 0 ? 0 : 1);
      EXPECT_EQ(sub->size(), 2);
      EXPECT_EQ(sub->name(), "default/sub-0-2");
      at::Tensor tensor = at::full({7}, static_cast<double>(10 + rank));
      sub->AllReduce(tensor)->Wait();
      EXPECT_TRUE(HasValues(tensor, [](int64_t) { return 10.0 + 12.0; }));  // ranks 0 and 2
    }
    // The parent is unaffected and still spans everyone.
    at::Tensor all = at::full({3}, static_cast<double>(rank));
    world->AllReduce(all)->Wait();
    EXPECT_TRUE(HasValues(all, [](int64_t) { return 0.0 + 1.0 + 2.0; }));
  });
}

TEST(SubgroupTest, RejectsUnsortedOrOutOfRangeRanks) {
  const auto parent = GlooOptions(0, 3, std::make_shared<InMemoryStore>());
  EXPECT_THROW(CreateSubgroup(parent, {2, 0}), std::invalid_argument);
  EXPECT_THROW(CreateSubgroup(parent, {0, 0}), std::invalid_argument);
  EXPECT_THROW(CreateSubgroup(parent, {0, 3}), std::invalid_argument);
  EXPECT_THROW(CreateSubgroup(parent, {}), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------
// NCCL: world size 1 on cuda:0, where a GPU is visible.

std::string NoGpuReason() {
  const auto inventory = devices::DiscoverDevices();
  if (!inventory.gpus.empty()) return "";
  return inventory.gpu_unavailable_reason.empty() ? "no GPU visible"
                                                  : inventory.gpu_unavailable_reason;
}

TEST(NcclProcessGroupTest, RefusedWithoutNcclOrGpu) {
#if GRADHUB_HAVE_NCCL
  if (NoGpuReason().empty()) GTEST_SKIP() << "a GPU is visible: NCCL is usable here";
#endif
  ProcessGroupOptions options;
  options.backend = Backend::kNccl;
  options.store = std::make_shared<InMemoryStore>();
  options.name = "nccl-refused";
  try {
    CreateProcessGroup(options);
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("process group 'nccl-refused' rank 0/1"));
    EXPECT_THAT(e.what(), ::testing::AnyOf(HasSubstr("no NCCL"), HasSubstr("no GPU"),
                                           HasSubstr("none is visible")));
  }
}

#if GRADHUB_HAVE_NCCL

// A CUDA tensor without a CUDA libtorch: device memory from cudaMalloc wrapped by from_blob
// (it only needs ATen's tensor metadata), so this runs with Debian's CPU-only libtorch too.
at::Tensor CudaTensor(at::ScalarType type, const at::Tensor& host) {
  void* device_memory = nullptr;
  EXPECT_EQ(cudaMalloc(&device_memory, std::max<size_t>(host.nbytes(), 1)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(device_memory, host.data_ptr(), host.nbytes(), cudaMemcpyHostToDevice),
            cudaSuccess);
  return at::from_blob(
      device_memory, host.sizes(), [](void* p) { cudaFree(p); },
      at::TensorOptions().dtype(type).device(at::Device(at::kCUDA, 0)));
}

at::Tensor ToHost(const at::Tensor& device_tensor) {
  at::Tensor host =
      at::empty(device_tensor.sizes(), at::TensorOptions().dtype(device_tensor.scalar_type()));
  EXPECT_EQ(
      cudaMemcpy(host.data_ptr(), device_tensor.data_ptr(), host.nbytes(), cudaMemcpyDeviceToHost),
      cudaSuccess);
  return host;
}

class NcclWorldOfOneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = NoGpuReason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    ProcessGroupOptions options;
    options.backend = Backend::kNccl;
    options.store = std::make_shared<InMemoryStore>();
    options.name = "nccl-1";
    options.timeout = std::chrono::seconds(30);
    pg_ = CreateProcessGroup(options);
  }
  std::shared_ptr<ProcessGroup> pg_;
};

TEST_F(NcclWorldOfOneTest, AllReduceEveryDtypeAndOp) {
  for (auto type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong}) {
    for (auto op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax, ReduceOp::kMin}) {
      SCOPED_TRACE(::testing::Message() << type << " op " << static_cast<int>(op));
      for (int64_t numel : {int64_t{0}, int64_t{7}, kMiB / ElementSize(type)}) {
        auto host = MakeTensor(type, numel, [](int64_t i) { return Value(i, 0, 1); });
        auto device = CudaTensor(type, host);
        pg_->AllReduce(device, op)->Wait();
        EXPECT_TRUE(HasValues(ToHost(device), [](int64_t i) { return Value(i, 0, 1); }));
      }
    }
  }
}

TEST_F(NcclWorldOfOneTest, BroadcastAllGatherBarrier) {
  auto host = MakeTensor(at::kFloat, 1000, [](int64_t i) { return Value(i, 0, 1); });
  auto device = CudaTensor(at::kFloat, host);
  auto other = CudaTensor(at::kFloat, MakeTensor(at::kFloat, 3, [](int64_t) { return 4.0; }));
  pg_->Broadcast({device, other}, 0)->Wait();
  EXPECT_TRUE(HasValues(ToHost(device), [](int64_t i) { return Value(i, 0, 1); }));
  EXPECT_TRUE(HasValues(ToHost(other), [](int64_t) { return 4.0; }));

  std::vector<at::Tensor> outputs = {CudaTensor(at::kFloat, at::zeros({1000}))};
  pg_->AllGather(outputs, device)->Wait();
  EXPECT_TRUE(HasValues(ToHost(outputs[0]), [](int64_t i) { return Value(i, 0, 1); }));

  auto barrier = pg_->Barrier();
  barrier->Wait();
  EXPECT_TRUE(barrier->IsCompleted());
}

TEST_F(NcclWorldOfOneTest, RejectsCpuTensorsNamingTheOp) {
  try {
    pg_->AllReduce(at::ones({3}));
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("allreduce"));
    EXPECT_THAT(e.what(), HasSubstr("cuda:0"));
  }
}

#endif  // GRADHUB_HAVE_NCCL

}  // namespace
}  // namespace gradhub::ddp
