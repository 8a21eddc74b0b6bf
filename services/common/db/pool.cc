#include "services/common/db/pool.h"

#include <algorithm>
#include <iostream>
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

Pool::~Pool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_.notify_all();
  if (reconnector_.joinable()) reconnector_.join();
}

Pool::Lease::~Lease() {
  if (connection_) pool_->Release(std::move(connection_));
}

absl::StatusOr<Pool::Lease> Pool::Acquire() {
  return AcquireUntil(absl::Now() + options_.acquire_timeout, absl::InfiniteFuture());
}

absl::StatusOr<Pool::Lease> Pool::AcquireUntil(absl::Time wait_until, absl::Time connect_deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  const absl::Time started = absl::Now();
  while (true) {
    if (unreachable_) return UnreachableStatus();
    if (!idle_.empty()) {
      // Most recently used first: it is the one most likely to still be alive.
      std::unique_ptr<Connection> connection = std::move(idle_.back());
      idle_.pop_back();
      return Lease(this, std::move(connection));
    }
    if (open_ < options_.max_connections) {
      ++open_;
      lock.unlock();
      absl::StatusOr<std::unique_ptr<Connection>> opened =
          Connection::Open(options_.connection, connect_deadline);
      if (!opened.ok()) {
        if (IsSilence(opened.status())) NoteSilence(DetailsOf(opened.status()));
        lock.lock();
        --open_;
        if (IsConnectionLost(opened.status())) last_unreachable_ = absl::Now();
        released_.notify_one();
        return opened.status();
      }
      return Lease(this, *std::move(opened));
    }
    if (released_.wait_until(lock, absl::ToChronoTime(wait_until)) == std::cv_status::timeout &&
        idle_.empty() && open_ >= options_.max_connections && !unreachable_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "all ", options_.max_connections, " database connections stayed busy for ",
          absl::FormatDuration(absl::Trunc(absl::Now() - started, absl::Milliseconds(1)))));
    }
  }
}

absl::Status Pool::UnreachableStatus() {
  const absl::Time now = absl::Now();
  last_unreachable_ = now;
  const std::string silent_for =
      absl::FormatDuration(absl::Trunc(now - unreachable_since_, absl::Milliseconds(100)));
  return SilenceStatus(
      absl::StrCat("the database has been unreachable for at least ", silent_for,
                   "; the server keeps trying to reconnect"),
      absl::StrCat("failed at once: the database has been unreachable for ", silent_for));
}

void Pool::NoteSilence(const std::string& details) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_unreachable_ = absl::Now();
    if (unreachable_ || stopping_) return;
    unreachable_ = true;
    unreachable_since_ = absl::Now();
    std::cerr << "gradhub db: the database is unreachable (" << details
              << "); failing calls at once until a connect succeeds\n";
    if (!reconnecting_) {
      // A reconnector that ended the last outage has left its loop, or is about to return.
      if (reconnector_.joinable()) reconnector_.join();
      reconnecting_ = true;
      reconnector_ = std::thread([this] { Reconnect(); });
    }
  }
  released_.notify_all();  // waiters in Acquire fail at once now
  DiscardIdle();
}

void Pool::Reconnect() {
  ConnectionOptions options = options_.connection;
  options.connect_timeout = std::min(options.connect_timeout, options_.reconnect_interval);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const absl::Time tried = absl::Now();
    lock.unlock();
    absl::StatusOr<std::unique_ptr<Connection>> opened = Connection::Open(options);
    lock.lock();
    if (opened.ok()) {
      std::cerr << "gradhub db: the database answers again, after "
                << absl::FormatDuration(
                       absl::Trunc(absl::Now() - unreachable_since_, absl::Milliseconds(100)))
                << " unreachable\n";
      unreachable_ = false;
      if (open_ < options_.max_connections) {
        ++open_;
        idle_.push_back(*std::move(opened));
      }
      released_.notify_all();
      break;
    }
    last_unreachable_ = absl::Now();
    stop_.wait_until(lock, absl::ToChronoTime(tried + options_.reconnect_interval),
                     [this] { return stopping_; });
  }
  reconnecting_ = false;
}

void Pool::Release(std::unique_ptr<Connection> connection) {
  // Every path to the database ends here, so this is where silence is noticed.
  if (connection->silent()) NoteSilence("a connection went unanswered; the kernel dropped it");
  std::unique_ptr<Connection> discarded;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (connection->lost()) last_unreachable_ = absl::Now();
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

absl::Time Pool::last_unreachable() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_unreachable_;
}

bool Pool::unreachable() const {
  std::lock_guard<std::mutex> lock(mu_);
  return unreachable_;
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
    // Reachability step 2: the pool fails calls at once now, and a retry would only say so.
    if (IsSilence(status)) return status;
    if (!(lost || IsRetryableConflict(status)) || attempts >= max_attempts) return status;
    if (!backoff) backoff.emplace(kRetryBackoff);
    std::this_thread::sleep_for(backoff->Next());
  }
}

absl::Status Pool::RunTransaction(absl::FunctionRef<absl::Status(Transaction&)> body,
                                  const TransactionOptions& options) {
  return WithRetries(options.max_attempts, [&](bool* commit_sent) -> absl::Status {
    GRADHUB_ASSIGN_OR_RETURN(Lease lease, Acquire());
    if (options.synchronous_commit) {
      GRADHUB_RETURN_IF_ERROR(lease->Exec(BeginStatement(options)).status());
    } else {
      // Both in one round trip (the simple query protocol takes a list of statements).
      GRADHUB_RETURN_IF_ERROR(lease->ExecScript(
          absl::StrCat(BeginStatement(options), "; SET LOCAL synchronous_commit = off")));
    }
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

absl::StatusOr<Result> Pool::ExecWithin(absl::Duration budget, std::string_view sql,
                                        absl::Span<const Param> params) {
  const absl::Time deadline = absl::Now() + budget;
  GRADHUB_ASSIGN_OR_RETURN(Lease lease, AcquireUntil(deadline, deadline));
  return lease->Exec(sql, params, deadline);
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
