#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/ddp/store.h"

namespace gradhub::ddp {

// Presents our Store to gloo's rendezvous (gloo::rendezvous::Context::connectFullMesh) with
// every key under `prefix`, e.g. "default/channel-0/". gloo's protocol: each rank set()s its
// addresses under its rank number, then for every peer wait()s for the peer's key and get()s
// it. gloo expects a key to exist once wait() returned, and calls wait() both with and
// without a timeout; without one (or with gloo's kNoTimeout, zero) we wait `timeout`.
// Store errors propagate unchanged (StoreTimeoutError, StoreError); the process group turns
// them into CommError. Thread-safe as far as the wrapped store is.
class GlooStoreAdapter : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<ddp::Store> store, std::string prefix,
                   std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  std::vector<std::string> Scoped(const std::vector<std::string>& keys) const;

  const std::shared_ptr<ddp::Store> store_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace gradhub::ddp
