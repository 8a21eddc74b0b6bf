#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "gpu_worker/ddp/store.h"

namespace gradhub::ddp {

// A Store shared by ranks that run as threads of one process (gloo's HashStore): for fast
// collective tests and for a world size 1 job, which needs no rendezvous at all.
class InMemoryStore : public Store {
 public:
  void Set(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t Add(const std::string& key, int64_t delta) override;
  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool Check(const std::vector<std::string>& keys) override;
  int64_t DeletePrefix(const std::string& prefix) override;

 private:
  bool HasAllLocked(const std::vector<std::string>& keys) const;

  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

}  // namespace gradhub::ddp
