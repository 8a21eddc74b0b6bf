// The keys of encryption at rest (sealed_blob_store.h), as two seams and a master key:
//   - DataKeys: the data keys, one current key per scope (a tenant, or the platform for what
//     belongs to no single tenant) and every older one by its id. The server's implementation
//     keeps them in PostgreSQL wrapped by the master key (key_store.h); tests keep them in
//     memory (InMemoryDataKeys);
//   - BlobScopes: which scope and identity an upload or a blob of the BlobStore belongs to
//     (blob_scopes.h reads it from the checkpoint's and the job's rows);
//   - MasterKey: the 32 bytes of --master-key-file, which wrap (AES-256-GCM) every data key.
//
// Thread-safety: DataKeys and BlobScopes implementations are called from any thread. MasterKey
// is immutable once loaded.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/checkpoint/sealed_format.h"

namespace gradhub::checkpoint {

// Whose data key seals a blob: a tenant's, or the platform's (no tenant: code archives, which
// are kept once for every tenant that uploaded the same bytes; code_store.h).
struct KeyScope {
  std::optional<int64_t> tenant_id;

  static KeyScope Platform() { return {}; }
  static KeyScope Tenant(int64_t id) { return {id}; }
  // "tenant:<id>" or "platform": in the AAD of every chunk and of every wrapped key.
  std::string ToString() const;
  bool operator==(const KeyScope& other) const { return tenant_id == other.tenant_id; }
  bool operator!=(const KeyScope& other) const { return !(*this == other); }
};

struct DataKey {
  std::string id;  // sealed::kKeyIdBytes raw bytes (a uuid's)
  KeyScope scope;
  std::shared_ptr<const sealed::SecretKey> key;
};

class DataKeys {
 public:
  virtual ~DataKeys() = default;
  // The key new blobs of `scope` are sealed under; made on first use.
  virtual absl::StatusOr<DataKey> Current(const KeyScope& scope) = 0;
  // Any key, current or retired, by id. NOT_FOUND when there is none (a deleted tenant's).
  virtual absl::StatusOr<DataKey> Find(std::string_view id) = 0;
};

// What a key of the BlobStore belongs to: the scope of its data key, and the identity bound
// into every chunk (the identity of an upload is that of the blob it is committed as).
struct BlobScope {
  KeyScope keys;
  std::string identity;
};

class BlobScopes {
 public:
  virtual ~BlobScopes() = default;
  // NOT_FOUND when nothing owns the key.
  virtual absl::StatusOr<BlobScope> OfUpload(const std::string& upload) = 0;
  virtual absl::StatusOr<BlobScope> OfBlob(const std::string& blob) = 0;
};

// The master key: 32 random bytes in a file of mode 0600 (or stricter), identified by a
// fingerprint. It never leaves this process; data keys are stored wrapped by it.
class MasterKey {
 public:
  // INVALID_ARGUMENT, naming `path`, unless the file holds exactly 32 bytes and neither its
  // group nor others may read or write it; NOT_FOUND when it does not exist.
  static absl::StatusOr<MasterKey> Load(const std::string& path);
  // Writes 32 random bytes to `path` (mode 0600, never over an existing file) and loads them.
  // ALREADY_EXISTS when the file is there.
  static absl::StatusOr<MasterKey> Create(const std::string& path);
  static MasterKey FromKey(const sealed::SecretKey& key);

  // 16 hex digits of SHA-256("gradhub master key id v1" || key): names the key in the rows it
  // wrapped without revealing it.
  const std::string& id() const { return id_; }

  // nonce (12) || AES-256-GCM(key) || tag (16), with AAD binding the key's id and scope, so a
  // wrapped key copied to another row does not unwrap.
  std::string Wrap(const DataKey& key) const;
  // DATA_LOSS when `wrapped` was not made by Wrap with this master key for this id and scope.
  absl::StatusOr<sealed::SecretKey> Unwrap(std::string_view wrapped, std::string_view id,
                                           const KeyScope& scope) const;

 private:
  explicit MasterKey(const sealed::SecretKey& key);
  sealed::SecretKey key_;
  std::string id_;
};

// Data keys in memory, for tests and tools: keys made on first use, rotated on demand.
// Thread-safe.
class InMemoryDataKeys final : public DataKeys {
 public:
  absl::StatusOr<DataKey> Current(const KeyScope& scope) override;
  absl::StatusOr<DataKey> Find(std::string_view id) override;
  // A new current key for `scope`; the old one stays findable.
  DataKey Rotate(const KeyScope& scope);

 private:
  absl::Mutex mu_;
  std::unordered_map<std::string, DataKey> by_id_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::string> current_ ABSL_GUARDED_BY(mu_);  // scope -> id
};

}  // namespace gradhub::checkpoint
