#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/common/db/connection.h"

namespace gradhub::db {

struct PoolOptions {
  ConnectionOptions connection;
  // Upper bound on open connections; Acquire waits for a free one beyond it.
  int max_connections = 8;
  absl::Duration acquire_timeout = absl::Seconds(10);
  // While the database is unreachable, the pool tries one connect this often, each given at
  // most this long (and connection.connect_timeout): a connect that started while packets
  // were still dropped would otherwise wait out TCP's SYN backoff after they flow again.
  absl::Duration reconnect_interval = absl::Seconds(1);
};

enum class Isolation { kReadCommitted, kRepeatableRead, kSerializable };

struct TransactionOptions {
  Isolation isolation = Isolation::kReadCommitted;
  bool read_only = false;
  // false: COMMIT returns without waiting for the WAL flush (synchronous_commit = off for this
  // transaction only), for writes a crash of PostgreSQL may lose the last moment of. Set in
  // the same round trip as BEGIN.
  bool synchronous_commit = true;
  // Attempts in all, for serialization failures, deadlocks and connections lost before
  // COMMIT; the delay between attempts grows from 20 ms to 1 s, with jitter.
  int max_attempts = 10;
};

// The statements of one transaction. Only valid inside the body passed to Pool::Transact.
class Transaction {
 public:
  absl::StatusOr<Result> Exec(std::string_view sql, absl::Span<const Param> params = {}) {
    return connection_->Exec(sql, params);
  }

 private:
  friend class Pool;
  explicit Transaction(Connection* connection) : connection_(connection) {}
  Connection* connection_;
};

// A bounded pool of connections to one database. Thread-safe.
//
// Reachability. A database whose packets are dropped answers nothing, and every call that
// tries it learns that only after a timeout (connection.h). So that the server answers its own
// callers at once instead of hanging them all, the pool remembers:
//   1. A call that meets silence (a connect timed out, or the kernel dropped an open
//      connection as unanswered: Connection::silent) marks the database unreachable: the idle
//      connections are closed (they share its fate), waiters in Acquire wake, one line is logged.
//   2. While it is unreachable, Acquire fails at once with UNAVAILABLE saying for how long
//      (error.h IsSilence), and nothing retries it.
//   3. A thread of the pool tries one connect every reconnect_interval; the first that
//      succeeds goes to the idle list and ends the outage (logged with its length).
//   4. A refused connect or a reset connection marks nothing: the server's host answered, so
//      trying again costs nothing, and a restarting server is back within a retry or two.
// Every failure to reach the database, of either kind, is recorded (last_unreachable).
//
// Retries: Transact runs the body again from BEGIN after a serialization failure, a deadlock,
// or a connection lost before COMMIT was sent (the server rolled the transaction back), but not
// after silence (step 2: it would only wait as long again). A connection lost or silent during
// COMMIT leaves the outcome unknown: that is returned as UNAVAILABLE and not retried, so a body
// runs to a commit at most once, and nothing unknown is reported as done. Callers that must survive
// it make the write idempotent (e.g. CreateJob's unique request_id).
class Pool {
 public:
  explicit Pool(PoolOptions options);
  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  // A connection held exclusively until the Lease is destroyed. A broken connection, or one
  // left inside a transaction, is closed instead of being returned to the pool.
  class Lease {
   public:
    Lease(Lease&& other) noexcept : pool_(other.pool_), connection_(std::move(other.connection_)) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    Connection* operator->() { return connection_.get(); }
    Connection& operator*() { return *connection_; }

   private:
    friend class Pool;
    Lease(Pool* pool, std::unique_ptr<Connection> connection)
        : pool_(pool), connection_(std::move(connection)) {}
    Pool* pool_;
    std::unique_ptr<Connection> connection_;
  };

  // Waits up to acquire_timeout for a free connection (RESOURCE_EXHAUSTED after it); UNAVAILABLE
  // at once while the database is unreachable.
  absl::StatusOr<Lease> Acquire();

  // Runs `body(Transaction&)` between BEGIN and COMMIT; a non-OK status from the body rolls
  // back and is returned. The body returns absl::Status or absl::StatusOr<T>, and so does this.
  template <typename Body>
  std::invoke_result_t<Body, Transaction&> Transact(Body&& body,
                                                    const TransactionOptions& options = {});

  // One statement outside an explicit transaction, retried like a transaction on conflicts
  // and lost connections: only for statements that are safe to run twice (reads, upserts).
  absl::StatusOr<Result> Exec(std::string_view sql, absl::Span<const Param> params = {});

  // One statement, once, given `budget` in all (a free connection, a connect and the answer):
  // for health checks, which must answer in time whatever the database does. DEADLINE_EXCEEDED
  // when it did not answer in time; UNAVAILABLE at once while it is unreachable.
  absl::StatusOr<Result> ExecWithin(absl::Duration budget, std::string_view sql,
                                    absl::Span<const Param> params = {});

  // Open connections, leased and idle, for tests and metrics.
  int size() const;

  // When a call last failed to reach the database (a connect failed, a connection was lost,
  // or a call was failed at once during an outage); absl::InfinitePast() if never. The
  // scheduler's node lease counts only time after it (scheduling_rules.h).
  absl::Time last_unreachable() const;
  // Whether the pool fails calls at once now (Reachability step 2).
  bool unreachable() const;

 private:
  // Acquire, waiting for a free connection until `wait_until`; a connect it opens ends at
  // `connect_deadline` as the caller's deadline.
  absl::StatusOr<Lease> AcquireUntil(absl::Time wait_until, absl::Time connect_deadline);
  // What a call gets while the database is unreachable. `mu_` held.
  absl::Status UnreachableStatus();
  // Reachability step 1; `details` says what was silent, for the log. Takes `mu_`.
  void NoteSilence(const std::string& details);
  // Reachability step 3, on reconnector_.
  void Reconnect();
  // Runs `attempt` until it succeeds, fails for good, or max_attempts is reached; `attempt`
  // sets *commit_sent once the outcome of a failure may be a committed transaction.
  absl::Status WithRetries(int max_attempts,
                           absl::FunctionRef<absl::Status(bool* commit_sent)> attempt);
  absl::Status RunTransaction(absl::FunctionRef<absl::Status(Transaction&)> body,
                              const TransactionOptions& options);
  void Release(std::unique_ptr<Connection> connection);
  // Closes every idle connection: after one connection was lost, the others most likely
  // point at the same dead server, and reusing them would burn one retry each.
  void DiscardIdle();

  const PoolOptions options_;
  mutable std::mutex mu_;
  std::condition_variable released_;  // also: the database became unreachable
  std::deque<std::unique_ptr<Connection>> idle_;
  int open_ = 0;  // idle + leased + being opened
  absl::Time last_unreachable_ = absl::InfinitePast();
  // Reachability: set from step 1 to step 3; since when, and whether reconnector_ runs.
  bool unreachable_ = false;
  absl::Time unreachable_since_;
  bool reconnecting_ = false;
  bool stopping_ = false;         // the destructor ends reconnector_
  std::condition_variable stop_;  // wakes reconnector_ for it
  std::thread reconnector_;
};

template <typename Body>
std::invoke_result_t<Body, Transaction&> Pool::Transact(Body&& body,
                                                        const TransactionOptions& options) {
  using Returned = std::invoke_result_t<Body, Transaction&>;
  if constexpr (std::is_same_v<Returned, absl::Status>) {
    return RunTransaction(body, options);
  } else {
    std::optional<Returned> value;
    absl::Status status = RunTransaction(
        [&](Transaction& tx) {
          value.emplace(body(tx));
          return value->status();
        },
        options);
    if (!status.ok()) return status;
    return std::move(*value);
  }
}

}  // namespace gradhub::db
