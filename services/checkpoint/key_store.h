// The data keys of encryption at rest in PostgreSQL (table checkpoint_keys, migration 0014):
// each row a key id, its scope (a tenant, or NULL for the platform's own), the key wrapped by
// the master key (MasterKey::Wrap), that master key's id, when it was made and, once rotated,
// retired. At most one key per scope is current (a unique index); new blobs are sealed under
// it, and every key, current or retired, stays readable by id for the blobs sealed under it.
//
// Rotation:
//   - a tenant's data key: Rotate(scope) retires the current key and makes a new one in one
//     transaction (`gradhub-checkpoint rotate-key TENANT`). Uploads begun before keep the key
//     they began with; nothing is re-encrypted;
//   - the master key: Rewrap(old) unwraps every key wrapped by the old master and wraps it with
//     this store's, in one transaction (`gradhub-checkpoint rewrap-keys`). Blobs are untouched
//     (they are sealed under data keys, not under the master key).
// A server refuses to start while any key is wrapped by a master key it does not hold
// (CheckAllWrappedByMaster), rather than fail every read of those tenants later.
//
// Thread-safe: unwrapped keys are cached by id (they never change), under a lock.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>

#include "absl/synchronization/mutex.h"
#include "services/checkpoint/data_keys.h"
#include "services/common/db/pool.h"

namespace gradhub::checkpoint {

class KeyStore final : public DataKeys {
 public:
  // Not owned; both must outlive the store.
  KeyStore(db::Pool* pool, const MasterKey* master) : pool_(pool), master_(master) {}

  absl::StatusOr<DataKey> Current(const KeyScope& scope) override;
  // FAILED_PRECONDITION when the key is wrapped by another master key; DATA_LOSS when it does
  // not unwrap.
  absl::StatusOr<DataKey> Find(std::string_view id) override;

  // A new current key for `scope`; the current one (if any) is retired.
  absl::StatusOr<DataKey> Rotate(const KeyScope& scope);
  // Every key wrapped by `old_master` re-wrapped by this store's master key, in one
  // transaction; returns how many. Keys wrapped by this store's master already are left as
  // they are, so running it twice is harmless.
  absl::StatusOr<int> Rewrap(const MasterKey& old_master);
  // FAILED_PRECONDITION naming the other master key ids (and how to re-wrap) when any key is
  // not wrapped by this store's master key.
  absl::Status CheckAllWrappedByMaster();

 private:
  // A row of checkpoint_keys (kKeyColumns) unwrapped, from the cache when known.
  absl::StatusOr<DataKey> FromRow(const db::Row& row);
  absl::StatusOr<DataKey> Insert(db::Transaction& tx, const KeyScope& scope);

  db::Pool* const pool_;
  const MasterKey* const master_;
  absl::Mutex mu_;
  std::unordered_map<std::string, DataKey> cache_ ABSL_GUARDED_BY(mu_);
};

// A uuid's text ("0a1b...-...") and its 16 bytes, both ways; INVALID_ARGUMENT for other text.
absl::StatusOr<std::string> UuidBytes(std::string_view uuid);
std::string UuidText(std::string_view bytes);

}  // namespace gradhub::checkpoint
