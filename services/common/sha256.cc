#include "services/common/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "absl/status/status.h"

namespace gradhub {

std::string Sha256Hex(std::string_view data) {
  Sha256Stream sha;
  sha.Update(data);
  return sha.Hex();
}

absl::StatusOr<std::string> Sha256OfFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const std::string message = path + ": " + std::strerror(errno);
    return errno == ENOENT ? absl::NotFoundError(message) : absl::InternalError(message);
  }
  Sha256Stream sha;
  std::vector<char> buffer(size_t{4} << 20);
  ssize_t n = 0;
  while ((n = read(fd, buffer.data(), buffer.size())) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) sha.Update(std::string_view(buffer.data(), static_cast<size_t>(n)));
  }
  const int read_errno = errno;
  close(fd);
  if (n < 0) return absl::InternalError(path + ": read: " + std::strerror(read_errno));
  return sha.Hex();
}

void Sha256Stream::Free::operator()(evp_md_ctx_st* context) const { EVP_MD_CTX_free(context); }

Sha256Stream::Sha256Stream() : context_(EVP_MD_CTX_new()) {
  if (!context_ || EVP_DigestInit_ex(context_.get(), EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("EVP_DigestInit_ex(sha256) failed");
  }
}

void Sha256Stream::Update(std::string_view data) {
  if (EVP_DigestUpdate(context_.get(), data.data(), data.size()) != 1) {
    throw std::runtime_error("EVP_DigestUpdate(sha256) failed");
  }
}

std::string Sha256Stream::Hex() const {
  std::unique_ptr<evp_md_ctx_st, Free> copy(EVP_MD_CTX_new());
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (!copy || EVP_MD_CTX_copy_ex(copy.get(), context_.get()) != 1 ||
      EVP_DigestFinal_ex(copy.get(), digest, &length) != 1) {
    throw std::runtime_error("EVP_DigestFinal_ex(sha256) failed");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex(2 * length, '0');
  for (unsigned int i = 0; i < length; ++i) {
    hex[2 * i] = kHex[digest[i] >> 4];
    hex[2 * i + 1] = kHex[digest[i] & 0xf];
  }
  return hex;
}

}  // namespace gradhub
