#pragma once

#include <string>
#include <string_view>

namespace gradhub {

// Lowercase hex SHA-256 of `data` (OpenSSL). Used for migration checksums, token hashes and
// checkpoint integrity, so every component agrees on one encoding.
std::string Sha256Hex(std::string_view data);

}  // namespace gradhub
