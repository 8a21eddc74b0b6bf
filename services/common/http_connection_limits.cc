#include "services/common/http_connection_limits.h"

#include <sys/socket.h>

#include "absl/strings/str_cat.h"

namespace gradhub {

ConnectionTable::Admission& ConnectionTable::Admission::operator=(Admission&& other) noexcept {
  if (this != &other) {
    Release();
    table_ = std::exchange(other.table_, nullptr);
    entry_ = other.entry_;
  }
  return *this;
}

void ConnectionTable::Admission::MarkWaiting() {
  std::lock_guard<std::mutex> lock(table_->mu_);
  // A connection waits from its admission: its thread may start long after (a busy pool), and
  // "longest waiting" must not favour the connections whose threads ran late.
  if (entry_->waiting) return;
  entry_->waiting = true;
  entry_->since = absl::Now();
}

void ConnectionTable::Admission::MarkBusy() {
  std::lock_guard<std::mutex> lock(table_->mu_);
  entry_->waiting = false;
}

void ConnectionTable::Admission::Release() {
  if (table_ == nullptr) return;
  ConnectionTable* table = std::exchange(table_, nullptr);
  std::lock_guard<std::mutex> lock(table->mu_);
  if (!entry_->evicted) table->Uncount(*entry_);
  table->entries_.erase(entry_);
}

absl::StatusOr<ConnectionTable::Admission> ConnectionTable::Admit(int fd,
                                                                  const std::string& client) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [count, inserted] = per_client_.try_emplace(client, 0);
  if (count->second >= max_per_client_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this client address has ", count->second, " connections open, the most one address may ",
        "have (--http-max-connections-per-client); close one or retry later"));
  }
  if (open_ >= max_total_ && !EvictLongestWaiting()) {
    if (count->second == 0) per_client_.erase(count);
    return absl::ResourceExhaustedError(
        absl::StrCat("the server has ", open_, " connections open, all of them busy, the most it ",
                     "serves at once (--http-max-connections); retry later"));
  }
  ++count->second;
  ++open_;
  entries_.push_front(Entry{.fd = fd, .client = client, .since = absl::Now()});
  return Admission(this, entries_.begin());
}

bool ConnectionTable::EvictLongestWaiting() {
  Entry* longest = nullptr;
  for (Entry& entry : entries_) {
    if (entry.waiting && !entry.evicted && (longest == nullptr || entry.since < longest->since)) {
      longest = &entry;
    }
  }
  if (longest == nullptr) return false;
  longest->evicted = true;
  Uncount(*longest);
  ::shutdown(longest->fd, SHUT_RDWR);
  return true;
}

void ConnectionTable::Uncount(Entry& entry) {
  --open_;
  if (--per_client_[entry.client] == 0) per_client_.erase(entry.client);
}

void ConnectionTable::ShutDownWaiting() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Entry& entry : entries_) {
    if (entry.waiting && !entry.evicted) ::shutdown(entry.fd, SHUT_RDWR);
  }
}

int64_t ConnectionTable::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

int64_t ConnectionTable::open_from(const std::string& client) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = per_client_.find(client);
  return it == per_client_.end() ? 0 : it->second;
}

}  // namespace gradhub
