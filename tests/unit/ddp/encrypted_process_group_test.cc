// Encrypted Gloo collectives (GlooOptions::encrypt_traffic, gloo/sealed_channel.h): results
// equal to the plain path's, the ranks' agreement on the option, and what the wire carries,
// seen by a relay between two ranks (gloo_relay.h): no plaintext, and a flipped byte fails
// the collective; the same for point-to-point transfers. The ProcessGroup conformance suite
// runs sealed too (process_group_test.cc); ranks are threads over loopback TCP, each with its
// own group.
#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/ddp/comm/gloo/gloo_process_group.h"
#include "gpu_worker/ddp/comm/gloo/point_to_point.h"
#include "gpu_worker/ddp/comm/gloo/sealed_channel.h"
#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/store/in_memory_store.h"
#include "tests/unit/ddp/collective_values.h"
#include "tests/unit/ddp/gloo_relay.h"
#include "tests/unit/ddp/test_ranks.h"

namespace gradhub::ddp {
namespace {

using testing::BitwiseEqual;
using ::testing::HasSubstr;
using testing::spawnThreads;

ProcessGroupOptions Options(int rank, int size, std::shared_ptr<Store> store,
                            const std::string& name, bool encrypt) {
  ProcessGroupOptions options;
  options.rank = rank;
  options.size = size;
  options.store = std::move(store);
  options.name = name;
  options.timeout = std::chrono::seconds(30);
  GlooOptions& gloo = options.gloo.emplace();
  gloo.shared_memory = false;  // every allreduce over TCP, so sealed
  gloo.encrypt_traffic = encrypt;
  return options;
}

bool Encrypts(const std::shared_ptr<ProcessGroup>& group) {
  return dynamic_cast<GlooProcessGroup&>(*group).encrypts_traffic();
}

at::Tensor Random(at::ScalarType type, int64_t numel, int seed) {
  at::Generator generator = at::detail::createCPUGenerator(seed);
  at::Tensor values = at::randn({numel}, generator, at::kDouble) * 100;
  if (type == at::kLong) values = values.round();
  return values.to(type);
}

// Sealed and plain results of one rank agree: bit for bit where the ring's order of addition
// is the same (two ranks: each element is one addition), within a few roundings of the
// operands' magnitude otherwise (three ranks may add in another order: where a sum cancels,
// one rounding of a partial sum is large next to the result).
::testing::AssertionResult Agree(const at::Tensor& sealed, const at::Tensor& plain, int n) {
  if (n == 2 || sealed.scalar_type() == at::kLong) {
    return BitwiseEqual(sealed, plain) ? ::testing::AssertionSuccess()
                                       : ::testing::AssertionFailure() << "not bitwise equal";
  }
  const bool low = sealed.scalar_type() == at::kHalf || sealed.scalar_type() == at::kBFloat16;
  const double rounding = low ? 1e-2 : 1e-6;  // a few units in the last place
  const at::Tensor a = sealed.to(at::kDouble), b = plain.to(at::kDouble);
  const double scale = std::max(1.0, b.abs().max().item<double>());
  const double worst = (a - b).abs().max().item<double>();
  if (worst <= rounding * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max difference " << worst << " for magnitude " << scale;
}

// Sizes: one element, fewer than the world, odd, a chunk's worth per rank plus one (two
// chunks per block, the last one ragged), and 1 MiB + 7 elements.
std::vector<int64_t> SizesFor(at::ScalarType type, int n) {
  const int64_t element = static_cast<int64_t>(c10::elementSize(type));
  const int64_t chunk = static_cast<int64_t>(SealedChannel::kChunkBytes) / element;
  return {1, n - 1, 7, chunk * n + 1, (int64_t{1} << 20) / element + 7};
}

// ---------------------------------------------------------------------------------------
// Results: the sealed path computes what the plain one does, on every rank alike.

class SealedMatchesPlainTest : public ::testing::TestWithParam<int> {};

TEST_P(SealedMatchesPlainTest, AllReduceSumAndAverageEveryDtypeAndSize) {
  const int n = GetParam();
  auto store = std::make_shared<InMemoryStore>();
  std::vector<std::vector<at::Tensor>> sealed_results(n);
  spawnThreads(n, [&](int rank) {
    auto sealed = CreateProcessGroup(Options(rank, n, store, "sealed", true));
    auto plain = CreateProcessGroup(Options(rank, n, store, "plain", false));
    ASSERT_TRUE(Encrypts(sealed));
    ASSERT_FALSE(Encrypts(plain));
    for (at::ScalarType type : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kLong}) {
      for (int64_t numel : SizesFor(type, n)) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMax}) {
          SCOPED_TRACE(::testing::Message() << "rank " << rank << ", " << type << ", " << numel
                                            << " elements, " << ReduceOpName(op));
          at::Tensor a = Random(type, numel, 100 * rank + numel);
          at::Tensor b = a.clone();
          sealed->AllReduce(a, op)->Wait();
          plain->AllReduce(b, op)->Wait();
          EXPECT_TRUE(Agree(a, b, n));
          sealed_results[rank].push_back(a);
        }
      }
    }
  });
  for (int rank = 1; rank < n; ++rank) {
    for (size_t k = 0; k < sealed_results[0].size(); ++k) {
      EXPECT_TRUE(BitwiseEqual(sealed_results[rank][k], sealed_results[0][k]))
          << "rank " << rank << " differs from rank 0 in result " << k;
    }
  }
}

TEST_P(SealedMatchesPlainTest, BroadcastFromEveryRootAndAllGather) {
  const int n = GetParam();
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(n, [&](int rank) {
    auto sealed = CreateProcessGroup(Options(rank, n, store, "sealed", true));
    auto plain = CreateProcessGroup(Options(rank, n, store, "plain", false));
    for (int64_t numel : SizesFor(at::kFloat, n)) {
      SCOPED_TRACE(::testing::Message() << "rank " << rank << ", " << numel << " elements");
      for (int root = 0; root < n; ++root) {
        // Several tensors: broadcast packs them into one buffer first.
        std::vector<at::Tensor> a = {Random(at::kFloat, numel, rank), Random(at::kLong, 3, rank)};
        std::vector<at::Tensor> b = {a[0].clone(), a[1].clone()};
        sealed->Broadcast(a, root)->Wait();
        plain->Broadcast(b, root)->Wait();
        EXPECT_TRUE(BitwiseEqual(a[0], b[0]) && BitwiseEqual(a[1], b[1])) << "root " << root;
      }
      const at::Tensor input = Random(at::kFloat, numel, rank);
      std::vector<at::Tensor> a, b;
      for (int r = 0; r < n; ++r) {
        a.push_back(at::zeros({numel}));
        b.push_back(at::zeros({numel}));
      }
      sealed->AllGather(a, input)->Wait();
      plain->AllGather(b, input)->Wait();
      for (int r = 0; r < n; ++r) EXPECT_TRUE(BitwiseEqual(a[r], b[r])) << "outputs[" << r << "]";
    }
  });
}

INSTANTIATE_TEST_SUITE_P(TwoAndThreeRanks, SealedMatchesPlainTest, ::testing::Values(2, 3),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

// ---------------------------------------------------------------------------------------
// Agreement: every rank encrypts or none does.

TEST(TrafficAgreementTest, RanksThatDisagreeFailTheRendezvousNamingTheOption) {
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(3, [&](int rank) {
    try {
      CreateProcessGroup(Options(rank, 3, store, "mixed", /*encrypt=*/rank != 1));
      ADD_FAILURE() << "rank " << rank << " joined a group that disagrees on encryption";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("process group 'mixed' rank " + std::to_string(rank)));
      EXPECT_THAT(e.what(), HasSubstr("ranks disagree on GlooOptions::encrypt_traffic (a job's "
                                      "distributed.encryptTraffic): rank 0 has true, rank 1 has "
                                      "false"));
    }
  });
}

TEST(TrafficAgreementTest, PlainByDefaultAndSubgroupsOfASealedGroupAreSealed) {
  auto store = std::make_shared<InMemoryStore>();
  spawnThreads(3, [&](int rank) {
    ProcessGroupOptions defaults;
    defaults.rank = rank;
    defaults.size = 3;
    defaults.store = store;
    defaults.name = "defaults";
    EXPECT_FALSE(Encrypts(CreateProcessGroup(defaults)));
    const ProcessGroupOptions parent = Options(rank, 3, store, "parent", true);
    auto world = CreateProcessGroup(parent);
    auto sub = CreateSubgroup(parent, {0, 2});
    if (rank == 1) return;
    ASSERT_TRUE(Encrypts(sub));
    at::Tensor tensor = at::full({5}, static_cast<double>(rank + 1));
    sub->AllReduce(tensor)->Wait();
    EXPECT_TRUE(testing::HasValues(tensor, [](int64_t) { return 1.0 + 3.0; }));
  });
}

// ---------------------------------------------------------------------------------------
// The wire, through a relay between rank 0 and rank 1 (gloo_relay.h).

constexpr char kSecret[] = "GRADHUB-PLAINTEXT-MARKER-";  // 25 bytes, repeated

// An int64 tensor whose bytes are kSecret over and over.
at::Tensor SecretTensor(int64_t numel) {
  at::Tensor tensor = at::empty({numel}, at::kLong);
  auto* bytes = static_cast<char*>(tensor.data_ptr());
  const size_t length = sizeof(kSecret) - 1;
  for (size_t i = 0; i < tensor.nbytes(); ++i) bytes[i] = kSecret[i % length];
  return tensor;
}

struct Relayed {
  std::shared_ptr<testing::RelayingStore> store;
  std::string name;
};

// Rank `rank` of two, listening where the relay expects (127.0.0.2).
std::shared_ptr<ProcessGroup> JoinRelayed(const Relayed& relayed, int rank, bool encrypt,
                                          std::chrono::milliseconds timeout) {
  ProcessGroupOptions options = Options(rank, 2, relayed.store, relayed.name, encrypt);
  options.gloo->hostname = "127.0.0.2";
  options.timeout = timeout;
  return CreateProcessGroup(options);
}

constexpr int64_t kSecretNumel = 100000;  // 800 KB: several chunks

// What rank 0 and rank 1 sent each other through the relay of group `name` while each ran
// traffic(rank, group, secret), secret a tensor of kSecret.
std::string WireOf(bool encrypt, const std::string& name,
                   const std::function<void(int, ProcessGroup&, const at::Tensor&)>& traffic) {
  Relayed relayed{std::make_shared<testing::RelayingStore>(std::make_shared<InMemoryStore>(), name),
                  name};
  const at::Tensor secret = SecretTensor(kSecretNumel);
  spawnThreads(2, [&](int rank) {
    auto group = JoinRelayed(relayed, rank, encrypt, std::chrono::seconds(30));
    traffic(rank, *group, secret);
  });
  testing::GlooRelay* relay = relayed.store->relay();
  if (relay == nullptr) {
    ADD_FAILURE() << "the relay never started";
    return "";
  }
  return relay->SentByRank0() + relay->SentByRank1();
}

// Rank 0 allreduces, broadcasts and allgathers a tensor of kSecret (rank 1: zeros), with the
// results checked.
std::string WireOfSecretCollectives(bool encrypt) {
  return WireOf(
      encrypt, encrypt ? "sealed" : "plain",
      [](int rank, ProcessGroup& group, const at::Tensor& secret) {
        at::Tensor mine = rank == 0 ? secret.clone() : at::zeros_like(secret);
        at::Tensor reduced = mine.clone();
        group.AllReduce(reduced)->Wait();
        EXPECT_TRUE(BitwiseEqual(reduced, secret)) << "allreduce on rank " << rank;
        at::Tensor broadcast = mine.clone();
        group.Broadcast({broadcast}, 0)->Wait();
        EXPECT_TRUE(BitwiseEqual(broadcast, secret)) << "broadcast on rank " << rank;
        std::vector<at::Tensor> gathered = {at::empty_like(secret), at::empty_like(secret)};
        group.AllGather(gathered, mine)->Wait();
        EXPECT_TRUE(BitwiseEqual(gathered[0], secret)) << "allgather on rank " << rank;
        group.Barrier()->Wait();
      });
}

// The control -- plain traffic shows kSecret, so the relay captured the payload -- and the
// claim: sealed traffic shows no piece of it. `wire(encrypt)` runs the traffic, which carries
// at least `bytes` either way.
void ExpectSealingHidesTheSecret(const std::function<std::string(bool encrypt)>& wire,
                                 size_t bytes) {
  const std::string needle(kSecret, sizeof(kSecret) - 1);
  const std::string plain = wire(/*encrypt=*/false);
  EXPECT_GT(plain.size(), bytes);
  EXPECT_NE(plain.find(needle), std::string::npos) << "the relay did not capture the payload";
  const std::string sealed = wire(/*encrypt=*/true);
  EXPECT_GT(sealed.size(), bytes);
  EXPECT_EQ(sealed.find(needle), std::string::npos) << "plaintext on the wire";
  EXPECT_EQ(sealed.find(needle.substr(0, 12)), std::string::npos) << "plaintext on the wire";
}

TEST(SealedWireTest, NoPlaintextCrossesTheWireWhenSealedWhilePlainTrafficShowsIt) {
  ExpectSealingHidesTheSecret(WireOfSecretCollectives, 3u * 800000);
}

TEST(SealedWireTest, AFlippedByteFailsTheCollectiveNamingTheSenderAndBreaksTheGroup) {
  Relayed relayed{
      std::make_shared<testing::RelayingStore>(std::make_shared<InMemoryStore>(), "tampered"),
      "tampered"};
  spawnThreads(2, [&](int rank) {
    auto group = JoinRelayed(relayed, rank, true, std::chrono::seconds(5));
    group->Barrier()->Wait();  // both joined, so the relay exists
    // Rank 0's first data message can only go once rank 1 has posted its receive, inside the
    // allreduce below, so arming here catches it.
    if (rank == 1) relayed.store->relay()->TamperWithNextPayload(1024);
    at::Tensor tensor = at::ones({1 << 18});  // 1 MiB
    auto work = group->AllReduce(tensor);
    try {
      work->Wait();
      ADD_FAILURE() << "rank " << rank << ": a tampered allreduce completed";
    } catch (const CommError& e) {
      if (rank == 1) {
        EXPECT_THAT(e.what(), HasSubstr("allreduce #1 (float32, 262144 elements, sum) in group "
                                        "'tampered' rank 1/2: collective traffic failed "
                                        "authentication from rank 0 (tampered or corrupted)"));
      }
    }
    if (rank == 0) return;  // its peer is gone: it timed out or saw the connection close
    try {
      group->AllReduce(at::ones({3}))->Wait();
      ADD_FAILURE() << "a broken group ran an allreduce";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("unusable after an earlier failure"));
      EXPECT_THAT(e.what(), HasSubstr("failed authentication from rank 0"));
    }
  });
}

// ---------------------------------------------------------------------------------------
// Point to point through the relay: sealed like the collectives (gloo/point_to_point.h).

// Each rank sends the other a tensor of kSecret, with what arrived checked.
std::string WireOfSecretTransfers(bool encrypt) {
  return WireOf(encrypt, encrypt ? "sealed-p2p" : "plain-p2p",
                [](int rank, ProcessGroup& group, const at::Tensor& secret) {
                  at::Tensor got = at::zeros_like(secret);
                  auto send = group.Send(secret, 1 - rank, 7);
                  auto recv = group.Recv(got, 1 - rank, 7);
                  send->Wait();
                  recv->Wait();
                  EXPECT_TRUE(BitwiseEqual(got, secret)) << "rank " << rank;
                });
}

TEST(SealedWireTest, NoPlaintextOfATransferCrossesTheWireWhenSealed) {
  ExpectSealingHidesTheSecret(WireOfSecretTransfers, 2u * 800000);
}

// A transfer of `numel` floats whose payload rank 1 receives with one byte flipped.
void ExpectATamperedRecvFailsAndBreaksTheGroup(int64_t numel, const std::string& name) {
  Relayed relayed{std::make_shared<testing::RelayingStore>(std::make_shared<InMemoryStore>(), name),
                  name};
  spawnThreads(2, [&](int rank) {
    auto group = JoinRelayed(relayed, rank, true, std::chrono::seconds(5));
    group->Barrier()->Wait();  // both joined, so the relay exists
    if (rank == 0) {
      relayed.store->relay()->TamperWithNextPayload(1024);  // the payload, not a lone header
      group->Send(at::ones({numel}), 1, 3)->Wait();         // gloo wrote it: the send succeeded
      return;
    }
    try {
      group->Recv(at::zeros({numel}), 0, 3)->Wait();
      ADD_FAILURE() << "a tampered transfer was received";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("recv #0 (float32, " + std::to_string(numel) +
                                      " elements, from rank 0, tag 3) in group '" + name +
                                      "' rank 1/2: collective traffic failed authentication "
                                      "from rank 0 (tampered or corrupted)"));
    }
    try {
      group->Recv(at::zeros({3}), 0, 3)->Wait();
      ADD_FAILURE() << "a broken group ran a Recv";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("unusable after an earlier failure"));
    }
  });
}

TEST(SealedWireTest, AFlippedByteInAPayloadOfItsOwnFailsTheRecvNamingTheSenderAndBreaksTheGroup) {
  static_assert(int64_t{4} << 18 > kPointToPointInlineMaxBytes);
  ExpectATamperedRecvFailsAndBreaksTheGroup(int64_t{1} << 18, "tampered-p2p");
}

TEST(SealedWireTest, AFlippedByteInAnInlinePayloadFailsTheRecvNamingTheSenderAndBreaksTheGroup) {
  static_assert(int64_t{4} << 12 <= kPointToPointInlineMaxBytes);
  ExpectATamperedRecvFailsAndBreaksTheGroup(int64_t{1} << 12, "tampered-inline");
}

}  // namespace
}  // namespace gradhub::ddp
