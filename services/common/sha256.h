#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX, kept out of this header

namespace gradhub {

// Lowercase hex SHA-256 of `data` (OpenSSL). Used for migration checksums, token hashes and
// checkpoint integrity, so every component agrees on one encoding.
std::string Sha256Hex(std::string_view data);

// Lowercase hex SHA-256 of the file at `path`, read in large blocks. An error names the path
// (NOT_FOUND when it is missing).
absl::StatusOr<std::string> Sha256OfFile(const std::string& path);

// SHA-256 over bytes that arrive in pieces, so an upload is hashed as it is received and a
// download as it is read, instead of reading the blob again afterwards. Not thread-safe.
// OpenSSL fails only when out of memory or misconfigured: that throws std::runtime_error.
class Sha256Stream {
 public:
  Sha256Stream();
  void Update(std::string_view data);
  // Lowercase hex of everything given so far; Update may continue afterwards.
  std::string Hex() const;

 private:
  struct Free {
    void operator()(evp_md_ctx_st* context) const;
  };
  std::unique_ptr<evp_md_ctx_st, Free> context_;
};

}  // namespace gradhub
