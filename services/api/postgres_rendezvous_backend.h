// The rendezvous store's keys in PostgreSQL (table rendezvous_keys, migrations/0017), shared by
// every gradhub-api replica: a key set through one replica is read through any other, and
// outlives the replica that took it (issue #35).
//
// Cost: every op is one statement, one round trip to PostgreSQL (a Set: 75 us on a local
// server, more across a network), against well under a microsecond for a map in memory. A
// Set or Add is acknowledged only once PostgreSQL has committed it (autocommit; durable as
// the server's synchronous_commit makes it). See rendezvous_store.h for what it costs a
// rendezvous.
//
// Errors: a database failure of any op is UNAVAILABLE, "the rendezvous store's database:" and
// the cause, so that a client retries. No op waits out an outage (no backoff, unlike
// Pool::Exec): the store's calls run on StoreService's queue thread, which must stay free for
// the other calls. Set, Read, DeletePrefix and Size are idempotent and are sent once more on a
// fresh connection when theirs was lost (a stale one after a server restart); Add is not and
// runs once: an Add whose connection broke may or may not have counted.
//
// Thread-safe.
#pragma once

#include "services/api/rendezvous_backend.h"
#include "services/common/db/pool.h"

namespace gradhub::api {

class PostgresRendezvousBackend final : public RendezvousBackend {
 public:
  // `pool` is not owned and must outlive this.
  explicit PostgresRendezvousBackend(db::Pool* pool) : pool_(pool) {}

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::StatusOr<std::map<std::string, std::string>> Read(const std::vector<std::string>& keys,
                                                          bool with_values) override;
  absl::StatusOr<int64_t> DeletePrefix(const std::string& prefix) override;
  absl::StatusOr<int64_t> Size() override;
  bool shared() const override { return true; }

 private:
  // Add's error when the upsert refused to count: the held value says which.
  absl::Status AddRefused(const std::string& key, int64_t delta);

  db::Pool* const pool_;
};

// The smallest byte string greater than every string that starts with `prefix`; "" when there
// is none (the prefix is all 0xff bytes). DeletePrefix's range is [prefix, successor).
std::string PrefixSuccessor(const std::string& prefix);

}  // namespace gradhub::api
