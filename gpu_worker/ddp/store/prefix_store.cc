#include "gpu_worker/ddp/store/prefix_store.h"

#include <stdexcept>

namespace gradhub::ddp {

PrefixStore::PrefixStore(std::shared_ptr<Store> store, const std::string& prefix)
    : store_(std::move(store)), prefix_(prefix + "/") {
  if (!store_) throw std::invalid_argument("PrefixStore needs a store to wrap");
}

void PrefixStore::Set(const std::string& key, const std::string& value) {
  store_->Set(Full(key), value);
}

std::string PrefixStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  return store_->Get(Full(key), timeout);
}

int64_t PrefixStore::Add(const std::string& key, int64_t delta) {
  return store_->Add(Full(key), delta);
}

void PrefixStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  store_->Wait(Full(keys), timeout);
}

bool PrefixStore::Check(const std::vector<std::string>& keys) { return store_->Check(Full(keys)); }

int64_t PrefixStore::DeletePrefix(const std::string& prefix) {
  return store_->DeletePrefix(Full(prefix));
}

std::vector<std::string> PrefixStore::Full(const std::vector<std::string>& keys) const {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const auto& key : keys) full.push_back(Full(key));
  return full;
}

}  // namespace gradhub::ddp
