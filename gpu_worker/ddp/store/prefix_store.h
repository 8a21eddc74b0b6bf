#pragma once

#include <memory>
#include <string>

#include "gpu_worker/ddp/store.h"

namespace gradhub::ddp {

// Scopes another store's keys under `prefix + "/"` (gloo's PrefixStore), so that one store
// can carry many rendezvous without their keys meeting: PrefixStore(store, "jobs/42/attempts/3")
// turns "rank/0" into "jobs/42/attempts/3/rank/0". The separator keeps prefix "a" from seeing
// the keys of prefix "ab".
//
// Errors come from the wrapped store and so name the full key, which is the one to look
// for in that store. Thread-safe exactly when the wrapped store is (every backend is).
class PrefixStore : public Store {
 public:
  // std::invalid_argument when `store` is null.
  PrefixStore(std::shared_ptr<Store> store, const std::string& prefix);

  void Set(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t Add(const std::string& key, int64_t delta) override;
  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool Check(const std::vector<std::string>& keys) override;
  int64_t DeletePrefix(const std::string& prefix) override;

 private:
  std::string Full(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> Full(const std::vector<std::string>& keys) const;

  std::shared_ptr<Store> store_;
  std::string prefix_;  // Ends with "/".
};

}  // namespace gradhub::ddp
