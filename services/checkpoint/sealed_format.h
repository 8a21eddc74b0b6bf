// The on-disk format of a blob encrypted at rest (sealed_blob_store.h), and the AES-256-GCM
// (OpenSSL EVP) it is made of. No I/O here: bytes in, bytes out.
//
// A sealed blob is a header, then the blob's bytes in chunks, each sealed on its own so that a
// stream is encrypted and checked piece by piece:
//
//   header  kHeaderBytes  "GHSEALED", format version, chunk size, the data key's id, a random
//                         128-bit salt and a random 64-bit nonce prefix (big-endian integers),
//                         zeros to kHeaderBytes (so the records after it stay block-aligned for
//                         O_DIRECT; a non-zero pad is refused)
//   record  kRecordBytes  chunk 0: kChunkBytes of ciphertext and its 16-byte GCM tag
//   ...
//   record  16..          the last chunk: 0 to kChunkBytes - 1 bytes and its tag (a blob whose
//                         size is a multiple of kChunkBytes ends with an empty last chunk)
//
// Sealing chunk i:
//   1. the chunk key is HKDF-SHA256(the tenant's data key, salt, kChunkKeyInfo): a fresh key per
//      blob, so a nonce never repeats under one key however many blobs a data key seals (the
//      64-bit prefixes alone would collide after ~2^32 blobs);
//   2. nonce = nonce prefix || i (32 bits, big-endian): unique within the blob;
//   3. AAD = the binding (every header field, the tenant the key belongs to, and the identity of
//      the blob, e.g. "<job>/<step>-<upload>") || i (64 bits) || final flag (1 byte).
// So a chunk moved to another position (its index), a blob cut after a chunk (no final chunk),
// bytes added after the final chunk (the sizes no longer parse, or a record follows a final
// one), a blob copied over another job's (its identity) or another tenant's (its key, and the
// tenant in the AAD) all fail the tag: DATA_LOSS.
//
// Thread-safety: the free functions are; a ChunkSealer is used by one thread at a time.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

struct evp_cipher_ctx_st;  // OpenSSL's EVP_CIPHER_CTX, kept out of this header

namespace gradhub::checkpoint::sealed {

inline constexpr char kMagic[] = "GHSEALED";  // 8 bytes on disk, no NUL
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr size_t kKeyBytes = 32;  // AES-256
inline constexpr size_t kTagBytes = 16;
inline constexpr size_t kKeyIdBytes = 16;  // a uuid's bytes
inline constexpr size_t kSaltBytes = 16;
inline constexpr size_t kNoncePrefixBytes = 8;
inline constexpr size_t kNonceBytes = 12;
inline constexpr int64_t kHeaderBytes = 4096;
inline constexpr int64_t kRecordBytes = 1 << 20;
inline constexpr int64_t kChunkBytes = kRecordBytes - kTagBytes;
// The nonce's counter is 32 bits: at most 2^32 chunks (4 PiB) in one blob.
inline constexpr uint64_t kMaxChunks = uint64_t{1} << 32;
inline constexpr char kChunkKeyInfo[] = "gradhub sealed blob v1: chunk key";

// 32 secret bytes, wiped when destroyed. Copyable (a copy is wiped too).
class SecretKey {
 public:
  SecretKey() { bytes_.fill(0); }
  // INVALID_ARGUMENT unless `bytes` has kKeyBytes bytes.
  static absl::StatusOr<SecretKey> FromBytes(std::string_view bytes);
  // From the system's CSPRNG (OpenSSL RAND_bytes).
  static SecretKey Random();
  SecretKey(const SecretKey& other) = default;
  SecretKey& operator=(const SecretKey& other) = default;
  ~SecretKey();

  const uint8_t* data() const { return bytes_.data(); }
  std::string_view view() const {
    return {reinterpret_cast<const char*>(bytes_.data()), bytes_.size()};
  }

 private:
  std::array<uint8_t, kKeyBytes> bytes_;
};

// `count` bytes from the system's CSPRNG. Throws std::runtime_error if OpenSSL cannot seed.
std::string RandomBytes(size_t count);

// One AES-256-GCM message: ciphertext || tag. For small secrets (wrapping data keys); chunks go
// through ChunkSealer, which reuses its context and seals in place.
std::string GcmSeal(const SecretKey& key, std::string_view nonce, std::string_view aad,
                    std::string_view plaintext);
// DATA_LOSS when the tag does not match.
absl::StatusOr<std::string> GcmOpen(const SecretKey& key, std::string_view nonce,
                                    std::string_view aad, std::string_view sealed);

// HKDF-SHA256 (RFC 5869) of `key` with `salt` and `info`: a key of kKeyBytes.
SecretKey DeriveKey(const SecretKey& key, std::string_view salt, std::string_view info);

struct Header {
  uint32_t version = kFormatVersion;
  uint32_t chunk_bytes = kChunkBytes;
  std::string key_id;        // kKeyIdBytes
  std::string salt;          // kSaltBytes
  std::string nonce_prefix;  // kNoncePrefixBytes

  // A header for a new blob sealed under `key_id`: a fresh random salt and nonce prefix.
  static Header Fresh(std::string key_id);
  // kHeaderBytes.
  std::string Encode() const;
  // DATA_LOSS naming what is wrong: not this format, another version or chunk size, a pad that
  // is not zeros.
  static absl::StatusOr<Header> Parse(std::string_view bytes);
  // key_id || salt || nonce_prefix, what identifies the sealing of one blob.
  std::string Params() const { return key_id + salt + nonce_prefix; }
  // The inverse of Params(): INVALID_ARGUMENT unless `params` has the size it makes.
  static absl::StatusOr<Header> FromParams(std::string_view params);
};

// Sizes of a blob of `plain_bytes` when sealed, and back (DATA_LOSS when `sealed_bytes` is no
// sealed blob's size: cut inside a record, or shorter than a header and one tag).
int64_t SealedSize(int64_t plain_bytes);
absl::StatusOr<int64_t> PlainSize(int64_t sealed_bytes);
// Where record `index` starts in the sealed blob.
inline int64_t RecordOffset(uint64_t index) {
  return kHeaderBytes + static_cast<int64_t>(index) * kRecordBytes;
}
// The number of chunks of a blob of `plain_bytes` (the last one possibly empty).
inline uint64_t ChunkCount(int64_t plain_bytes) {
  return static_cast<uint64_t>(plain_bytes / kChunkBytes) + 1;
}

// Seals or opens the chunks of one blob, in place. Not thread-safe; one per upload or reader.
class ChunkSealer {
 public:
  // `data_key`: the key `header.key_id` names; `binding`: the owner and identity of the blob
  // (BlobBinding), which go into every chunk's AAD with the header's fields.
  ChunkSealer(const SecretKey& data_key, const Header& header, std::string_view binding);
  ~ChunkSealer();
  ChunkSealer(ChunkSealer&&) noexcept;
  ChunkSealer& operator=(ChunkSealer&&) noexcept;

  // Encrypts data[0, size) in place and writes its tag at data + size: record `index`.
  // INVALID_ARGUMENT for an index past kMaxChunks or a chunk over kChunkBytes.
  absl::Status Seal(uint64_t index, bool final, char* data, size_t size);
  // Decrypts record[0, size - kTagBytes) in place; DATA_LOSS, naming the chunk, unless its tag
  // matches (then the bytes in `record` are garbage and must not be used).
  absl::Status Open(uint64_t index, bool final, char* record, size_t size);

 private:
  struct Free {
    void operator()(evp_cipher_ctx_st* context) const;
  };
  std::string Aad(uint64_t index, bool final) const;
  std::string Nonce(uint64_t index) const;

  SecretKey chunk_key_;
  std::string nonce_prefix_;
  std::string aad_prefix_;
  std::unique_ptr<evp_cipher_ctx_st, Free> context_;
};

// The binding of a blob for ChunkSealer: the key scope (e.g. "tenant:7") and the identity, each
// length-prefixed so that no two pairs make the same bytes.
std::string BlobBinding(std::string_view scope, std::string_view identity);

// Lowercase hex, and back (INVALID_ARGUMENT for anything but an even count of hex digits).
std::string ToHex(std::string_view bytes);
absl::StatusOr<std::string> FromHex(std::string_view hex);

}  // namespace gradhub::checkpoint::sealed
