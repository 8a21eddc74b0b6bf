// The trainer's Store client against a real StoreService on loopback: the engine's Store
// contract (store_conformance.h, the suite every backend runs), then what is particular to
// it: its token, its address spellings and its two error kinds.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "gpu_worker/ddp/store/prefix_store.h"
#include "gpu_worker/store_client/grpc_store.h"
#include "services/api/rendezvous_store.h"
#include "services/api/store_scope.h"
#include "services/api/store_service.h"
#include "tests/support/grpc_test_server.h"
#include "tests/unit/ddp/store_conformance.h"

namespace gradhub::store_client {
namespace {

using std::chrono::milliseconds;

constexpr char kPrefix[] = "jobs/j1/attempts/1/";

constexpr char kNodeToken[] = "node-secret";

GrpcStoreOptions WithToken(const std::string& token) {
  GrpcStoreOptions options;
  options.token = token;
  return options;
}

// A store service of its own with a GrpcStore client on it. The rendezvous store takes only keys
// inside an attempt, so the conformance suite sees the client through a PrefixStore on one.
struct GrpcStoreBackend {
  api::RendezvousStore rendezvous;
  api::StoreService service{&rendezvous, [](const std::string&) -> absl::StatusOr<std::string> {
                              return std::string(api::kAnyKey);
                            }};
  testing::TestGrpcServer server{{&service}};
  std::shared_ptr<ddp::Store> store = std::make_shared<ddp::PrefixStore>(
      MakeGrpcStore(server.address(), WithToken(kNodeToken)), "jobs/j1/attempts/1");
};

std::shared_ptr<ddp::Store> MakeGrpcStoreOnItsOwnServer() {
  auto backend = std::make_shared<GrpcStoreBackend>();
  return std::shared_ptr<ddp::Store>(backend, backend->store.get());
}

using ddp::StoreConformanceTest;
INSTANTIATE_TEST_SUITE_P(Backends, StoreConformanceTest,
                         ::testing::Values(ddp::StoreFactory{"Grpc", MakeGrpcStoreOnItsOwnServer}),
                         ddp::StoreFactoryName);

class GrpcStoreTest : public ::testing::Test {
 protected:
  api::RendezvousStore rendezvous_;
  // As gradhub-api's, but one fixed token stands for "a node token".
  api::StoreService service_{
      &rendezvous_, [](const std::string& authorization) -> absl::StatusOr<std::string> {
        if (authorization != std::string("Bearer ") + kNodeToken) {
          return absl::UnauthenticatedError("missing or invalid bearer token");
        }
        return std::string(api::kAnyKey);
      }};
  testing::TestGrpcServer server_{{&service_}};
  std::shared_ptr<ddp::Store> store_ = MakeGrpcStore(server_.address(), WithToken(kNodeToken));
};

TEST(GrpcStoreAddressTest, AcceptsBothSpellingsAndNothingElse) {
  EXPECT_EQ(GrpcStoreAddress("grpc://api:7070"), "api:7070");
  EXPECT_EQ(GrpcStoreAddress("grpc:127.0.0.1:7070"), "127.0.0.1:7070");
  EXPECT_EQ(GrpcStoreAddress("file:/tmp/x"), "");
  EXPECT_EQ(GrpcStoreAddress(""), "");
}

TEST_F(GrpcStoreTest, SetGetAddCheckAndDeletePrefix) {
  const std::string key = std::string(kPrefix) + "addr/0";
  store_->Set(key, std::string("a\0b", 3));
  EXPECT_EQ(store_->Get(key, milliseconds(1000)), std::string("a\0b", 3));

  const std::string counter = std::string(kPrefix) + "arrived";
  EXPECT_EQ(store_->Add(counter, 1), 1);
  EXPECT_EQ(store_->Add(counter, 2), 3);
  EXPECT_EQ(store_->Get(counter, milliseconds(1000)), "3");

  EXPECT_TRUE(store_->Check({key, counter}));
  EXPECT_FALSE(store_->Check({key, std::string(kPrefix) + "missing"}));
  EXPECT_EQ(store_->DeletePrefix(kPrefix), 2);
  EXPECT_FALSE(store_->Check({key}));
}

TEST_F(GrpcStoreTest, SendsItsTokenAndAWrongOneIsAStoreError) {
  store_->Set(std::string(kPrefix) + "k", "v");
  for (const char* token : {"", "not-the-node-token"}) {
    auto stranger = MakeGrpcStore(server_.address(), WithToken(token));
    try {
      stranger->Get(std::string(kPrefix) + "k", milliseconds(1000));
      ADD_FAILURE() << "read the store with token '" << token << "'";
    } catch (const ddp::StoreError& error) {
      EXPECT_NE(std::string(error.what()).find("bearer token"), std::string::npos) << error.what();
    }
  }
  GrpcStoreOptions unreadable_ca = WithToken(kNodeToken);
  unreadable_ca.tls_ca_file = "/nonexistent/ca.pem";
  EXPECT_THROW(MakeGrpcStore(server_.address(), unreadable_ca), ddp::StoreError);
}

TEST_F(GrpcStoreTest, WaitReturnsWhenAnotherClientSetsTheKey) {
  const std::string key = std::string(kPrefix) + "late";
  auto other = MakeGrpcStore(server_.address(), WithToken(kNodeToken));
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(200));
    other->Set(key, "v");
  });
  const auto start = std::chrono::steady_clock::now();
  store_->Wait({key}, milliseconds(5000));
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(3000));
  setter.join();
}

TEST_F(GrpcStoreTest, MissingKeyIsATimeoutNamingIt) {
  const std::string key = std::string(kPrefix) + "never";
  const auto start = std::chrono::steady_clock::now();
  try {
    store_->Get(key, milliseconds(300));
    FAIL() << "Get of a missing key returned";
  } catch (const ddp::StoreTimeoutError& error) {
    EXPECT_NE(std::string(error.what()).find("never"), std::string::npos) << error.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(3000));
}

TEST_F(GrpcStoreTest, KeyOutsideAnAttemptIsAStoreErrorNamingTheRule) {
  try {
    store_->Set("no-prefix", "v");
    FAIL() << "Set outside an attempt's prefix succeeded";
  } catch (const ddp::StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("attempts"), std::string::npos) << error.what();
  }
}

TEST(GrpcStoreUnreachableTest, IsAStoreErrorNotATimeout) {
  // Port 1 on loopback: nothing listens there.
  GrpcStoreOptions options;
  options.rpc_timeout = milliseconds(500);
  auto store = MakeGrpcStore("127.0.0.1:1", options);
  EXPECT_THROW(store->Set(std::string(kPrefix) + "k", "v"), ddp::StoreError);
  EXPECT_THROW(store->Get(std::string(kPrefix) + "k", milliseconds(200)), ddp::StoreError);
}

}  // namespace
}  // namespace gradhub::store_client
