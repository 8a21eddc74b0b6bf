#include "gpu_worker/ddp/comm/gloo/traffic_sealing.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

namespace gradhub::ddp {
namespace {

constexpr char kLabel[] = "gradhub collective traffic v1";
constexpr size_t kNonceBytes = 12;
// EVP takes int lengths: longer messages go through in pieces of this many bytes.
constexpr size_t kPieceBytes = size_t{1} << 30;

void AppendU32(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void AppendU64(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// Steps 2 and 4 of the header: injective, so two directions never share a key or an AAD.
std::string Encode(const TrafficDirection& direction) {
  std::string out(kLabel, sizeof(kLabel));  // with its NUL: the label ends unambiguously
  AppendU32(out, static_cast<uint32_t>(direction.group.size()));
  out += direction.group;
  AppendU32(out, static_cast<uint32_t>(direction.channel));
  AppendU32(out, static_cast<uint32_t>(direction.sender));
  AppendU32(out, static_cast<uint32_t>(direction.receiver));
  return out;
}

std::array<uint8_t, kNonceBytes> NonceOf(const MessageLabel& label) {
  std::string bytes;
  AppendU64(bytes, label.collective);
  AppendU32(bytes, label.message);
  std::array<uint8_t, kNonceBytes> nonce{};
  std::memcpy(nonce.data(), bytes.data(), kNonceBytes);
  return nonce;
}

[[noreturn]] void Fail(const char* what) {
  throw std::runtime_error(std::string("traffic sealing: ") + what + " failed (OpenSSL)");
}

struct KdfDeleter {
  void operator()(EVP_KDF* kdf) const { EVP_KDF_free(kdf); }
  void operator()(EVP_KDF_CTX* ctx) const { EVP_KDF_CTX_free(ctx); }
};

struct CipherDeleter {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};
using CipherContext = std::unique_ptr<EVP_CIPHER_CTX, CipherDeleter>;

// A context keyed once (the AES key schedule is the costly part of setting it up); each
// message then only sets its nonce.
CipherContext KeyedContext(const std::array<uint8_t, 32>& key, bool encrypt) {
  CipherContext ctx(EVP_CIPHER_CTX_new());
  if (!ctx) Fail("EVP_CIPHER_CTX_new");
  const int ok =
      encrypt ? EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), nullptr)
              : EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, key.data(), nullptr);
  if (ok != 1) Fail("keying AES-256-GCM");
  return ctx;
}

// Runs EVP_{En,De}cryptUpdate over `bytes` bytes in pieces EVP's int lengths can take.
bool Update(EVP_CIPHER_CTX* ctx, bool encrypt, const uint8_t* in, size_t bytes, uint8_t* out) {
  for (size_t done = 0; done < bytes;) {
    const int piece = static_cast<int>(std::min(bytes - done, kPieceBytes));
    int written = 0;
    const int ok = encrypt ? EVP_EncryptUpdate(ctx, out + done, &written, in + done, piece)
                           : EVP_DecryptUpdate(ctx, out + done, &written, in + done, piece);
    if (ok != 1 || written != piece) return false;
    done += static_cast<size_t>(piece);
  }
  return true;
}

}  // namespace

TrafficAuthenticationError::TrafficAuthenticationError(int sender)
    : std::runtime_error("collective traffic failed authentication from rank " +
                         std::to_string(sender) + " (tampered or corrupted)") {}

TrafficKey DrawTrafficKey() {
  TrafficKey key{};
  if (RAND_bytes(key.data(), static_cast<int>(key.size())) != 1) Fail("RAND_bytes");
  return key;
}

std::array<uint8_t, 32> DeriveDirectionKey(const TrafficKey& group_key,
                                           const TrafficDirection& direction) {
  std::unique_ptr<EVP_KDF, KdfDeleter> kdf(EVP_KDF_fetch(nullptr, "HKDF", nullptr));
  if (!kdf) Fail("EVP_KDF_fetch(HKDF)");
  std::unique_ptr<EVP_KDF_CTX, KdfDeleter> ctx(EVP_KDF_CTX_new(kdf.get()));
  if (!ctx) Fail("EVP_KDF_CTX_new");
  std::string info = Encode(direction);
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<uint8_t*>(group_key.data()),
                                        group_key.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info.data(), info.size()),
      OSSL_PARAM_construct_end()};
  std::array<uint8_t, 32> key{};
  if (EVP_KDF_derive(ctx.get(), key.data(), key.size(), params) != 1) Fail("HKDF-SHA256");
  return key;
}

struct DirectionCipher::Contexts {
  CipherContext seal;
  CipherContext open;
};

DirectionCipher::DirectionCipher(const TrafficKey& group_key, TrafficDirection direction)
    : direction_(std::move(direction)),
      direction_aad_(Encode(direction_)),
      contexts_(std::make_unique<Contexts>()) {
  const std::array<uint8_t, 32> key = DeriveDirectionKey(group_key, direction_);
  contexts_->seal = KeyedContext(key, /*encrypt=*/true);
  contexts_->open = KeyedContext(key, /*encrypt=*/false);
}

DirectionCipher::~DirectionCipher() = default;

void DirectionCipher::Begin(void* raw, bool encrypt, const MessageLabel& label) {
  auto* ctx = static_cast<EVP_CIPHER_CTX*>(raw);
  const auto nonce = NonceOf(label);
  const int ok = encrypt ? EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce.data())
                         : EVP_DecryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce.data());
  if (ok != 1) Fail("setting the nonce");
  std::string aad = direction_aad_;
  AppendU64(aad, label.collective);
  AppendU32(aad, label.message);
  int ignored = 0;
  const auto* data = reinterpret_cast<const uint8_t*>(aad.data());
  const int len = static_cast<int>(aad.size());
  const int fed = encrypt ? EVP_EncryptUpdate(ctx, nullptr, &ignored, data, len)
                          : EVP_DecryptUpdate(ctx, nullptr, &ignored, data, len);
  if (fed != 1) Fail("adding the AAD");
}

void DirectionCipher::Seal(const MessageLabel& label, const void* plain, size_t bytes,
                           uint8_t* sealed) {
  EVP_CIPHER_CTX* ctx = contexts_->seal.get();
  Begin(ctx, /*encrypt=*/true, label);
  if (!Update(ctx, true, static_cast<const uint8_t*>(plain), bytes, sealed)) Fail("encrypting");
  int written = 0;
  if (EVP_EncryptFinal_ex(ctx, sealed + bytes, &written) != 1 || written != 0) Fail("finishing");
  if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, kSealTagBytes, sealed + bytes) != 1) {
    Fail("reading the tag");
  }
}

bool DirectionCipher::Open(const MessageLabel& label, const uint8_t* sealed, size_t bytes,
                           void* plain) {
  EVP_CIPHER_CTX* ctx = contexts_->open.get();
  Begin(ctx, /*encrypt=*/false, label);
  if (!Update(ctx, false, sealed, bytes, static_cast<uint8_t*>(plain))) return false;
  std::array<uint8_t, kSealTagBytes> tag{};
  std::memcpy(tag.data(), sealed + bytes, kSealTagBytes);
  if (EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, kSealTagBytes, tag.data()) != 1) {
    Fail("setting the tag");
  }
  int written = 0;
  return EVP_DecryptFinal_ex(ctx, static_cast<uint8_t*>(plain) + bytes, &written) == 1;
}

}  // namespace gradhub::ddp
