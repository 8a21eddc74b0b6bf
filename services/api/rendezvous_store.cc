#include "services/api/rendezvous_store.h"

#include <algorithm>
#include <cctype>
#include <unordered_set>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

// Timeouts: one timer thread over a deadline-ordered set, rather than a grpc::Alarm per waiter.
// The alarm would tie this class to gRPC (it has no gRPC types so that it can be tested, and
// reused by the REST layer or an in-process backend, without a server), would need its own
// lifetime dance per waiter (an Alarm must outlive its callback, and Cancel() races with the
// firing callback), and would spread timeouts over gRPC's executor threads. One thread that
// sleeps until the earliest deadline costs nothing while idle and completes each waiter under
// the same lock as Set/Add/CancelWait, so the exactly-once rule has a single place to hold.

namespace gradhub::api {
namespace {

// Keys in error messages: escaped (they are bytes) and cut, so an error stays readable.
std::string Quote(const std::string& key) {
  constexpr size_t kMaxShown = 160;
  std::string shown = absl::CHexEscape(key.substr(0, kMaxShown));
  if (key.size() > kMaxShown) absl::StrAppend(&shown, "...");
  return absl::StrCat("\"", shown, "\"");
}

std::string QuoteList(const std::vector<std::string>& keys) {
  constexpr size_t kMaxListed = 16;
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kMaxListed; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", Quote(keys[i]));
  }
  if (keys.size() > kMaxListed) {
    absl::StrAppend(&out, " and ", keys.size() - kMaxListed, " more");
  }
  return out;
}

bool AllDigits(const std::string& s, size_t begin, size_t end) {
  if (begin >= end) return false;
  for (size_t i = begin; i < end; ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
  }
  return true;
}

}  // namespace

absl::Status ValidateAttemptScope(const std::string& key, const std::string& field,
                                  bool allow_bare_prefix) {
  auto outside = [&]() {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", Quote(key),
                     " is not inside an attempt's prefix jobs/{job_id}/attempts/{attempt}/"));
  };
  static const std::string kJobs = "jobs/";
  static const std::string kAttempts = "/attempts/";
  if (!absl::StartsWith(key, kJobs)) return outside();
  const size_t job_end = key.find('/', kJobs.size());
  if (job_end == std::string::npos || job_end == kJobs.size()) return outside();
  if (key.compare(job_end, kAttempts.size(), kAttempts) != 0) return outside();
  const size_t attempt_begin = job_end + kAttempts.size();
  const size_t attempt_end = key.find('/', attempt_begin);
  if (attempt_end == std::string::npos || !AllDigits(key, attempt_begin, attempt_end)) {
    return outside();
  }
  if (!allow_bare_prefix && attempt_end + 1 == key.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", Quote(key), " must go on after the attempt's prefix"));
  }
  return absl::OkStatus();
}

RendezvousStore::RendezvousStore(RendezvousStoreOptions options)
    : options_(std::move(options)), timer_([this] { TimerLoop(); }) {}

RendezvousStore::~RendezvousStore() {
  Shutdown();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_timer_ = true;
  }
  timer_cv_.notify_all();
  timer_.join();
}

absl::Duration RendezvousStore::EffectiveTimeout(absl::Duration requested) const {
  if (requested <= absl::ZeroDuration()) return options_.default_timeout;
  return std::min(requested, options_.max_timeout);
}

absl::Status RendezvousStore::ValidateKey(const std::string& key, const std::string& field) const {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": must not be empty"));
  if (key.size() > options_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", key.size(), " bytes, longer than the limit of ", options_.max_key_bytes));
  }
  if (options_.require_attempt_scope) {
    return ValidateAttemptScope(key, field, /*allow_bare_prefix=*/false);
  }
  return absl::OkStatus();
}

absl::Status RendezvousStore::ValidateKeys(const std::vector<std::string>& keys) const {
  if (keys.size() > options_.max_keys_per_call) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keys: ", keys.size(), " keys, more than the limit of ", options_.max_keys_per_call));
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::Status status = ValidateKey(keys[i], absl::StrCat("keys[", i, "]"));
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status RendezvousStore::Set(const std::string& key, std::string value) {
  absl::Status status = ValidateKey(key, "key");
  if (!status.ok()) return status;
  if (value.size() > options_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "value: ", value.size(), " bytes, larger than the limit of ", options_.max_value_bytes));
  }
  std::vector<Completion> completions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const bool inserted = data_.insert_or_assign(key, std::move(value)).second;
    if (inserted) OnKeyPresentLocked(key, &completions);
  }
  Deliver(std::move(completions));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RendezvousStore::Add(const std::string& key, int64_t delta) {
  absl::Status status = ValidateKey(key, "key");
  if (!status.ok()) return status;
  std::vector<Completion> completions;
  int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    int64_t current = 0;
    if (it != data_.end() && !absl::SimpleAtoi(it->second, &current)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "key ", Quote(key), " holds ", Quote(it->second), ", not a decimal int64 counter"));
    }
    if (__builtin_add_overflow(current, delta, &result)) {
      return absl::OutOfRangeError(
          absl::StrCat("key ", Quote(key), ": ", current, " + ", delta, " overflows int64"));
    }
    if (it != data_.end()) {
      it->second = absl::StrCat(result);
    } else {
      data_.emplace(key, absl::StrCat(result));
      OnKeyPresentLocked(key, &completions);
    }
  }
  Deliver(std::move(completions));
  return result;
}

absl::StatusOr<bool> RendezvousStore::Check(const std::vector<std::string>& keys) const {
  absl::Status status = ValidateKeys(keys);
  if (!status.ok()) return status;
  std::lock_guard<std::mutex> lock(mu_);
  return std::all_of(keys.begin(), keys.end(),
                     [this](const std::string& key) { return data_.count(key) != 0; });
}

absl::StatusOr<int64_t> RendezvousStore::DeletePrefix(const std::string& prefix) {
  if (prefix.empty()) return absl::InvalidArgumentError("prefix: must not be empty");
  if (prefix.size() > options_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix: ", prefix.size(), " bytes, longer than the limit of ", options_.max_key_bytes));
  }
  if (options_.require_attempt_scope) {
    absl::Status status = ValidateAttemptScope(prefix, "prefix", /*allow_bare_prefix=*/true);
    if (!status.ok()) return status;
  }
  std::lock_guard<std::mutex> lock(mu_);
  int64_t deleted = 0;
  auto it = data_.lower_bound(prefix);
  while (it != data_.end() && absl::StartsWith(it->first, prefix)) {
    it = data_.erase(it);
    ++deleted;
  }
  return deleted;
}

RendezvousStore::WaiterId RendezvousStore::Get(std::string key, absl::Duration timeout,
                                               GetCallback done) {
  Waiter waiter;
  waiter.want_value = true;
  waiter.get_done = std::move(done);
  absl::Status status = ValidateKey(key, "key");
  if (!status.ok()) {
    Deliver(waiter, status);
    return kNoWaiter;
  }
  waiter.keys.push_back(std::move(key));
  waiter.timeout = EffectiveTimeout(timeout);
  return Register(std::move(waiter));
}

RendezvousStore::WaiterId RendezvousStore::Wait(std::vector<std::string> keys,
                                                absl::Duration timeout, WaitCallback done) {
  Waiter waiter;
  waiter.wait_done = std::move(done);
  absl::Status status = ValidateKeys(keys);
  if (!status.ok()) {
    Deliver(waiter, status);
    return kNoWaiter;
  }
  std::unordered_set<std::string> seen;
  for (std::string& key : keys) {
    if (seen.insert(key).second) waiter.keys.push_back(std::move(key));
  }
  waiter.timeout = EffectiveTimeout(timeout);
  return Register(std::move(waiter));
}

RendezvousStore::WaiterId RendezvousStore::Register(Waiter waiter) {
  absl::StatusOr<std::string> immediate;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const std::vector<std::string> missing = MissingKeysLocked(waiter);
    if (shut_down_) {
      immediate = absl::UnavailableError("the rendezvous store is shutting down");
    } else if (missing.empty()) {
      immediate = waiter.want_value ? data_.at(waiter.keys[0]) : std::string();
    } else if (waiters_.size() >= options_.max_pending_waiters) {
      immediate = absl::ResourceExhaustedError(absl::StrCat("too many blocked Get/Wait calls (",
                                                            waiters_.size(), "); limit ",
                                                            options_.max_pending_waiters));
    } else {
      const WaiterId id = next_id_++;
      waiter.missing = missing.size();
      waiter.deadline = Clock::now() + absl::ToChronoNanoseconds(waiter.timeout);
      for (const std::string& key : missing) by_key_[key].insert(id);
      const bool earliest = deadlines_.empty() || waiter.deadline < deadlines_.begin()->first;
      deadlines_.emplace(waiter.deadline, id);
      waiters_.emplace(id, std::move(waiter));
      if (earliest) timer_cv_.notify_one();
      return id;
    }
  }
  Deliver(waiter, std::move(immediate));
  return kNoWaiter;
}

void RendezvousStore::OnKeyPresentLocked(const std::string& key, std::vector<Completion>* out) {
  auto node = by_key_.extract(key);
  if (node.empty()) return;
  for (WaiterId id : node.mapped()) {
    Waiter& waiter = waiters_.at(id);
    if (--waiter.missing > 0) continue;
    // Every key it was indexed under has appeared; one that was present at registration may
    // have been deleted since, so look again before completing.
    const std::vector<std::string> missing = MissingKeysLocked(waiter);
    if (!missing.empty()) {
      waiter.missing = missing.size();
      for (const std::string& k : missing) by_key_[k].insert(id);
      continue;
    }
    Completion completion{RemoveLocked(id), std::string()};
    if (completion.waiter.want_value) completion.result = data_.at(completion.waiter.keys[0]);
    out->push_back(std::move(completion));
  }
}

RendezvousStore::Waiter RendezvousStore::RemoveLocked(WaiterId id) {
  auto node = waiters_.extract(id);
  Waiter& waiter = node.mapped();
  for (const std::string& key : waiter.keys) {
    auto it = by_key_.find(key);
    if (it == by_key_.end()) continue;
    it->second.erase(id);
    if (it->second.empty()) by_key_.erase(it);
  }
  deadlines_.erase({waiter.deadline, id});
  return std::move(waiter);
}

std::vector<std::string> RendezvousStore::MissingKeysLocked(const Waiter& waiter) const {
  std::vector<std::string> missing;
  for (const std::string& key : waiter.keys) {
    if (data_.count(key) == 0) missing.push_back(key);
  }
  return missing;
}

void RendezvousStore::CancelWait(WaiterId id) {
  std::vector<Completion> completions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (waiters_.count(id) == 0) return;
    completions.push_back(
        {RemoveLocked(id), absl::CancelledError("the blocked call was cancelled")});
  }
  Deliver(std::move(completions));
}

void RendezvousStore::Shutdown() {
  std::vector<Completion> completions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_down_ = true;
    while (!waiters_.empty()) {
      completions.push_back({RemoveLocked(waiters_.begin()->first),
                             absl::UnavailableError("the rendezvous store is shutting down")});
    }
  }
  Deliver(std::move(completions));
}

size_t RendezvousStore::pending_waiters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiters_.size();
}

size_t RendezvousStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return data_.size();
}

void RendezvousStore::Deliver(std::vector<Completion> completions) {
  for (Completion& completion : completions) {
    Deliver(completion.waiter, std::move(completion.result));
  }
}

void RendezvousStore::Deliver(Waiter& waiter, absl::StatusOr<std::string> result) {
  if (waiter.want_value) {
    if (waiter.get_done) waiter.get_done(std::move(result));
  } else {
    if (waiter.wait_done) waiter.wait_done(result.status());
  }
}

void RendezvousStore::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_timer_) {
    if (deadlines_.empty()) {
      timer_cv_.wait(lock);
      continue;
    }
    const Clock::time_point now = Clock::now();
    // A copy: wait_until reads its argument again after waking, when the queue's first entry
    // may already be gone.
    const Clock::time_point earliest = deadlines_.begin()->first;
    if (now < earliest) {
      timer_cv_.wait_until(lock, earliest);
      continue;
    }
    std::vector<Completion> expired;
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const WaiterId id = deadlines_.begin()->second;
      Waiter waiter = RemoveLocked(id);
      const std::vector<std::string> missing = MissingKeysLocked(waiter);
      absl::Status status = absl::DeadlineExceededError(
          absl::StrCat(waiter.want_value ? "Get" : "Wait", " timed out after ",
                       absl::FormatDuration(waiter.timeout), "; missing ",
                       missing.size() == 1 ? "key " : "keys ", QuoteList(missing)));
      expired.push_back({std::move(waiter), std::move(status)});
    }
    lock.unlock();
    Deliver(std::move(expired));
    lock.lock();
  }
}

}  // namespace gradhub::api
