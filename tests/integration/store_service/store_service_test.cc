// StoreService over real gRPC channels to a TestGrpcServer on loopback. RendezvousStore on its
// own, over each backend, is rendezvous_store_test.cc.
#include <dirent.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "gradhub/v1/store.grpc.pb.h"
#include "services/api/rendezvous_store.h"
#include "services/api/store_scope.h"
#include "services/api/store_service.h"
#include "tests/integration/store_service/token_client.h"
#include "tests/support/grpc_test_server.h"

namespace gradhub::api {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::TokenClient;

constexpr char kPrefix[] = "jobs/j1/attempts/1/";

std::string Key(const std::string& name) { return kPrefix + name; }

// Who may call is gradhub-api's Authenticator, tested with it (store_job_token_test.cc); here
// every caller may touch every key.
absl::StatusOr<std::string> AnyCaller(const std::string&) { return std::string(kAnyKey); }

// Polls `predicate` until it holds or `limit` passes.
bool Eventually(const std::function<bool()>& predicate, milliseconds limit = milliseconds(5000)) {
  const auto deadline = Clock::now() + limit;
  while (!predicate()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

int ThreadsInProcess() {
  int count = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

google::protobuf::Duration ProtoDuration(milliseconds d) {
  google::protobuf::Duration out;
  out.set_seconds(d.count() / 1000);
  out.set_nanos(static_cast<int32_t>((d.count() % 1000) * 1000000));
  return out;
}

// A client as a trainer would be: its own channel, deadlines a little past the timeouts.
class Client {
 public:
  explicit Client(std::shared_ptr<grpc::Channel> channel)
      : stub_(v1::StoreService::NewStub(std::move(channel))) {}

  grpc::Status Set(const std::string& key, const std::string& value) {
    grpc::ClientContext context;
    Deadline(&context, milliseconds(5000));
    v1::SetRequest request;
    request.set_key(key);
    request.set_value(value);
    v1::SetResponse response;
    return stub_->Set(&context, request, &response);
  }

  grpc::Status Get(const std::string& key, milliseconds timeout, std::string* value,
                   milliseconds deadline = milliseconds(0)) {
    grpc::ClientContext context;
    Deadline(&context, deadline.count() > 0 ? deadline : timeout + milliseconds(5000));
    v1::GetRequest request;
    request.set_key(key);
    *request.mutable_timeout() = ProtoDuration(timeout);
    v1::GetResponse response;
    grpc::Status status = stub_->Get(&context, request, &response);
    if (value != nullptr) *value = response.value();
    return status;
  }

  grpc::Status Add(const std::string& key, int64_t delta, int64_t* value) {
    grpc::ClientContext context;
    Deadline(&context, milliseconds(5000));
    v1::AddRequest request;
    request.set_key(key);
    request.set_delta(delta);
    v1::AddResponse response;
    grpc::Status status = stub_->Add(&context, request, &response);
    if (value != nullptr) *value = response.value();
    return status;
  }

  grpc::Status Wait(const std::vector<std::string>& keys, milliseconds timeout,
                    grpc::ClientContext* context = nullptr) {
    grpc::ClientContext own;
    if (context == nullptr) context = &own;
    Deadline(context, timeout + milliseconds(5000));
    v1::WaitRequest request;
    for (const std::string& key : keys) request.add_keys(key);
    *request.mutable_timeout() = ProtoDuration(timeout);
    v1::WaitResponse response;
    return stub_->Wait(context, request, &response);
  }

  bool Check(const std::vector<std::string>& keys) {
    grpc::ClientContext context;
    Deadline(&context, milliseconds(5000));
    v1::CheckRequest request;
    for (const std::string& key : keys) request.add_keys(key);
    v1::CheckResponse response;
    grpc::Status status = stub_->Check(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.ready();
  }

  grpc::Status DeletePrefix(const std::string& prefix, int64_t* deleted) {
    grpc::ClientContext context;
    Deadline(&context, milliseconds(5000));
    v1::DeletePrefixRequest request;
    request.set_prefix(prefix);
    v1::DeletePrefixResponse response;
    grpc::Status status = stub_->DeletePrefix(&context, request, &response);
    if (deleted != nullptr) *deleted = response.deleted();
    return status;
  }

  v1::StoreService::Stub& stub() { return *stub_; }

 private:
  static void Deadline(grpc::ClientContext* context, milliseconds d) {
    context->set_deadline(std::chrono::system_clock::now() + d);
  }
  std::unique_ptr<v1::StoreService::Stub> stub_;
};

// Many Gets in flight from one thread through the callback client API: no client thread per
// call either, so the thread count below measures the server.
class AsyncGets {
 public:
  AsyncGets(v1::StoreService::Stub* stub, const std::vector<std::string>& keys,
            milliseconds timeout)
      : calls_(keys.size()) {
    for (size_t i = 0; i < keys.size(); ++i) {
      Call& call = calls_[i];
      call.context.set_deadline(std::chrono::system_clock::now() + timeout + milliseconds(5000));
      call.request.set_key(keys[i]);
      *call.request.mutable_timeout() = ProtoDuration(timeout);
      stub->async()->Get(&call.context, &call.request, &call.response,
                         [this, &call](grpc::Status status) {
                           std::lock_guard<std::mutex> lock(mu_);
                           call.status = std::move(status);
                           ++done_;
                           cv_.notify_all();
                         });
    }
  }
  ~AsyncGets() {
    for (Call& call : calls_) call.context.TryCancel();
    AwaitAll(milliseconds(10000));
  }

  bool AwaitAll(milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, limit, [this] { return done_ == calls_.size(); });
  }
  size_t done() {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  grpc::Status status(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_[i].status;
  }
  const std::string& value(size_t i) { return calls_[i].response.value(); }
  grpc::ClientContext& context(size_t i) { return calls_[i].context; }

 private:
  struct Call {
    grpc::ClientContext context;
    v1::GetRequest request;
    v1::GetResponse response;
    grpc::Status status;
  };
  std::vector<Call> calls_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t done_ = 0;
};

class StoreServiceTest : public ::testing::Test {
 protected:
  // A small server thread pool: blocked calls must not need threads.
  static constexpr int kServerThreads = 4;

  StoreServiceTest()
      : service_(&store_, AnyCaller),
        server_(std::make_unique<testing::TestGrpcServer>(
            std::vector<AsyncGrpcService*>{&service_},
            testing::TestGrpcServerOptions{/*max_threads=*/kServerThreads})),
        client_(server_->NewChannel()) {}

  RendezvousStore store_;
  StoreService service_;
  std::unique_ptr<testing::TestGrpcServer> server_;
  Client client_;
};

TEST_F(StoreServiceTest, SetThenGetReturnsBytesVerbatim) {
  const std::string with_nuls("a\0b\0\xff\x01", 6);
  std::string big(size_t{1} << 20, '\0');  // 1 MiB, exactly the default limit.
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 131 + i / 7) & 0xff);

  ASSERT_TRUE(client_.Set(Key("nuls"), with_nuls).ok());
  ASSERT_TRUE(client_.Set(Key("big"), big).ok());
  ASSERT_TRUE(client_.Set(Key("empty"), "").ok());

  std::string value;
  ASSERT_TRUE(client_.Get(Key("nuls"), milliseconds(1000), &value).ok());
  EXPECT_EQ(value, with_nuls);
  EXPECT_EQ(value.size(), 6u);
  grpc::Status status = client_.Get(Key("big"), milliseconds(1000), &value);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(value == big) << "1 MiB value changed on the way (size " << value.size() << ")";
  ASSERT_TRUE(client_.Get(Key("empty"), milliseconds(1000), &value).ok());
  EXPECT_EQ(value, "");

  // Overwrite.
  ASSERT_TRUE(client_.Set(Key("nuls"), "second").ok());
  ASSERT_TRUE(client_.Get(Key("nuls"), milliseconds(1000), &value).ok());
  EXPECT_EQ(value, "second");
}

TEST_F(StoreServiceTest, GetOfMissingKeyTimesOutNamingTheKey) {
  const auto start = Clock::now();
  grpc::Status status = client_.Get(Key("never"), milliseconds(200), nullptr);
  const auto elapsed = Clock::now() - start;

  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr(Key("never")));
  EXPECT_GE(elapsed, milliseconds(200));
  EXPECT_LT(elapsed, milliseconds(2000));
  EXPECT_EQ(service_.pending_waiters(), 0u);
}

TEST_F(StoreServiceTest, GetIsCappedByTheCallDeadline) {
  // No timeout (the 300 s default) but a 300 ms gRPC deadline: the waiter must not outlive it.
  const auto start = Clock::now();
  grpc::Status status =
      client_.Get(Key("never"), milliseconds(0), nullptr, /*deadline=*/milliseconds(300));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  EXPECT_TRUE(Eventually([&] { return service_.pending_waiters() == 0; }, milliseconds(2000)));
}

TEST_F(StoreServiceTest, GetBlocksUntilAnotherThreadSetsTheKey) {
  std::thread setter([&] {
    Client other(server_->NewChannel());
    // Set only once the Get is parked, so the Get cannot have seen the key at once.
    ASSERT_TRUE(Eventually([&] { return service_.pending_waiters() == 1; }));
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_TRUE(other.Set(Key("addr"), "10.0.0.7:29500").ok());
  });
  const auto start = Clock::now();
  std::string value;
  grpc::Status status = client_.Get(Key("addr"), milliseconds(5000), &value);
  const auto elapsed = Clock::now() - start;
  setter.join();

  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(value, "10.0.0.7:29500");
  EXPECT_GE(elapsed, milliseconds(100));
  EXPECT_LT(elapsed, milliseconds(4000));
  EXPECT_EQ(service_.pending_waiters(), 0u);
}

TEST_F(StoreServiceTest, WaitForThreeKeysSetByThreeThreads) {
  const std::vector<std::string> keys = {Key("rank0"), Key("rank1"), Key("rank2")};
  EXPECT_FALSE(client_.Check(keys));

  std::atomic<bool> wait_done{false};
  grpc::Status wait_status;
  std::thread waiter([&] {
    Client own(server_->NewChannel());
    wait_status = own.Wait(keys, milliseconds(5000));
    wait_done = true;
  });
  ASSERT_TRUE(Eventually([&] { return service_.pending_waiters() == 1; }));

  auto set_from_thread = [&](const std::string& key) {
    return std::thread([&, key] {
      Client own(server_->NewChannel());
      EXPECT_TRUE(own.Set(key, "up").ok());
    });
  };
  std::thread first = set_from_thread(keys[0]);
  std::thread second = set_from_thread(keys[1]);
  first.join();
  second.join();
  // Two of three: still blocked.
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(wait_done);
  EXPECT_EQ(service_.pending_waiters(), 1u);
  EXPECT_FALSE(client_.Check(keys));

  std::thread third = set_from_thread(keys[2]);
  third.join();
  waiter.join();
  EXPECT_TRUE(wait_status.ok()) << wait_status.error_message();
  EXPECT_TRUE(client_.Check(keys));
  EXPECT_EQ(service_.pending_waiters(), 0u);
}

TEST_F(StoreServiceTest, WaitTimeoutNamesOnlyTheMissingKeys) {
  ASSERT_TRUE(client_.Set(Key("present"), "x").ok());
  grpc::Status status =
      client_.Wait({Key("present"), Key("absent1"), Key("absent2")}, milliseconds(100));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(status.error_message(), HasSubstr(Key("absent1")));
  EXPECT_THAT(status.error_message(), HasSubstr(Key("absent2")));
  EXPECT_THAT(status.error_message(), Not(HasSubstr(Key("present"))));
}

TEST_F(StoreServiceTest, ConcurrentAddsCountExactly) {
  constexpr int kThreads = 16;
  constexpr int kAddsEach = 50;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      Client own(server_->NewChannel());
      for (int i = 0; i < kAddsEach; ++i) {
        if (!own.Add(Key("counter"), 1, nullptr).ok()) ++failures;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures, 0);

  int64_t value = -1;
  ASSERT_TRUE(client_.Add(Key("counter"), 0, &value).ok());
  EXPECT_EQ(value, kThreads * kAddsEach);
  std::string text;
  ASSERT_TRUE(client_.Get(Key("counter"), milliseconds(1000), &text).ok());
  EXPECT_EQ(text, "800");  // Decimal text, as c10d stores it.

  ASSERT_TRUE(client_.Add(Key("down"), -5, &value).ok());
  EXPECT_EQ(value, -5);
}

TEST_F(StoreServiceTest, AddOnNonIntegerIsFailedPrecondition) {
  ASSERT_TRUE(client_.Set(Key("name"), "not a number").ok());
  grpc::Status status = client_.Add(Key("name"), 1, nullptr);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr(Key("name")));
  std::string value;
  ASSERT_TRUE(client_.Get(Key("name"), milliseconds(1000), &value).ok());
  EXPECT_EQ(value, "not a number");  // Unchanged.
}

TEST_F(StoreServiceTest, AddWakesAGetBlockedOnTheCounter) {
  AsyncGets gets(&client_.stub(), {Key("arrivals")}, milliseconds(5000));
  ASSERT_TRUE(Eventually([&] { return service_.pending_waiters() == 1; }));
  ASSERT_TRUE(client_.Add(Key("arrivals"), 3, nullptr).ok());
  ASSERT_TRUE(gets.AwaitAll(milliseconds(5000)));
  EXPECT_TRUE(gets.status(0).ok()) << gets.status(0).error_message();
  EXPECT_EQ(gets.value(0), "3");
}

TEST_F(StoreServiceTest, DeletePrefixIsAPlainStringPrefixOfAnAttempt) {
  for (const char* key : {"jobs/a/attempts/1/x", "jobs/a/attempts/1/y/z", "jobs/a/attempts/10/x",
                          "jobs/a/attempts/2/x", "jobs/b/attempts/1/x", "jobs/ab/attempts/1/x"}) {
    ASSERT_TRUE(client_.Set(key, "v").ok()) << key;
  }
  int64_t deleted = -1;
  grpc::Status status = client_.DeletePrefix("jobs/a/attempts/1/", &deleted);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(deleted, 2);
  EXPECT_FALSE(client_.Check({"jobs/a/attempts/1/x"}));
  EXPECT_FALSE(client_.Check({"jobs/a/attempts/1/y/z"}));
  EXPECT_TRUE(client_.Check({"jobs/a/attempts/10/x", "jobs/a/attempts/2/x", "jobs/b/attempts/1/x",
                             "jobs/ab/attempts/1/x"}));

  // Idempotent.
  ASSERT_TRUE(client_.DeletePrefix("jobs/a/attempts/1/", &deleted).ok());
  EXPECT_EQ(deleted, 0);

  // Without the trailing slash the plain prefix would also match attempt 10: refused, as are
  // prefixes wider than one attempt.
  for (const char* prefix : {"jobs/a/attempts/1", "jobs/a/", "jobs/", ""}) {
    status = client_.DeletePrefix(prefix, &deleted);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << prefix;
    EXPECT_THAT(status.error_message(), HasSubstr("prefix")) << prefix;
  }
  EXPECT_TRUE(client_.Check({"jobs/a/attempts/10/x"}));

  // Narrower than an attempt is fine.
  ASSERT_TRUE(client_.DeletePrefix("jobs/a/attempts/10/x", &deleted).ok());
  EXPECT_EQ(deleted, 1);
  EXPECT_EQ(store_.size(), 3u);
}

TEST_F(StoreServiceTest, ManyBlockedGetsDoNotHoldServerThreads) {
  constexpr size_t kGets = 200;
  constexpr int kKeys = 10;
  std::vector<std::string> keys;
  for (size_t i = 0; i < kGets; ++i) keys.push_back(Key("addr" + std::to_string(i % kKeys)));

  const int threads_before = ThreadsInProcess();
  AsyncGets gets(&client_.stub(), keys, milliseconds(8000));
  ASSERT_TRUE(Eventually([&] { return service_.pending_waiters() == kGets; }))
      << "pending: " << service_.pending_waiters();
  const int threads_blocked = ThreadsInProcess();
  // A thread per blocked call would add 200 threads. gRPC's own pools grow with the core
  // count (up to ~2 per core), not with the calls, so allow well under one per call.
  EXPECT_LT(threads_blocked - threads_before, static_cast<int>(kGets) / 2)
      << "before " << threads_before << ", with " << kGets << " blocked: " << threads_blocked;
  EXPECT_EQ(gets.done(), 0u);

  // The server still answers other calls while 200 are parked.
  EXPECT_TRUE(client_.Check({}));

  for (int k = 0; k < kKeys; ++k) {
    ASSERT_TRUE(client_.Set(Key("addr" + std::to_string(k)), "host" + std::to_string(k)).ok());
  }
  ASSERT_TRUE(gets.AwaitAll(milliseconds(5000))) << gets.done() << " of " << kGets << " done";
  for (size_t i = 0; i < kGets; ++i) {
    ASSERT_TRUE(gets.status(i).ok()) << i << ": " << gets.status(i).error_message();
    EXPECT_EQ(gets.value(i), "host" + std::to_string(i % kKeys)) << i;
  }
  EXPECT_EQ(service_.pending_waiters(), 0u);
}

TEST_F(StoreServiceTest, ClientCancellingABlockedWaitRemovesItsWaiter) {
  grpc::ClientContext context;
  grpc::Status status;
  std::thread waiter([&] {
    Client own(server_->NewChannel());
    status = own.Wait({Key("never")}, milliseconds(8000), &context);
  });
  ASSERT_TRUE(Eventually([&] { return service_.pending_waiters() == 1; }));
  const auto start = Clock::now();
  context.TryCancel();
  waiter.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(Eventually([&] { return service_.pending_waiters() == 0; }, milliseconds(2000)))
      << "the server kept the cancelled waiter";
  EXPECT_LT(Clock::now() - start, milliseconds(2000));

  // The store still works for others.
  ASSERT_TRUE(client_.Set(Key("never"), "now").ok());
  EXPECT_TRUE(client_.Wait({Key("never")}, milliseconds(1000)).ok());
}

TEST_F(StoreServiceTest, InvalidArgumentsNameTheField) {
  grpc::Status status = client_.Set(Key("big"), std::string((size_t{1} << 20) + 1, 'x'));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("value"));
  EXPECT_FALSE(client_.Check({Key("big")}));

  status = client_.Set(Key(std::string(600, 'k')), "v");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("key"));

  status = client_.Set("", "v");
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("key"));

  // Outside any attempt's prefix.
  for (const char* key : {"MASTER_ADDR", "jobs/j1/x", "jobs/j1/attempts/one/x",
                          "jobs//attempts/1/x", "jobs/j1/attempts/1/"}) {
    status = client_.Set(key, "v");
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << key;
    EXPECT_THAT(status.error_message(), HasSubstr("key")) << key;
  }

  status = client_.Wait({Key("ok"), "bad"}, milliseconds(100));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("keys[1]"));
  status = client_.Get("bad", milliseconds(100), nullptr);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(service_.pending_waiters(), 0u);
}

TEST_F(StoreServiceTest, ShutdownWithWaitersPendingIsPromptAndUnavailable) {
  constexpr size_t kWaiters = 8;
  std::vector<std::string> keys;
  for (size_t i = 0; i < kWaiters; ++i) keys.push_back(Key("never" + std::to_string(i)));
  AsyncGets gets(&client_.stub(), keys, milliseconds(8000));
  ASSERT_TRUE(Eventually([&] { return service_.pending_waiters() == kWaiters; }));

  const auto start = Clock::now();
  service_.Shutdown();
  // A deadline longer than the test may take: only the service's Shutdown lets this be quick.
  server_->Shutdown(milliseconds(8000));
  const auto elapsed = Clock::now() - start;
  EXPECT_LT(elapsed, milliseconds(2000));

  ASSERT_TRUE(gets.AwaitAll(milliseconds(2000)));
  for (size_t i = 0; i < kWaiters; ++i) {
    EXPECT_EQ(gets.status(i).error_code(), grpc::StatusCode::UNAVAILABLE)
        << i << ": " << gets.status(i).error_message();
  }
  EXPECT_EQ(service_.pending_waiters(), 0u);
}

TEST_F(StoreServiceTest, ServerShutdownAloneCancelsWaiters) {
  // Without StoreService::Shutdown(), gRPC cancels the calls at the deadline; OnCancel must
  // still take them out of the store.
  AsyncGets gets(&client_.stub(), {Key("never")}, milliseconds(8000));
  ASSERT_TRUE(Eventually([&] { return service_.pending_waiters() == 1; }));
  const auto start = Clock::now();
  server_->Shutdown(milliseconds(100));
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  ASSERT_TRUE(gets.AwaitAll(milliseconds(2000)));
  EXPECT_FALSE(gets.status(0).ok());
  EXPECT_EQ(service_.pending_waiters(), 0u);
}

TEST(StoreServiceAuthorizationTest, EveryCallIsPutToTheAuthorizerFirst) {
  RendezvousStore store;
  std::atomic<int> asked{0};
  StoreService service(&store,
                       [&asked](const std::string& authorization) -> absl::StatusOr<std::string> {
                         ++asked;
                         if (authorization != "Bearer node") {
                           return absl::PermissionDeniedError("this takes a node token");
                         }
                         return std::string(kAnyKey);
                       });
  testing::TestGrpcServer server({&service});
  auto stub = v1::StoreService::NewStub(server.NewChannel());
  auto call = [&](const std::string& token, auto method, const auto& request, auto* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
    return ((*stub).*method)(&context, request, response);
  };
  v1::SetRequest set;
  set.set_key(Key("k"));
  set.set_value("v");
  v1::SetResponse set_response;
  v1::GetRequest get;
  get.set_key(Key("k"));
  v1::GetResponse get_response;
  v1::WaitRequest wait;
  wait.add_keys(Key("never"));
  v1::WaitResponse wait_response;
  for (const std::string token : {"", "tenant"}) {
    EXPECT_EQ(call(token, &v1::StoreService::Stub::Set, set, &set_response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    // Refused at once, not parked as a waiter until the key comes.
    EXPECT_EQ(call(token, &v1::StoreService::Stub::Get, get, &get_response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_EQ(call(token, &v1::StoreService::Stub::Wait, wait, &wait_response).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_EQ(service.pending_waiters(), 0u);
  EXPECT_FALSE(*store.Check({Key("k")})) << "a refused Set wrote nothing";
  ASSERT_TRUE(call("node", &v1::StoreService::Stub::Set, set, &set_response).ok());
  ASSERT_TRUE(call("node", &v1::StoreService::Stub::Get, get, &get_response).ok());
  EXPECT_EQ(get_response.value(), "v");
  EXPECT_EQ(asked.load(), 8);
}

// A caller confined to attempt 1 of job j1, as a job token is in gradhub-api.
absl::StatusOr<std::string> JobOneCaller(const std::string&) { return std::string(kPrefix); }

TEST(StoreServiceScopeTest, EveryKeyOfEveryMethodMustLieInTheCallersScope) {
  RendezvousStore store;
  ASSERT_TRUE(store.Set("jobs/j2/attempts/1/addr", "other job's").ok());
  StoreService service(&store, JobOneCaller);
  testing::TestGrpcServer server({&service});
  TokenClient rank(server.NewChannel(), "job");
  const std::string other = "jobs/j2/attempts/1/addr";
  // field, then the status of one call with a key outside the scope.
  const std::vector<std::pair<std::string, grpc::Status>> refused = {
      {"key: ", rank.Set(other, "forged")}, {"key: ", rank.Get(other)},
      {"key: ", rank.Add(other)},           {"keys[1]: ", rank.Wait({Key("mine"), other})},
      {"keys[0]: ", rank.Check({other})},   {"prefix: ", rank.DeletePrefix("jobs/")},
  };
  for (const auto& [field, status] : refused) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << field << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(field));
    EXPECT_THAT(status.error_message(), HasSubstr(kPrefix)) << "names what it may touch";
  }
  EXPECT_EQ(service.pending_waiters(), 0u) << "a refused Wait parked nothing";
  std::string kept;  // a present key completes inline
  store.Get(other, absl::Seconds(1), [&kept](absl::StatusOr<std::string> v) { kept = *v; });
  EXPECT_EQ(kept, "other job's");
  EXPECT_FALSE(*store.Check({Key("mine")}));
  // Its own keys, all methods.
  ASSERT_TRUE(rank.Set(Key("addr"), "mine").ok());
  std::string value;
  ASSERT_TRUE(rank.Get(Key("addr"), &value).ok());
  EXPECT_EQ(value, "mine");
  EXPECT_TRUE(rank.Add(Key("count")).ok());
  EXPECT_TRUE(rank.Wait({Key("addr"), Key("count")}).ok());
  EXPECT_TRUE(rank.Check({Key("addr")}).ok());
  EXPECT_TRUE(rank.DeletePrefix(kPrefix).ok());
  EXPECT_FALSE(*store.Check({Key("addr")}));
  EXPECT_TRUE(*store.Check({other})) << "its own DeletePrefix stays in its attempt";
}

// An Authorizer that blocks for one token until released, as a slow database would.
class GatedAuthorizer {
 public:
  absl::StatusOr<std::string> operator()(const std::string& authorization) {
    if (authorization == "Bearer slow") {
      std::unique_lock<std::mutex> lock(mu_);
      ++blocked_;
      changed_.notify_all();
      changed_.wait(lock, [this] { return open_; });
    }
    return std::string(kAnyKey);
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    changed_.notify_all();
  }
  bool AwaitBlocked(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(5), [&] { return blocked_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  int blocked_ = 0;
  bool open_ = false;
};

TEST(StoreServiceAuthorizationTest, ASlowAuthorizationHoldsUpNoOtherCall) {
  RendezvousStore store;
  GatedAuthorizer gate;
  StoreService service(&store, [&gate](const std::string& a) { return gate(a); });
  testing::TestGrpcServer server({&service});
  TokenClient slow(server.NewChannel(), "slow");
  TokenClient fast(server.NewChannel(), "fast");
  grpc::Status slow_set;
  std::thread blocked([&] { slow_set = slow.Set(Key("slow"), "late"); });
  ASSERT_TRUE(gate.AwaitBlocked(1));
  // The queue thread is free: other callers' Set, Get and a Get that blocks, then wakes.
  ASSERT_TRUE(fast.Set(Key("a"), "1").ok());
  std::string value;
  ASSERT_TRUE(fast.Get(Key("a"), &value).ok());
  EXPECT_EQ(value, "1");
  std::thread waiting([&] { EXPECT_TRUE(fast.Get(Key("b")).ok()); });
  ASSERT_TRUE(Eventually([&] { return service.pending_waiters() == 1; }));
  ASSERT_TRUE(fast.Set(Key("b"), "2").ok());
  waiting.join();
  EXPECT_FALSE(*store.Check({Key("slow")}));
  gate.Open();
  blocked.join();
  EXPECT_TRUE(slow_set.ok()) << slow_set.error_message();
  EXPECT_TRUE(*store.Check({Key("slow")}));
}

TEST(StoreServiceAuthorizationTest, ACallThatEndsWhileBeingAuthorizedNeverReachesTheStore) {
  RendezvousStore store;
  GatedAuthorizer gate;
  StoreService service(&store, [&gate](const std::string& a) { return gate(a); });
  auto server = std::make_unique<testing::TestGrpcServer>(std::vector<AsyncGrpcService*>{&service});
  TokenClient impatient(server->NewChannel(), "slow", milliseconds(200));
  EXPECT_EQ(impatient.Set(Key("k")).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(impatient.Get(Key("never")).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(gate.AwaitBlocked(2));
  gate.Open();
  // Both records finish (the server's shutdown waits for them) without touching the store.
  server.reset();
  EXPECT_FALSE(*store.Check({Key("k")}));
  EXPECT_EQ(service.pending_waiters(), 0u) << "no Get parked for a client that left";
}

TEST(TestGrpcServerTest, ServersGetDistinctFreePorts) {
  RendezvousStore store;
  StoreService service_a(&store, AnyCaller);
  StoreService service_b(&store, AnyCaller);
  testing::TestGrpcServer a({&service_a});
  testing::TestGrpcServer b({&service_b});
  EXPECT_GT(a.port(), 0);
  EXPECT_NE(a.port(), b.port());
  EXPECT_EQ(a.address(), "127.0.0.1:" + std::to_string(a.port()));
}

// RendezvousStore alone, over each backend: rendezvous_store_test.cc.

}  // namespace
}  // namespace gradhub::api
