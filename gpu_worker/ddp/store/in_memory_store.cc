#include "gpu_worker/ddp/store/in_memory_store.h"

#include "gpu_worker/ddp/store/store_errors.h"

namespace gradhub::ddp {

void InMemoryStore::Set(const std::string& key, const std::string& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = value;
  }
  changed_.notify_all();
}

std::string InMemoryStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  Wait({key}, timeout);
  std::lock_guard<std::mutex> lock(mu_);
  return values_.at(key);
}

int64_t InMemoryStore::Add(const std::string& key, int64_t delta) {
  int64_t value;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    value = ParseCounter(key, it == values_.end() ? "0" : it->second) + delta;
    values_[key] = std::to_string(value);
  }
  changed_.notify_all();
  return value;
}

void InMemoryStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!changed_.wait_for(lock, timeout, [&] { return HasAllLocked(keys); })) {
    std::vector<std::string> missing;
    for (const auto& key : keys) {
      if (values_.count(key) == 0) missing.push_back(key);
    }
    throw StoreTimeoutError(DescribeTimeout(missing, timeout));
  }
}

bool InMemoryStore::Check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  return HasAllLocked(keys);
}

int64_t InMemoryStore::DeletePrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t deleted = 0;
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    it = values_.erase(it);
    ++deleted;
  }
  return deleted;
}

bool InMemoryStore::HasAllLocked(const std::vector<std::string>& keys) const {
  for (const auto& key : keys) {
    if (values_.count(key) == 0) return false;
  }
  return true;
}

}  // namespace gradhub::ddp
