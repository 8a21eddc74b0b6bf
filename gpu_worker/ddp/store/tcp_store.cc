#include "gpu_worker/ddp/store/tcp_store.h"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <utility>

#include <c10/util/Exception.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "gpu_worker/ddp/store/poller.h"
#include "gpu_worker/ddp/store/store_errors.h"

namespace gradhub::ddp {
namespace {

using std::chrono::milliseconds;

// What Get compares keys against: compareSet(key, kAbsent, kAbsent) returns a present key's
// value and leaves it as it is, and returns kAbsent, creating nothing, for a missing key. The
// bytes only have to be a value nobody sets; one that does is told apart by a Check.
const std::vector<uint8_t> kAbsent = {0,   'g', 'r', 'a', 'd', 'h', 'u', 'b',
                                      ':', 'a', 'b', 's', 'e', 'n', 't', 0};

// See CheckOptions.
constexpr milliseconds kMinTimeout = std::chrono::seconds(1);

std::vector<uint8_t> Bytes(const std::string& text) { return {text.begin(), text.end()}; }

std::string Text(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

std::string Endpoint(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string KeyList(const std::vector<std::string>& keys) {
  std::string text;
  for (size_t i = 0; i < keys.size(); ++i) text += (i == 0 ? "" : ", ") + keys[i];
  return text;
}

// The message of the exception being handled; c10::Error's without its C++ backtrace.
std::string CurrentErrorText() {
  try {
    throw;
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

void CheckOptions(const TcpStoreOptions& options) {
  auto refuse = [](const std::string& field, const std::string& why) {
    throw std::invalid_argument("TcpStoreOptions." + field + ": " + why);
  };
  if (options.host.empty()) refuse("host", "must name the server (torchrun's MASTER_ADDR)");
  const int lowest = options.is_server ? 0 : 1;
  if (options.port < lowest || options.port > 65535) {
    refuse("port", std::to_string(options.port) + " is not a port: " +
                       (options.is_server ? "a server takes 1-65535, or 0 for a free one"
                                          : "a client needs the server's port, 1-65535"));
  }
  if (options.world_size == 0 || options.world_size < -1) {
    refuse("world_size",
           "must be at least 1, or -1 when unknown; got " + std::to_string(options.world_size));
  }
  if (options.timeout < kMinTimeout) {
    refuse("timeout",
           "must be at least 1000 ms (libtorch 1.13's c10d cuts a connect timeout "
           "to whole seconds, so under 1 s it cannot connect even to a server that "
           "is up); got " +
               std::to_string(options.timeout.count()) + " ms");
  }
}

c10::intrusive_ptr<c10d::TCPStore> Open(const TcpStoreOptions& options) {
  c10d::TCPStoreOptions c10d_options;
  c10d_options.port = static_cast<std::uint16_t>(options.port);
  c10d_options.isServer = options.is_server;
  if (options.world_size > 0) c10d_options.numWorkers = static_cast<size_t>(options.world_size);
  c10d_options.waitWorkers = true;
  c10d_options.timeout = options.timeout;
  c10d_options.multiTenant = true;  // As torch.distributed's rendezvous asks: see the header.
  try {
    return c10::make_intrusive<c10d::TCPStore>(options.host, c10d_options);
  } catch (...) {
    const std::string endpoint = Endpoint(options.host, options.port);
    throw StoreError(options.is_server
                         ? "cannot host a TCPStore on " + endpoint + ": " + CurrentErrorText()
                         : "cannot connect to the TCPStore at " + endpoint + " within " +
                               std::to_string(options.timeout.count()) +
                               " ms: " + CurrentErrorText());
  }
}

}  // namespace

// One c10d client (and the server, when hosting). Every call goes through Run, so that
// whatever c10d throws (c10::Error, c10d::C10dError, std::runtime_error) reaches the caller
// as StoreError naming the server and the operation.
class TcpStore::Connection {
 public:
  explicit Connection(const TcpStoreOptions& options)
      : store_(Open(options)), endpoint_(Endpoint(options.host, store_->getPort())) {}

  template <typename Call>
  auto Run(const std::string& operation, Call&& call)
      -> decltype(call(std::declval<c10d::TCPStore&>())) {
    try {
      return call(*store_);
    } catch (...) {
      throw StoreError("TCPStore at " + endpoint_ + ": " + operation +
                       " failed: " + CurrentErrorText());
    }
  }

  // The value of `key`, or nullopt when it is not set; never blocks on the key.
  std::optional<std::string> Peek(const std::string& key) {
    std::vector<uint8_t> value = Read(key);
    if (value != kAbsent) return Text(value);
    if (!Check({key})) return std::nullopt;
    // Set since the read, or set to kAbsent itself: a key once set stays set (no engine code
    // deletes keys), so a second read returns its value either way.
    return Text(Read(key));
  }

  bool Check(const std::vector<std::string>& keys) {
    if (keys.empty()) return true;
    return Run("check of keys " + KeyList(keys), [&](c10d::TCPStore& s) { return s.check(keys); });
  }

  std::vector<std::string> Missing(const std::vector<std::string>& keys) {
    std::vector<std::string> missing;
    for (const auto& key : keys) {
      if (!Check({key})) missing.push_back(key);
    }
    return missing;
  }

  int port() const { return store_->getPort(); }

 private:
  // compareSet(key, kAbsent, kAbsent): the value, or kAbsent when the key is missing.
  std::vector<uint8_t> Read(const std::string& key) {
    return Run("read of key " + key,
               [&](c10d::TCPStore& s) { return s.compareSet(key, kAbsent, kAbsent); });
  }

  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::string endpoint_;
};

TcpStore::TcpStore(const TcpStoreOptions& options) {
  CheckOptions(options);
  connection_ = std::make_unique<Connection>(options);
}

TcpStore::~TcpStore() = default;

void TcpStore::Set(const std::string& key, const std::string& value) {
  connection_->Run("set of key " + key, [&](c10d::TCPStore& s) {
    s.set(key, Bytes(value));
    s.check({key});  // The reply means the server has applied the set (header, step 1).
  });
}

std::string TcpStore::Get(const std::string& key, milliseconds timeout) {
  Poller poller(timeout);
  while (true) {
    if (auto value = connection_->Peek(key)) return *std::move(value);
    if (!poller.Sleep()) throw StoreTimeoutError(DescribeTimeout({key}, timeout));
  }
}

int64_t TcpStore::Add(const std::string& key, int64_t delta) {
  // Refuse what c10d's server would misparse or drop the connection over (header, step 3).
  if (auto value = connection_->Peek(key)) ParseCounter(key, *value);
  return connection_->Run("add to key " + key,
                          [&](c10d::TCPStore& s) { return s.add(key, delta); });
}

void TcpStore::Wait(const std::vector<std::string>& keys, milliseconds timeout) {
  Poller poller(timeout);
  while (!connection_->Check(keys)) {
    if (poller.Sleep()) continue;
    std::vector<std::string> missing = connection_->Missing(keys);
    if (missing.empty()) return;  // They came after the last look.
    throw StoreTimeoutError(DescribeTimeout(missing, timeout));
  }
}

bool TcpStore::Check(const std::vector<std::string>& keys) { return connection_->Check(keys); }

int64_t TcpStore::DeletePrefix(const std::string& prefix) {
  throw std::logic_error("TcpStore cannot delete keys by prefix (\"" + prefix +
                         "\"): c10d's TCPStore cannot list its keys, and other ranks' keys are "
                         "unknown to this client; use a FileStore or the platform store");
}

int TcpStore::port() const { return connection_->port(); }

std::shared_ptr<Store> MakeTcpStore(const TcpStoreOptions& options) {
  return std::make_shared<TcpStore>(options);
}

}  // namespace gradhub::ddp
