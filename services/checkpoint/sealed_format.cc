#include "services/checkpoint/sealed_format.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace gradhub::checkpoint::sealed {
namespace {

void PutBigEndian(uint64_t value, size_t bytes, std::string* out) {
  for (size_t i = bytes; i > 0; --i) out->push_back(static_cast<char>((value >> (8 * (i - 1)))));
}

uint64_t GetBigEndian(std::string_view bytes) {
  uint64_t value = 0;
  for (const char c : bytes) value = (value << 8) | static_cast<uint8_t>(c);
  return value;
}

[[noreturn]] void Fatal(const char* what) {
  throw std::runtime_error(absl::StrCat("OpenSSL: ", what, " failed"));
}

// Runs one whole GCM operation on `context` (initialized for the cipher, key and nonce):
// `aad`, then `size` bytes of `in` into `out` (may be the same).
bool GcmUpdate(EVP_CIPHER_CTX* context, bool encrypt, std::string_view aad, const char* in,
               char* out, size_t size) {
  int length = 0;
  auto update = encrypt ? EVP_EncryptUpdate : EVP_DecryptUpdate;
  if (!aad.empty() &&
      update(context, nullptr, &length, reinterpret_cast<const uint8_t*>(aad.data()),
             static_cast<int>(aad.size())) != 1) {
    return false;
  }
  return size == 0 || update(context, reinterpret_cast<uint8_t*>(out), &length,
                             reinterpret_cast<const uint8_t*>(in), static_cast<int>(size)) == 1;
}

bool GcmInit(EVP_CIPHER_CTX* context, bool encrypt, const uint8_t* key, std::string_view nonce) {
  auto init = encrypt ? EVP_EncryptInit_ex : EVP_DecryptInit_ex;
  // The key (and the cipher) only when given: a ChunkSealer sets them once.
  if (key != nullptr && init(context, EVP_aes_256_gcm(), nullptr, nullptr, nullptr) != 1) {
    return false;
  }
  if (key != nullptr && EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_IVLEN,
                                            static_cast<int>(nonce.size()), nullptr) != 1) {
    return false;
  }
  return init(context, nullptr, nullptr, key, reinterpret_cast<const uint8_t*>(nonce.data())) == 1;
}

// Seals in place: data[0, size) encrypted, its tag written at data + size.
bool GcmSealInPlace(EVP_CIPHER_CTX* context, const uint8_t* key, std::string_view nonce,
                    std::string_view aad, char* data, size_t size) {
  int length = 0;
  return GcmInit(context, true, key, nonce) && GcmUpdate(context, true, aad, data, data, size) &&
         EVP_EncryptFinal_ex(context, nullptr, &length) == 1 &&
         EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_GET_TAG, kTagBytes, data + size) == 1;
}

// Opens in place; false when the tag does not match (or OpenSSL failed).
bool GcmOpenInPlace(EVP_CIPHER_CTX* context, const uint8_t* key, std::string_view nonce,
                    std::string_view aad, char* record, size_t size) {
  const size_t plain = size - kTagBytes;
  int length = 0;
  return GcmInit(context, false, key, nonce) &&
         GcmUpdate(context, false, aad, record, record, plain) &&
         EVP_CIPHER_CTX_ctrl(context, EVP_CTRL_GCM_SET_TAG, kTagBytes, record + plain) == 1 &&
         EVP_DecryptFinal_ex(context, nullptr, &length) == 1;
}

struct ContextFree {
  void operator()(EVP_CIPHER_CTX* context) const { EVP_CIPHER_CTX_free(context); }
};
using Context = std::unique_ptr<EVP_CIPHER_CTX, ContextFree>;

Context NewContext() {
  Context context(EVP_CIPHER_CTX_new());
  if (context == nullptr) Fatal("EVP_CIPHER_CTX_new");
  return context;
}

}  // namespace

absl::StatusOr<SecretKey> SecretKey::FromBytes(std::string_view bytes) {
  if (bytes.size() != kKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a key has ", kKeyBytes, " bytes, not ", bytes.size()));
  }
  SecretKey key;
  std::memcpy(key.bytes_.data(), bytes.data(), kKeyBytes);
  return key;
}

SecretKey SecretKey::Random() {
  SecretKey key;
  if (RAND_bytes(key.bytes_.data(), static_cast<int>(kKeyBytes)) != 1) Fatal("RAND_bytes");
  return key;
}

SecretKey::~SecretKey() { OPENSSL_cleanse(bytes_.data(), bytes_.size()); }

std::string RandomBytes(size_t count) {
  std::string bytes(count, '\0');
  if (count > 0 &&
      RAND_bytes(reinterpret_cast<uint8_t*>(bytes.data()), static_cast<int>(count)) != 1) {
    Fatal("RAND_bytes");
  }
  return bytes;
}

std::string GcmSeal(const SecretKey& key, std::string_view nonce, std::string_view aad,
                    std::string_view plaintext) {
  Context context = NewContext();
  std::string sealed(plaintext);
  sealed.resize(plaintext.size() + kTagBytes);
  if (!GcmSealInPlace(context.get(), key.data(), nonce, aad, sealed.data(), plaintext.size())) {
    Fatal("AES-256-GCM seal");
  }
  return sealed;
}

absl::StatusOr<std::string> GcmOpen(const SecretKey& key, std::string_view nonce,
                                    std::string_view aad, std::string_view sealed) {
  if (sealed.size() < kTagBytes) return absl::DataLossError("sealed bytes shorter than a tag");
  Context context = NewContext();
  std::string plain(sealed);
  if (!GcmOpenInPlace(context.get(), key.data(), nonce, aad, plain.data(), plain.size())) {
    OPENSSL_cleanse(plain.data(), plain.size());
    return absl::DataLossError("the tag does not match");
  }
  plain.resize(sealed.size() - kTagBytes);
  return plain;
}

SecretKey DeriveKey(const SecretKey& key, std::string_view salt, std::string_view info) {
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, OSSL_KDF_NAME_HKDF, nullptr);
  if (kdf == nullptr) Fatal("EVP_KDF_fetch(HKDF)");
  EVP_KDF_CTX* context = EVP_KDF_CTX_new(kdf);
  EVP_KDF_free(kdf);
  if (context == nullptr) Fatal("EVP_KDF_CTX_new");
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_octet_string(
                             OSSL_KDF_PARAM_KEY, const_cast<uint8_t*>(key.data()), kKeyBytes),
                         OSSL_PARAM_construct_octet_string(
                             OSSL_KDF_PARAM_SALT, const_cast<char*>(salt.data()), salt.size()),
                         OSSL_PARAM_construct_octet_string(
                             OSSL_KDF_PARAM_INFO, const_cast<char*>(info.data()), info.size()),
                         OSSL_PARAM_construct_end()};
  std::array<uint8_t, kKeyBytes> derived;
  const int ok = EVP_KDF_derive(context, derived.data(), derived.size(), params);
  EVP_KDF_CTX_free(context);
  if (ok != 1) Fatal("HKDF");
  SecretKey out = *SecretKey::FromBytes(
      std::string_view(reinterpret_cast<const char*>(derived.data()), derived.size()));
  OPENSSL_cleanse(derived.data(), derived.size());
  return out;
}

Header Header::Fresh(std::string key_id) {
  Header header;
  header.key_id = std::move(key_id);
  header.salt = RandomBytes(kSaltBytes);
  header.nonce_prefix = RandomBytes(kNoncePrefixBytes);
  return header;
}

std::string Header::Encode() const {
  std::string bytes(kMagic, 8);
  PutBigEndian(version, 4, &bytes);
  PutBigEndian(chunk_bytes, 4, &bytes);
  absl::StrAppend(&bytes, Params());
  bytes.resize(kHeaderBytes, '\0');
  return bytes;
}

absl::StatusOr<Header> Header::Parse(std::string_view bytes) {
  if (bytes.size() < static_cast<size_t>(kHeaderBytes) || bytes.substr(0, 8) != kMagic) {
    return absl::DataLossError("it is not a sealed blob (no GHSEALED header)");
  }
  Header header;
  header.version = static_cast<uint32_t>(GetBigEndian(bytes.substr(8, 4)));
  header.chunk_bytes = static_cast<uint32_t>(GetBigEndian(bytes.substr(12, 4)));
  if (header.version != kFormatVersion || header.chunk_bytes != kChunkBytes) {
    return absl::DataLossError(absl::StrCat(
        "its header says format ", header.version, " with chunks of ", header.chunk_bytes,
        " bytes; this server reads format ", kFormatVersion, " with chunks of ", kChunkBytes));
  }
  const size_t params = kKeyIdBytes + kSaltBytes + kNoncePrefixBytes;
  Header parsed = *FromParams(bytes.substr(16, params));
  const std::string_view pad = bytes.substr(16 + params, kHeaderBytes - 16 - params);
  if (pad.find_first_not_of('\0') != std::string_view::npos) {
    return absl::DataLossError("its header's padding is not zeros");
  }
  return parsed;
}

absl::StatusOr<Header> Header::FromParams(std::string_view params) {
  if (params.size() != kKeyIdBytes + kSaltBytes + kNoncePrefixBytes) {
    return absl::InvalidArgumentError("sealing parameters of the wrong size");
  }
  Header header;
  header.key_id = std::string(params.substr(0, kKeyIdBytes));
  header.salt = std::string(params.substr(kKeyIdBytes, kSaltBytes));
  header.nonce_prefix = std::string(params.substr(kKeyIdBytes + kSaltBytes));
  return header;
}

int64_t SealedSize(int64_t plain_bytes) {
  return kHeaderBytes + (plain_bytes / kChunkBytes) * kRecordBytes + plain_bytes % kChunkBytes +
         static_cast<int64_t>(kTagBytes);
}

absl::StatusOr<int64_t> PlainSize(int64_t sealed_bytes) {
  const int64_t body = sealed_bytes - kHeaderBytes;
  const int64_t last = body % kRecordBytes;
  if (body < static_cast<int64_t>(kTagBytes) || last < static_cast<int64_t>(kTagBytes)) {
    return absl::DataLossError(absl::StrCat("its ", sealed_bytes,
                                            " bytes are not a sealed blob's size (cut or "
                                            "extended inside a chunk)"));
  }
  return (body / kRecordBytes) * kChunkBytes + last - static_cast<int64_t>(kTagBytes);
}

std::string BlobBinding(std::string_view scope, std::string_view identity) {
  return absl::StrCat(scope.size(), ":", absl::string_view(scope.data(), scope.size()), ",",
                      identity.size(), ":", absl::string_view(identity.data(), identity.size()));
}

ChunkSealer::ChunkSealer(const SecretKey& data_key, const Header& header, std::string_view binding)
    : chunk_key_(DeriveKey(data_key, header.salt, kChunkKeyInfo)),
      nonce_prefix_(header.nonce_prefix),
      context_(NewContext().release()) {
  aad_prefix_ = std::string(kMagic, 8);
  PutBigEndian(header.version, 4, &aad_prefix_);
  PutBigEndian(header.chunk_bytes, 4, &aad_prefix_);
  aad_prefix_ += header.Params();
  aad_prefix_ += binding;
}

ChunkSealer::~ChunkSealer() = default;
ChunkSealer::ChunkSealer(ChunkSealer&&) noexcept = default;
ChunkSealer& ChunkSealer::operator=(ChunkSealer&&) noexcept = default;

void ChunkSealer::Free::operator()(evp_cipher_ctx_st* context) const {
  EVP_CIPHER_CTX_free(context);
}

std::string ChunkSealer::Aad(uint64_t index, bool final) const {
  std::string aad = aad_prefix_;
  PutBigEndian(index, 8, &aad);
  aad.push_back(final ? '\1' : '\0');
  return aad;
}

std::string ChunkSealer::Nonce(uint64_t index) const {
  std::string nonce = nonce_prefix_;
  PutBigEndian(index, 4, &nonce);
  return nonce;
}

absl::Status ChunkSealer::Seal(uint64_t index, bool final, char* data, size_t size) {
  if (index >= kMaxChunks || size > static_cast<size_t>(kChunkBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", index, " of ", size, " bytes is beyond what one blob may hold"));
  }
  if (!GcmSealInPlace(context_.get(), chunk_key_.data(), Nonce(index), Aad(index, final), data,
                      size)) {
    Fatal("AES-256-GCM seal");
  }
  return absl::OkStatus();
}

absl::Status ChunkSealer::Open(uint64_t index, bool final, char* record, size_t size) {
  if (index >= kMaxChunks || size < kTagBytes || size > static_cast<size_t>(kRecordBytes) ||
      !GcmOpenInPlace(context_.get(), chunk_key_.data(), Nonce(index), Aad(index, final), record,
                      size)) {
    return absl::DataLossError(absl::StrCat("chunk ", index, final ? " (the last)" : "",
                                            " failed its authentication: the blob was changed, "
                                            "cut, extended or copied from another"));
  }
  return absl::OkStatus();
}

std::string ToHex(std::string_view bytes) {
  return absl::BytesToHexString(absl::string_view(bytes.data(), bytes.size()));
}

absl::StatusOr<std::string> FromHex(std::string_view hex) {
  const bool hex_digits = std::all_of(hex.begin(), hex.end(), [](char c) {
    return absl::ascii_isxdigit(static_cast<unsigned char>(c));
  });
  if (hex.size() % 2 != 0 || !hex_digits) {
    return absl::InvalidArgumentError(absl::StrCat("'", std::string(hex), "' is not hex"));
  }
  return absl::HexStringToBytes(absl::string_view(hex.data(), hex.size()));
}

}  // namespace gradhub::checkpoint::sealed
