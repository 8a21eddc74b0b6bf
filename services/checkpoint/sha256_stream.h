// SHA-256 over bytes that arrive in pieces (OpenSSL EVP), so an upload is hashed as it is
// received and a download as it is read, instead of reading the blob again afterwards.
#pragma once

#include <openssl/evp.h>

#include <memory>
#include <string>
#include <string_view>

namespace gradhub::checkpoint {

// Not thread-safe.
class Sha256Stream {
 public:
  Sha256Stream();
  void Update(std::string_view data);
  // Lowercase hex of everything given so far; Update may continue afterwards.
  std::string Hex() const;

 private:
  struct Free {
    void operator()(EVP_MD_CTX* context) const { EVP_MD_CTX_free(context); }
  };
  std::unique_ptr<EVP_MD_CTX, Free> context_;
};

}  // namespace gradhub::checkpoint
