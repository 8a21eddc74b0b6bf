#include "gpu_worker/ddp/comm/gloo/gloo_store_adapter.h"

#include <utility>

namespace gradhub::ddp {

GlooStoreAdapter::GlooStoreAdapter(std::shared_ptr<ddp::Store> store, std::string prefix,
                                   std::chrono::milliseconds timeout)
    : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

void GlooStoreAdapter::set(const std::string& key, const std::vector<char>& data) {
  store_->Set(prefix_ + key, std::string(data.begin(), data.end()));
}

std::vector<char> GlooStoreAdapter::get(const std::string& key) {
  // Blocking Get: gloo calls get() right after wait(), but a store whose writes become
  // visible with a delay (a remote store) must not fail the rendezvous for that.
  const std::string value = store_->Get(prefix_ + key, timeout_);
  return std::vector<char>(value.begin(), value.end());
}

void GlooStoreAdapter::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void GlooStoreAdapter::wait(const std::vector<std::string>& keys,
                            const std::chrono::milliseconds& timeout) {
  store_->Wait(Scoped(keys), timeout == std::chrono::milliseconds::zero() ? timeout_ : timeout);
}

std::vector<std::string> GlooStoreAdapter::Scoped(const std::vector<std::string>& keys) const {
  std::vector<std::string> scoped;
  scoped.reserve(keys.size());
  for (const auto& key : keys) scoped.push_back(prefix_ + key);
  return scoped;
}

}  // namespace gradhub::ddp
