// TcpStore (torch's c10d TCPStore) against the Store contract (store_conformance.h), then what
// is particular to it: binding and connecting errors, world_size, a client and its server in
// different threads, and interop with torch.distributed's TCPStore in Python.
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_worker/ddp/store/prefix_store.h"
#include "gpu_worker/ddp/store/tcp_store.h"
#include "tests/unit/ddp/store_conformance.h"

namespace gradhub::ddp {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using std::chrono::steady_clock;

constexpr char kHost[] = "127.0.0.1";

TcpStoreOptions Options(int port, bool is_server, int world_size = -1,
                        milliseconds timeout = seconds(10)) {
  TcpStoreOptions options;
  options.host = kHost;
  options.port = port;
  options.world_size = world_size;
  options.is_server = is_server;
  options.timeout = timeout;
  return options;
}

std::string Endpoint(int port) { return std::string(kHost) + ":" + std::to_string(port); }

// A socket listening on a loopback port the kernel picked; closed with the object.
class Listener {
 public:
  Listener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof(address);
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&address), size) != 0 ||
        ::listen(fd_, 1) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
      throw std::runtime_error("cannot listen on a loopback port");
    }
    port_ = ntohs(address.sin_port);
  }
  ~Listener() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A port nothing listens on (nothing did a moment ago: the kernel does not hand out a port
// it just freed again soon, so another test taking it meanwhile is unlikely).
int FreePort() { return Listener().port(); }

std::shared_ptr<Store> MakeServer() { return MakeTcpStore(Options(0, /*is_server=*/true)); }

// A client whose server (another TcpStore, with its own threads) lives as long as it does.
std::shared_ptr<Store> MakeClientOfOwnServer() {
  auto server = std::make_shared<TcpStore>(Options(0, /*is_server=*/true));
  auto* client = new TcpStore(Options(server->port(), /*is_server=*/false));
  return std::shared_ptr<Store>(client, [server](Store* store) { delete store; });
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreConformanceTest,
                         ::testing::Values(StoreFactory{"TcpServer", MakeServer,
                                                        /*deletes_by_prefix=*/false},
                                           StoreFactory{"TcpClient", MakeClientOfOwnServer, false},
                                           StoreFactory{"PrefixOverTcpClient",
                                                        [] {
                                                          return std::make_shared<PrefixStore>(
                                                              MakeClientOfOwnServer(), "p/q");
                                                        },
                                                        false}),
                         StoreFactoryName);

// Runs `fn` on another thread; an exception fails the test instead of ending the binary.
std::thread Spawn(std::function<void()> fn) {
  return std::thread([fn = std::move(fn)] {
    try {
      fn();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "thread threw: " << e.what();
    }
  });
}

template <typename Fn>
milliseconds TimeOf(Fn&& fn) {
  auto start = steady_clock::now();
  fn();
  return std::chrono::duration_cast<milliseconds>(steady_clock::now() - start);
}

TEST(TcpStore, ClientsOfOneServerSeeEachOthersKeys) {
  TcpStore server(Options(0, true));
  EXPECT_GT(server.port(), 0);  // Port 0 asked for a free one.
  TcpStore a(Options(server.port(), false)), b(Options(server.port(), false));
  a.Set("rank/0", "addr0");
  EXPECT_EQ(b.Get("rank/0", seconds(1)), "addr0");
  EXPECT_EQ(server.Get("rank/0", seconds(1)), "addr0");
  EXPECT_EQ(a.Add("n", 2), 2);
  EXPECT_EQ(b.Add("n", 3), 5);
  std::thread setter = Spawn([&] {
    std::this_thread::sleep_for(milliseconds(50));
    server.Set("late", "x");
  });
  EXPECT_NO_THROW(b.Wait({"rank/0", "late"}, seconds(5)));
  setter.join();
}

// c10d's set has no reply; TcpStore's Set returns once the server has the value.
TEST(TcpStore, ASetIsSeenByOtherConnectionsAtOnce) {
  TcpStore server(Options(0, true));
  // The reader connects first: c10d's server serves ready connections in the order they
  // came, so without Set's reply the reader's Check would be served before the writer's set.
  TcpStore b(Options(server.port(), false)), a(Options(server.port(), false));
  for (int i = 0; i < 200; ++i) {
    const std::string key = "k" + std::to_string(i);
    a.Set(key, "v");
    ASSERT_TRUE(b.Check({key})) << key;
  }
}

// The shortest timeout TcpStoreOptions takes (c10d, under 1 s, cannot connect at all).
TEST(TcpStore, AOneSecondTimeoutConnects) {
  TcpStore server(Options(0, true));
  TcpStore client(Options(server.port(), false, -1, seconds(1)));
  client.Set("k", "v");
  EXPECT_EQ(server.Get("k", seconds(1)), "v");
}

// c10d's own wait would hold the connection for its whole timeout and, once timed out, leave
// its reply in flight for the next call to misread (tcp_store.h, step 2).
TEST(TcpStore, AWaitingGetNeitherBlocksOtherCallsNorSpoilsTheConnection) {
  TcpStore server(Options(0, true));
  TcpStore client(Options(server.port(), false));
  EXPECT_THROW(client.Get("never", milliseconds(50)), StoreTimeoutError);
  client.Set("after", "ok");
  EXPECT_EQ(client.Get("after", seconds(1)), "ok");
  EXPECT_EQ(client.Add("count", 1), 1);

  std::thread waiter = Spawn([&] { EXPECT_EQ(client.Get("slow", seconds(5)), "done"); });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_LT(TimeOf([&] { client.Set("other", "v"); }), milliseconds(500));
  EXPECT_LT(TimeOf([&] { client.Check({"other"}); }), milliseconds(500));
  client.Set("slow", "done");
  waiter.join();
}

TEST(TcpStore, AServerOnATakenPortFailsNamingHostAndPort) {
  Listener taken;
  try {
    TcpStore server(Options(taken.port(), true));
    FAIL() << "a server started on a port that is in use";
  } catch (const StoreError& e) {
    EXPECT_NE(std::string(e.what()).find(Endpoint(taken.port())), std::string::npos) << e.what();
  }
}

TEST(TcpStore, ConnectingToNothingFailsWithinTheTimeout) {
  const int port = FreePort();
  milliseconds elapsed = TimeOf([&] {
    try {
      TcpStore client(Options(port, false, -1, seconds(2)));
      ADD_FAILURE() << "connected to a port nothing listens on";
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find(Endpoint(port)), std::string::npos) << e.what();
    }
  });
  EXPECT_LT(elapsed, seconds(4));
}

TEST(TcpStore, AServerWaitsForWorldSizeStoresToConnect) {
  const int port = FreePort();
  std::unique_ptr<TcpStore> client;
  std::thread late_rank = Spawn([&] {
    std::this_thread::sleep_for(milliseconds(300));
    client = std::make_unique<TcpStore>(Options(port, false, /*world_size=*/2));
  });
  milliseconds elapsed = TimeOf([&] { TcpStore server(Options(port, true, 2)); });
  late_rank.join();
  EXPECT_GE(elapsed, milliseconds(250));
  EXPECT_LT(elapsed, seconds(5));
}

TEST(TcpStore, CallsAfterTheServerIsGoneFailWithStoreError) {
  auto server = std::make_unique<TcpStore>(Options(0, true));
  const int port = server->port();
  TcpStore client(Options(port, false));
  client.Set("k", "v");
  server.reset();
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      client.Add("k2", 1);
      ADD_FAILURE() << "Add reached a server that is gone";
    } catch (const StoreTimeoutError& e) {
      ADD_FAILURE() << "a lost server is not a timeout: " << e.what();
    } catch (const StoreError& e) {
      EXPECT_NE(std::string(e.what()).find(Endpoint(port)), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(client.Get("k", seconds(1)), StoreError);
}

TEST(TcpStore, DeletePrefixIsRefusedSayingWhy) {
  TcpStore server(Options(0, true));
  try {
    server.DeletePrefix("jobs/");
    FAIL() << "DeletePrefix returned";
  } catch (const std::logic_error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot delete keys by prefix"), std::string::npos);
  }
}

TEST(TcpStore, BadOptionsAreRefusedNamingTheField) {
  struct Case {
    std::string field;
    std::function<void(TcpStoreOptions&)> spoil;
  };
  const std::vector<Case> cases = {
      {"host", [](auto& o) { o.host.clear(); }},
      {"port", [](auto& o) { o.port = 0; }},  // A client must name the server's port.
      {"port", [](auto& o) { o.port = 65536; }},
      {"port", [](auto& o) { o.port = -1; }},
      {"world_size", [](auto& o) { o.world_size = 0; }},
      {"world_size", [](auto& o) { o.world_size = -2; }},
      {"timeout", [](auto& o) { o.timeout = milliseconds(0); }},
      {"timeout", [](auto& o) { o.timeout = milliseconds(999); }},  // c10d could not connect.
  };
  for (const auto& c : cases) {
    TcpStoreOptions options = Options(1, false);
    c.spoil(options);
    try {
      TcpStore store(options);
      ADD_FAILURE() << "options with a bad " << c.field << " were taken";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("TcpStoreOptions." + c.field), std::string::npos)
          << e.what();
    }
  }
}

// ---- torch.distributed's TCPStore in Python on the other side ----

// tcp_store_interop.py run by /usr/bin/python3 (Debian's, with torch), its stdout piped here.
class PythonPeer {
 public:
  explicit PythonPeer(const std::string& args) {
    const std::string command = "OPENBLAS_NUM_THREADS=1 /usr/bin/python3 '" GRADHUB_SOURCE_DIR
                                "/tests/unit/ddp/tcp_store_interop.py' " +
                                args;
    pipe_ = ::popen(command.c_str(), "r");
    if (pipe_ == nullptr) throw std::runtime_error("cannot start " + command);
  }
  ~PythonPeer() {
    if (pipe_ != nullptr) ::pclose(pipe_);
  }

  std::string ReadLine() {
    char line[256] = {};
    if (::fgets(line, sizeof(line), pipe_) == nullptr) return "";
    return line;
  }

  // The exit code; waits for the exit.
  int Finish() {
    int status = ::pclose(pipe_);
    pipe_ = nullptr;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  FILE* pipe_ = nullptr;
};

class TcpStoreInterop : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    has_torch_ = std::system("/usr/bin/python3 -c 'import torch.distributed' >/dev/null 2>&1") == 0;
  }
  void SetUp() override {
    if (!has_torch_) GTEST_SKIP() << "/usr/bin/python3 cannot import torch.distributed";
  }

  static inline const std::string kFromCpp{"he\0llo\xff", 7};  // As tcp_store_interop.py has it.
  static inline bool has_torch_ = false;
};

// torchrun's env:// with gradhub as rank 0: torch's worker connects to the server we host.
TEST_F(TcpStoreInterop, TorchWorkerOfOurServer) {
  const int port = FreePort();
  PythonPeer worker("client " + std::to_string(port));
  // Returns once the worker, world_size 2 like us, has counted itself in.
  TcpStore server(Options(port, true, /*world_size=*/2, seconds(20)));
  EXPECT_EQ(server.Add("counter", 2), 2);
  server.Set("from_cpp", kFromCpp);
  EXPECT_EQ(server.Get("from_py", seconds(20)), std::string("world\0", 6));
  EXPECT_EQ(server.Get("counter", seconds(1)), "5");
  EXPECT_EQ(worker.Finish(), 0);
}

// TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent (torch, world size unknown) hosts the
// store and every gradhub rank is a client.
TEST_F(TcpStoreInterop, OurClientOfTorchsServer) {
  PythonPeer agent("server");
  const int port = std::atoi(agent.ReadLine().c_str());
  ASSERT_GT(port, 0) << "the Python server printed no port";
  TcpStore client(Options(port, false, /*world_size=*/2, seconds(20)));
  EXPECT_EQ(client.Get("from_py", seconds(20)), std::string("\0agent", 6));
  EXPECT_EQ(client.Add("counter", 1), 11);
  client.Set("from_cpp", kFromCpp);
  client.Set("cpp/done", "1");
  EXPECT_EQ(agent.Finish(), 0);
}

}  // namespace
}  // namespace gradhub::ddp
