#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
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
};

enum class Isolation { kReadCommitted, kRepeatableRead, kSerializable };

struct TransactionOptions {
  Isolation isolation = Isolation::kReadCommitted;
  bool read_only = false;
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
// Retries: Transact runs the body again from BEGIN after a serialization failure, a deadlock,
// or a connection lost before COMMIT was sent (the server rolled the transaction back). A
// connection lost during COMMIT leaves the outcome unknown: that is returned as UNAVAILABLE and
// not retried, so a body runs to a commit at most once. Callers that must survive it make the
// write idempotent (e.g. CreateJob's unique request_id).
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

  absl::StatusOr<Lease> Acquire();

  // Runs `body(Transaction&)` between BEGIN and COMMIT; a non-OK status from the body rolls
  // back and is returned. The body returns absl::Status or absl::StatusOr<T>, and so does this.
  template <typename Body>
  std::invoke_result_t<Body, Transaction&> Transact(Body&& body,
                                                    const TransactionOptions& options = {});

  // One statement outside an explicit transaction, retried like a transaction on conflicts
  // and lost connections: only for statements that are safe to run twice (reads, upserts).
  absl::StatusOr<Result> Exec(std::string_view sql, absl::Span<const Param> params = {});

  // Open connections, leased and idle, for tests and metrics.
  int size() const;

 private:
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
  std::condition_variable released_;
  std::deque<std::unique_ptr<Connection>> idle_;
  int open_ = 0;  // idle + leased + being opened
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
