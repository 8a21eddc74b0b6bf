// Where the rendezvous store keeps its keys (rendezvous_store.h): the store's waiters and rules
// stay in RendezvousStore; a backend only holds bytes under keys.
//
// Backends:
//   - InMemoryRendezvousBackend: a map in this process. For tests and a single api without
//     failover; every op is a map operation under a mutex (well under a microsecond).
//   - PostgresRendezvousBackend (postgres_rendezvous_backend.h): table rendezvous_keys, shared
//     by every api replica, so a replica's death loses no key. Every op is one statement, one
//     round trip to PostgreSQL.
// Both pass the one conformance suite of the store
// (tests/integration/store_service/rendezvous_store_conformance.h).
//
// Thread-safe: the store calls a backend from any thread, several at once, never with its own
// lock held.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradhub::api {

class RendezvousBackend {
 public:
  virtual ~RendezvousBackend() = default;

  // Creates or overwrites `key`. OK means durable for this backend.
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;

  // Creates `key` at 0 if absent, adds `delta` atomically, returns the result (stored as decimal
  // text). FAILED_PRECONDITION when the key holds anything but a decimal int64, OUT_OF_RANGE on
  // overflow (CounterError's messages).
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) = 0;

  // The keys of `keys` present now, with their values when `with_values` (else "").
  virtual absl::StatusOr<std::map<std::string, std::string>> Read(
      const std::vector<std::string>& keys, bool with_values) = 0;

  // Deletes every key starting with `prefix`; returns how many.
  virtual absl::StatusOr<int64_t> DeletePrefix(const std::string& prefix) = 0;

  // Keys held, for tests and metrics.
  virtual absl::StatusOr<int64_t> Size() = 0;

  // Whether others (other api replicas) write here too. Then the store cannot learn of every
  // new key from its own Set/Add and polls for the keys its waiters miss.
  virtual bool shared() const = 0;
};

class InMemoryRendezvousBackend final : public RendezvousBackend {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::StatusOr<std::map<std::string, std::string>> Read(const std::vector<std::string>& keys,
                                                          bool with_values) override;
  absl::StatusOr<int64_t> DeletePrefix(const std::string& prefix) override;
  absl::StatusOr<int64_t> Size() override;
  bool shared() const override { return false; }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> data_;  // Ordered for DeletePrefix ranges.
};

// Keys in error messages: escaped (they are bytes) and cut, so an error stays readable.
std::string QuoteKey(const std::string& key);

// Add's arithmetic, the same for every backend: `held` (the key's value, nullopt when absent)
// plus `delta`, or the FAILED_PRECONDITION / OUT_OF_RANGE error naming `key`.
absl::StatusOr<int64_t> AddToCounter(const std::string& key, const std::string* held,
                                     int64_t delta);

}  // namespace gradhub::api
