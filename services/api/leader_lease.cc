#include "services/api/leader_lease.h"

#include <unistd.h>

#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/common/status_macros.h"

namespace gradhub::api {
namespace {

// Milliseconds as PostgreSQL's settings take them.
std::string Millis(absl::Duration d) { return absl::StrCat(absl::ToInt64Milliseconds(d), "ms"); }

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

std::chrono::steady_clock::time_point LocalTermExpiry(std::chrono::steady_clock::time_point sent,
                                                      absl::Duration lease) {
  // An eighth of the lease for the two clocks' rates; the database counted from later anyway.
  return sent + absl::ToChronoNanoseconds(lease * 7 / 8);
}

std::string NewReplicaIdentity() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::random_device random;
  return absl::StrFormat("%s:%d:%08x", host, getpid(), random());
}

LeaderLease::LeaderLease(db::Pool* pool, LeaderLeaseOptions options)
    : pool_(pool), options_(std::move(options)) {
  if (options_.holder.empty()) options_.holder = NewReplicaIdentity();
}

LeaderLease::~LeaderLease() { Stop(); }

void LeaderLease::Start() {
  thread_ = std::thread([this] {
    absl::Time last_error_line = absl::InfinitePast();
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      lock.unlock();
      const absl::Status status = Tick();
      // The outcome that matters (leading or not) is logged by SetHeld; errors (the database
      // away) only now and then.
      if (!status.ok() && absl::Now() - last_error_line > absl::Seconds(10)) {
        std::cerr << "gradhub-api: leader lease: " << status << "\n";
        last_error_line = absl::Now();
      }
      // The leader renews every quarter lease (three may fail before its local expiry); the
      // others look every tenth, so that a takeover follows the expiry closely.
      const absl::Duration next = Current() ? options_.lease / 4 : options_.lease / 10;
      lock.lock();
      wake_.wait_for(lock, absl::ToChronoNanoseconds(next), [&] { return stopping_; });
    }
  });
}

void LeaderLease::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  Release();
}

absl::Status LeaderLease::Tick() {
  const Clock::time_point sent = Clock::now();
  std::optional<LeaderTerm> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (term_ && sent < expiry_) held = term_;
  }
  // A term past its local expiry is over even if the database would still renew it (step 2).
  const absl::Status status = held ? Renew(held->number, sent) : TakeOver(sent);
  if (!status.ok()) StepDownIfExpired();
  return status;
}

void LeaderLease::StepDownIfExpired() {
  std::optional<LeaderTerm> held;
  Clock::time_point expiry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    held = term_;
    expiry = expiry_;
  }
  // Current() has said so since `expiry`; this records it (the line, on_change).
  if (held && Clock::now() >= expiry) SetHeld(std::nullopt, expiry, std::nullopt);
}

absl::Status LeaderLease::Renew(int64_t term, Clock::time_point sent) {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result renewed,
      pool_->Exec("UPDATE control_plane_leader"
                  " SET expires_at = clock_timestamp() + $3 * interval '1 second'"
                  " WHERE holder = $1 AND term = $2 AND expires_at > clock_timestamp()"
                  " RETURNING term",
                  {options_.holder, term, Seconds(options_.lease)}));
  if (renewed.empty()) return TakeOver(sent);  // lost (deposed, or expired): a new term
  std::optional<LeaderTerm> same;
  {
    std::lock_guard<std::mutex> lock(mu_);
    same = term_;
  }
  SetHeld(same, LocalTermExpiry(sent, options_.lease), LeaderView{options_.holder, term});
  return absl::OkStatus();
}

absl::Status LeaderLease::TakeOver(Clock::time_point sent) {
  // A plain read first: while another replica leads, a standby's tick takes no lock.
  GRADHUB_ASSIGN_OR_RETURN(db::Result row,
                           pool_->Exec("SELECT holder, term, expires_at > clock_timestamp() AS held"
                                       " FROM control_plane_leader"));
  if (row.empty()) return absl::InternalError("control_plane_leader has no row");
  if (row.row(0).Get<bool>("held") && row.row(0).Get<std::string>("holder") != options_.holder) {
    SetHeld(std::nullopt, sent,
            LeaderView{row.row(0).Get<std::string>("holder"), row.row(0).Get<int64_t>("term")});
    return absl::OkStatus();
  }
  absl::StatusOr<std::optional<int64_t>> taken =
      pool_->Transact([&](db::Transaction& tx) -> absl::StatusOr<std::optional<int64_t>> {
        // Waits for the fenced transactions of the term before (step 4), not forever.
        GRADHUB_RETURN_IF_ERROR(
            tx.Exec("SELECT set_config('lock_timeout', $1, true)", {Millis(options_.lease / 4)})
                .status());
        GRADHUB_ASSIGN_OR_RETURN(db::Result locked,
                                 tx.Exec("SELECT holder, expires_at > clock_timestamp() AS held"
                                         " FROM control_plane_leader FOR UPDATE"));
        // Our own unexpired term counts as over: past its local expiry, it is not renewed.
        if (locked.row(0).Get<bool>("held") &&
            locked.row(0).Get<std::string>("holder") != options_.holder) {
          return std::nullopt;
        }
        GRADHUB_ASSIGN_OR_RETURN(
            db::Result next,
            tx.Exec("UPDATE control_plane_leader SET holder = $1, term = term + 1,"
                    " acquired_at = clock_timestamp(),"
                    " expires_at = clock_timestamp() + $2 * interval '1 second' RETURNING term",
                    {options_.holder, Seconds(options_.lease)}));
        return next.row(0).Get<int64_t>("term");
      });
  if (!taken.ok()) {
    SetHeld(std::nullopt, sent, std::nullopt);  // who leads is unknown
    return taken.status();
  }
  if (!taken->has_value()) {
    SetHeld(std::nullopt, sent, std::nullopt);  // another took it between the read and the lock
    return absl::OkStatus();
  }
  SetHeld(LeaderTerm{**taken, absl::Now()}, LocalTermExpiry(sent, options_.lease),
          LeaderView{options_.holder, **taken});
  return absl::OkStatus();
}

void LeaderLease::Release() {
  std::optional<LeaderTerm> held;
  {
    std::lock_guard<std::mutex> lock(mu_);
    held = term_;
  }
  if (!held) return;
  const absl::StatusOr<db::Result> released = pool_->Exec(
      "UPDATE control_plane_leader SET expires_at = '-infinity'"
      " WHERE holder = $1 AND term = $2",
      {options_.holder, held->number});
  if (!released.ok()) std::cerr << "gradhub-api: leader lease: release: " << released.status();
  SetHeld(std::nullopt, Clock::now(), LeaderView{});
}

std::optional<LeaderTerm> LeaderLease::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!term_ || Clock::now() >= expiry_) return std::nullopt;
  return term_;
}

absl::Status LeaderLease::Fence(db::Transaction& tx, int64_t term) const {
  GRADHUB_ASSIGN_OR_RETURN(
      db::Result held, tx.Exec("SELECT set_config('idle_in_transaction_session_timeout', $3, true)"
                               " FROM control_plane_leader"
                               " WHERE holder = $1 AND term = $2 AND expires_at > clock_timestamp()"
                               " FOR KEY SHARE",
                               {options_.holder, term, Millis(options_.lease)}));
  if (held.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("not the leader: term ", term, " of ", options_.holder, " is over"));
  }
  return absl::OkStatus();
}

LeaderView LeaderLease::leader() const {
  std::lock_guard<std::mutex> lock(mu_);
  return view_;
}

std::string LeaderLease::Describe() const {
  if (const std::optional<LeaderTerm> term = Current()) {
    return absl::StrCat("leader: this replica (", options_.holder, ", term ", term->number, ")");
  }
  const LeaderView view = leader();
  if (view.holder.empty()) return "leader: none (no replica holds an unexpired term)";
  return absl::StrCat("leader: ", view.holder, " (term ", view.term, ")");
}

void LeaderLease::SetHeld(std::optional<LeaderTerm> term, Clock::time_point expiry,
                          std::optional<LeaderView> view) {
  std::optional<LeaderTerm> before;
  Clock::time_point before_expiry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    before = term_;
    before_expiry = expiry_;
    term_ = term;
    expiry_ = expiry;
    if (view) view_ = *view;
  }
  const bool same = before && term && before->number == term->number;
  if (same || (!before && !term)) return;  // a renewal, or still not leading
  if (before) {
    // Current() said so from the local expiry on; the line may come a tick later.
    const double since = std::chrono::duration<double>(Clock::now() - before_expiry).count();
    std::cerr << "gradhub-api: no longer leading (term " << before->number << ")";
    if (since > 0) std::cerr << absl::StrFormat("; stopped acting %.3f s ago", since);
    std::cerr << "\n";
    if (options_.on_change) options_.on_change(false);
  }
  if (term) {
    std::cerr << "gradhub-api: leading the control plane (term " << term->number << ", replica "
              << options_.holder << ")\n";
    if (options_.on_change) options_.on_change(true);
  }
}

}  // namespace gradhub::api
