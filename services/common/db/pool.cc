#include "services/common/db/pool.h"

#include <algorithm>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/common/backoff.h"
#include "services/common/db/error.h"
#include "services/common/status_macros.h"

namespace gradhub::db {
namespace {

// Jitter keeps competing writers that failed together from retrying together.
constexpr BackoffPolicy kRetryBackoff{.initial = std::chrono::milliseconds(20),
                                      .max = std::chrono::seconds(1),
                                      .multiplier = 2.0,
                                      .jitter = 0.5};

const char* BeginStatement(const TransactionOptions& options) {
  switch (options.isolation) {
    case Isolation::kSerializable:
      return options.read_only ? "BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY"
                               : "BEGIN ISOLATION LEVEL SERIALIZABLE";
    case Isolation::kRepeatableRead:
      return options.read_only ? "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
                               : "BEGIN ISOLATION LEVEL REPEATABLE READ";
    case Isolation::kReadCommitted:
      break;
  }
  return options.read_only ? "BEGIN READ ONLY" : "BEGIN";
}

}  // namespace

Pool::Pool(PoolOptions options) : options_(std::move(options)) {}

Pool::~Pool() = default;

Pool::Lease::~Lease() {
  if (connection_) pool_->Release(std::move(connection_));
}

absl::StatusOr<Pool::Lease> Pool::Acquire() {
  std::unique_lock<std::mutex> lock(mu_);
  const absl::Time deadline = absl::Now() + options_.acquire_timeout;
  while (true) {
    if (!idle_.empty()) {
      // Most recently used first: it is the one most likely to still be alive.
      std::unique_ptr<Connection> connection = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(connection));
    }
    if (open_ < options_.max_connections) {
      ++open_;
      lock.unlock();
      absl::StatusOr<std::unique_ptr<Connection>> opened = Connection::Open(options_.connection);
      if (!opened.ok()) {
        lock.lock();
        --open_;
        released_.notify_one();
        return opened.status();
      }
      return Lease(this, *std::move(opened));
    }
    if (released_.wait_until(lock, absl::ToChronoTime(deadline)) == std::cv_status::timeout &&
        idle_.empty() && open_ >= options_.max_connections) {
      return absl::ResourceExhaustedError(
          absl::StrCat("all ", options_.max_connections, " database connections stayed busy for ",
                       absl::FormatDuration(options_.acquire_timeout)));
    }
  }
}

void Pool::Release(std::unique_ptr<Connection> connection) {
  std::unique_ptr<Connection> discarded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (connection->healthy() && !connection->in_transaction()) {
      idle_.push_back(std::move(connection));
    } else {
      discarded = std::move(connection);
      --open_;
    }
  }
  released_.notify_one();
}

void Pool::DiscardIdle() {
  std::deque<std::unique_ptr<Connection>> discarded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    discarded.swap(idle_);
    open_ -= static_cast<int>(discarded.size());
  }
  released_.notify_all();
}

int Pool::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

absl::Status Pool::WithRetries(int max_attempts,
                               absl::FunctionRef<absl::Status(bool* commit_sent)> attempt) {
  std::optional<Backoff> backoff;  // made at the first retry: most transactions need none
  for (int attempts = 1;; ++attempts) {
    bool commit_sent = false;
    absl::Status status = attempt(&commit_sent);
    if (status.ok()) return status;
    const bool lost = IsConnectionLost(status);
    if (lost) DiscardIdle();
    if (lost && commit_sent) {
      return absl::UnavailableError(
          absl::StrCat("connection lost during COMMIT; the transaction may or may not have "
                       "committed: ",
                       status.message()));
    }
    if (!(lost || IsRetryableConflict(status)) || attempts >= max_attempts) return status;
    if (!backoff) backoff.emplace(kRetryBackoff);
    std::this_thread::sleep_for(backoff->Next());
  }
}

absl::Status Pool::RunTransaction(absl::FunctionRef<absl::Status(Transaction&)> body,
                                  const TransactionOptions& options) {
  return WithRetries(options.max_attempts, [&](bool* commit_sent) -> absl::Status {
    GRADHUB_ASSIGN_OR_RETURN(Lease lease, Acquire());
    GRADHUB_RETURN_IF_ERROR(lease->Exec(BeginStatement(options)).status());
    Transaction transaction(&*lease);
    absl::Status status = body(transaction);
    if (status.ok() && PQtransactionStatus(lease->raw()) == PQTRANS_INERROR) {
      // COMMIT of an aborted transaction "succeeds" as a ROLLBACK; never report that as OK.
      status = absl::InternalError(
          "a statement failed inside the transaction and its error was ignored; "
          "use a SAVEPOINT to recover from expected errors");
    }
    if (!status.ok()) {
      if (lease->healthy()) lease->Exec("ROLLBACK").IgnoreError();
      return status;
    }
    *commit_sent = true;
    return lease->Exec("COMMIT").status();
  });
}

absl::StatusOr<Result> Pool::Exec(std::string_view sql, absl::Span<const Param> params) {
  std::optional<Result> result;
  GRADHUB_RETURN_IF_ERROR(
      WithRetries(TransactionOptions().max_attempts, [&](bool*) -> absl::Status {
        GRADHUB_ASSIGN_OR_RETURN(Lease lease, Acquire());
        GRADHUB_ASSIGN_OR_RETURN(Result rows, lease->Exec(sql, params));
        result.emplace(std::move(rows));
        return absl::OkStatus();
      }));
  return std::move(*result);
}

}  // namespace gradhub::db
