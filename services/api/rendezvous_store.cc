#include "services/api/rendezvous_store.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <unordered_set>

#include "absl/strings/match.h"
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

std::string QuoteList(const std::vector<std::string>& keys) {
  constexpr size_t kMaxListed = 16;
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kMaxListed; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", QuoteKey(keys[i]));
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
        absl::StrCat(field, ": ", QuoteKey(key),
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
        absl::StrCat(field, ": ", QuoteKey(key), " must go on after the attempt's prefix"));
  }
  return absl::OkStatus();
}

RendezvousStore::RendezvousStore(RendezvousStoreOptions options,
                                 std::unique_ptr<RendezvousBackend> backend)
    : options_(std::move(options)),
      backend_(backend != nullptr ? std::move(backend)
                                  : std::make_unique<InMemoryRendezvousBackend>()),
      timer_([this] { TimerLoop(); }) {}

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

absl::Status RendezvousStore::ValidatePrefix(const std::string& prefix) const {
  if (prefix.empty()) return absl::InvalidArgumentError("prefix: must not be empty");
  if (prefix.size() > options_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix: ", prefix.size(), " bytes, longer than the limit of ", options_.max_key_bytes));
  }
  if (options_.require_attempt_scope) {
    return ValidateAttemptScope(prefix, "prefix", /*allow_bare_prefix=*/true);
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
  status = backend_->Set(key, value);
  if (!status.ok()) return status;
  std::vector<Completion> completions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    MarkPresentLocked(key, value, &completions);
  }
  Deliver(std::move(completions));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RendezvousStore::Add(const std::string& key, int64_t delta) {
  absl::Status status = ValidateKey(key, "key");
  if (!status.ok()) return status;
  absl::StatusOr<int64_t> result = backend_->Add(key, delta);
  if (!result.ok()) return result;
  std::vector<Completion> completions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    MarkPresentLocked(key, absl::StrCat(*result), &completions);
  }
  Deliver(std::move(completions));
  return result;
}

absl::StatusOr<bool> RendezvousStore::Check(const std::vector<std::string>& keys) const {
  absl::Status status = ValidateKeys(keys);
  if (!status.ok()) return status;
  absl::StatusOr<std::map<std::string, std::string>> present =
      backend_->Read(keys, /*with_values=*/false);
  if (!present.ok()) return present.status();
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& key) { return present->count(key) != 0; });
}

absl::StatusOr<int64_t> RendezvousStore::DeletePrefix(const std::string& prefix) {
  absl::Status status = ValidatePrefix(prefix);
  if (!status.ok()) return status;
  absl::StatusOr<int64_t> deleted = backend_->DeletePrefix(prefix);
  if (!deleted.ok()) return deleted;
  std::lock_guard<std::mutex> lock(mu_);
  MarkDeletedLocked(prefix);
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
  absl::Status refused;
  const bool want_value = waiter.want_value;
  const std::vector<std::string> keys = waiter.keys;
  const WaiterId id = RecordWaiter(waiter, &refused);
  if (id == kNoWaiter) {
    Deliver(waiter, std::move(refused));
    return kNoWaiter;
  }
  absl::StatusOr<std::map<std::string, std::string>> present = backend_->Read(keys, want_value);
  std::vector<Completion> completions;
  bool pending = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (present.ok()) {
      last_read_error_.clear();
      for (const auto& [key, value] : *present) MarkPresentLocked(key, value, &completions);
    } else {
      last_read_error_ = std::string(present.status().message());  // The poll tries again.
    }
    pending = waiters_.count(id) != 0;
  }
  Deliver(std::move(completions));
  return pending ? id : kNoWaiter;
}

RendezvousStore::WaiterId RendezvousStore::RecordWaiter(Waiter& waiter, absl::Status* refused) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) {
    *refused = absl::UnavailableError("the rendezvous store is shutting down");
    return kNoWaiter;
  }
  if (waiters_.size() >= options_.max_pending_waiters) {
    *refused = absl::ResourceExhaustedError(absl::StrCat("too many blocked Get/Wait calls (",
                                                         waiters_.size(), "); limit ",
                                                         options_.max_pending_waiters));
    return kNoWaiter;
  }
  const WaiterId id = next_id_++;
  const Clock::time_point now = Clock::now();
  // The first waiter: its own read (step 2) is as good as a poll.
  if (by_key_.empty()) next_poll_ = now + absl::ToChronoNanoseconds(options_.poll_interval);
  waiter.missing.insert(waiter.keys.begin(), waiter.keys.end());
  waiter.deadline = now + absl::ToChronoNanoseconds(waiter.timeout);
  for (const std::string& key : waiter.keys) by_key_[key].insert(id);
  const bool earliest = deadlines_.empty() || waiter.deadline < deadlines_.begin()->first;
  deadlines_.emplace(waiter.deadline, id);
  waiters_.emplace(id, std::move(waiter));
  if (earliest) timer_cv_.notify_one();
  return id;
}

void RendezvousStore::MarkPresentLocked(const std::string& key, const std::string& value,
                                        std::vector<Completion>* out) {
  auto node = by_key_.extract(key);
  if (node.empty()) return;
  for (WaiterId id : node.mapped()) {
    Waiter& waiter = waiters_.at(id);
    waiter.missing.erase(key);
    if (waiter.want_value && waiter.keys[0] == key) waiter.value = value;
    if (!waiter.missing.empty()) continue;
    Completion completion{RemoveLocked(id), std::string()};
    if (completion.waiter.want_value) completion.result = std::move(completion.waiter.value);
    out->push_back(std::move(completion));
  }
}

void RendezvousStore::MarkDeletedLocked(const std::string& prefix) {
  for (auto& [id, waiter] : waiters_) {
    for (const std::string& key : waiter.keys) {
      if (absl::StartsWith(key, prefix) && waiter.missing.insert(key).second) {
        by_key_[key].insert(id);
      }
    }
  }
}

RendezvousStore::Waiter RendezvousStore::RemoveLocked(WaiterId id) {
  auto node = waiters_.extract(id);
  Waiter& waiter = node.mapped();
  for (const std::string& key : waiter.missing) {
    auto it = by_key_.find(key);
    if (it == by_key_.end()) continue;
    it->second.erase(id);
    if (it->second.empty()) by_key_.erase(it);
  }
  deadlines_.erase({waiter.deadline, id});
  return std::move(waiter);
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

void RendezvousStore::KeysChanged() {
  std::lock_guard<std::mutex> lock(mu_);
  if (by_key_.empty()) return;
  poll_now_ = true;
  timer_cv_.notify_one();
}

void RendezvousStore::KeyChanged(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (by_key_.count(key) == 0) return;
  poll_now_ = true;
  timer_cv_.notify_one();
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
  absl::StatusOr<int64_t> size = backend_->Size();
  return size.ok() ? static_cast<size_t>(*size) : 0;
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
    const Clock::time_point now = Clock::now();
    const bool polling = backend_->shared() && !by_key_.empty();
    if (polling && (poll_now_ || now >= next_poll_)) {
      PollLocked(lock);
      continue;
    }
    poll_now_ = false;
    if (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      ExpireLocked(now, lock);
      continue;
    }
    // Copies: wait_until reads its argument again after waking, when the queue's first entry
    // may already be gone.
    Clock::time_point wake =
        deadlines_.empty() ? Clock::time_point::max() : deadlines_.begin()->first;
    if (polling) wake = std::min(wake, next_poll_);
    if (wake == Clock::time_point::max()) {
      timer_cv_.wait(lock);
    } else {
      timer_cv_.wait_until(lock, wake);
    }
  }
}

void RendezvousStore::PollLocked(std::unique_lock<std::mutex>& lock) {
  poll_now_ = false;
  std::vector<std::string> keys;
  keys.reserve(by_key_.size());
  for (const auto& entry : by_key_) keys.push_back(entry.first);
  lock.unlock();
  absl::StatusOr<std::map<std::string, std::string>> present =
      backend_->Read(keys, /*with_values=*/true);
  lock.lock();
  next_poll_ = Clock::now() + absl::ToChronoNanoseconds(options_.poll_interval);
  if (!present.ok()) {
    last_read_error_ = std::string(present.status().message());
    return;
  }
  last_read_error_.clear();
  std::vector<Completion> completions;
  for (const auto& [key, value] : *present) MarkPresentLocked(key, value, &completions);
  lock.unlock();
  Deliver(std::move(completions));
  lock.lock();
}

void RendezvousStore::ExpireLocked(Clock::time_point now, std::unique_lock<std::mutex>& lock) {
  std::vector<Completion> expired;
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    Waiter waiter = RemoveLocked(deadlines_.begin()->second);
    std::vector<std::string> missing;
    for (const std::string& key : waiter.keys) {
      if (waiter.missing.count(key) != 0) missing.push_back(key);
    }
    std::string message = absl::StrCat(waiter.want_value ? "Get" : "Wait", " timed out after ",
                                       absl::FormatDuration(waiter.timeout), "; missing ",
                                       missing.size() == 1 ? "key " : "keys ", QuoteList(missing));
    if (!last_read_error_.empty()) {
      absl::StrAppend(&message, " (the last read of the store failed: ", last_read_error_, ")");
    }
    expired.push_back({std::move(waiter), absl::DeadlineExceededError(message)});
  }
  lock.unlock();
  Deliver(std::move(expired));
  lock.lock();
}

}  // namespace gradhub::api
