#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/ddp/store.h"

namespace gradhub::ddp {

struct TcpStoreOptions {
  // The server's address (torchrun's MASTER_ADDR). Clients connect to it; a server connects
  // its own client to it but listens on every interface, as c10d does.
  std::string host;
  // The server's port (MASTER_PORT), 1-65535. A server may give 0 to take a free port, which
  // TcpStore::port() then reports.
  int port = 0;
  // How many ranks will connect, or -1 when unknown. When known, every store counts itself in
  // c10d's "init/" key, and the server's constructor returns once all have (or `timeout` has
  // passed: c10d then goes on without an error), so that rank 0 cannot take the server down
  // before the others have reached it. torch.distributed's env:// and tcp:// do the same.
  int world_size = -1;
  // Whether this store hosts the server (rank 0, unless torchrun's agent hosts it:
  // TORCHELASTIC_USE_AGENT_STORE=True).
  bool is_server = false;
  // How long a client keeps trying to connect (c10d retries while the server is not up yet),
  // and how long any request waits for its reply. At least 1 s: libtorch 1.13's c10d
  // truncates the connect timeout to whole seconds and fails at once under 1 s. Get and Wait
  // take their own timeouts.
  std::chrono::milliseconds timeout = kDefaultStoreTimeout;
};

// torch's TCPStore (libtorch's c10d::TCPStore) as a gradhub Store: the store torchrun's
// MASTER_ADDR/MASTER_PORT name, so gradhub ranks, torch.distributed and torchrun's agent can
// share one. Keys and values are c10d's: a Python torch.distributed.TCPStore on the same
// host:port sees every key set here and vice versa, and counters are decimal text on both
// sides.
//
// How each call maps onto c10d (one request and reply per c10d call, in order on one
// connection, which c10d serializes with a lock):
//   1. Check is c10d's check. Set is c10d's set followed by a check of the key: c10d's set has
//      no reply, so without one Set could return before the server has the value, and a
//      Check on another connection (another thread's store, torch's in Python) right after
//      would not see it.
//   2. Get and Wait poll (poller.h) instead of calling c10d's wait, for two reasons: c10d's
//      wait holds the connection's lock until the keys come, so every other thread's call on
//      this store would block behind it; and a wait that times out leaves its reply in flight,
//      so the next call on the connection reads the wrong reply and fails ("Socket Timeout").
//      Get looks with compareSet(key, kAbsent, kAbsent), which returns the value without
//      blocking and, when the key is missing, returns kAbsent and creates nothing. On kAbsent
//      a Check tells a missing key from one set meanwhile (or set to kAbsent itself), whose
//      value a second compareSet then returns.
//   3. Add reads the key first and refuses a non-counter value itself: c10d's server parses
//      with std::stoll, so it would take "12abc" for 12, and on "hello" it drops the
//      connection, leaving this store unusable. A Set of a non-counter to the same key between
//      the read and the add is not caught (mixing values and counters on one key is the
//      caller's bug).
//   4. DeletePrefix is refused with std::logic_error: c10d's protocol cannot list keys, and a
//      list of the keys set through this client would miss every key other ranks set, so any
//      answer would be a silent partial delete. No engine code deletes by prefix (the job
//      API's RendezvousStore does, server-side, for its own attempts' keys).
//
// Servers are multi-tenant (as torch.distributed's are): a second server on the same port in
// the same process, this one or torch's in Python, shares the first one's keys instead of
// failing to bind. The server lives as long as the TcpStore that hosts it; after that the
// other ranks' calls fail with StoreError.
//
// Errors: StoreTimeoutError when Get or Wait run out of time, naming the missing keys;
// StoreError naming host:port for everything else (cannot bind, cannot connect within
// `timeout`, connection lost, Add on a value); std::invalid_argument for bad options, naming
// the field. Thread-safe.
class TcpStore final : public Store {
 public:
  // Connects (and hosts, when `is_server`); blocks as TcpStoreOptions::world_size says.
  explicit TcpStore(const TcpStoreOptions& options);
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void Set(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t Add(const std::string& key, int64_t delta) override;
  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool Check(const std::vector<std::string>& keys) override;
  int64_t DeletePrefix(const std::string& prefix) override;

  // The server's port: the one that was picked when a server was asked for port 0.
  int port() const;

 private:
  class Connection;  // c10d's TCPStore and the translation of its errors; keeps torch out.
  std::unique_ptr<Connection> connection_;
};

// A TcpStore as the engine's Store (gradhub._C.tcp_store).
std::shared_ptr<Store> MakeTcpStore(const TcpStoreOptions& options);

}  // namespace gradhub::ddp
