#include "services/checkpoint/data_keys.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "services/common/sha256.h"

namespace gradhub::checkpoint {
namespace {

constexpr char kMasterKeyIdContext[] = "gradhub master key id v1";
constexpr char kWrapContext[] = "gradhub data key v1";

absl::Status FileError(const std::string& path, const std::string& what) {
  return absl::ErrnoToStatus(errno, absl::StrCat("--master-key-file ", path, ": ", what));
}

// Reads the whole of a small file; the descriptor closed on every path.
absl::StatusOr<std::string> ReadKeyFile(int fd, const std::string& path) {
  struct stat st;
  if (fstat(fd, &st) != 0) return FileError(path, "stat");
  if (!S_ISREG(st.st_mode) || (st.st_mode & 077) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--master-key-file ", path,
                     ": must be a regular file that only its owner may read "
                     "(chmod 600)"));
  }
  std::string bytes(sealed::kKeyBytes + 1, '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FileError(path, "read");
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got != sealed::kKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--master-key-file ", path, ": must hold exactly ", sealed::kKeyBytes, " bytes (",
        got > sealed::kKeyBytes ? "more" : "fewer", " found): head -c 32 /dev/urandom > FILE"));
  }
  bytes.resize(got);
  return bytes;
}

std::string WrapAad(std::string_view id, const KeyScope& scope) {
  return absl::StrCat(kWrapContext, ",", sealed::ToHex(id), ",", scope.ToString());
}

}  // namespace

std::string KeyScope::ToString() const {
  return tenant_id.has_value() ? absl::StrCat("tenant:", *tenant_id) : "platform";
}

MasterKey::MasterKey(const sealed::SecretKey& key)
    : key_(key), id_(Sha256Hex(kMasterKeyIdContext + std::string(key.view())).substr(0, 16)) {}

MasterKey MasterKey::FromKey(const sealed::SecretKey& key) { return MasterKey(key); }

absl::StatusOr<MasterKey> MasterKey::Load(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return FileError(path, "open");
  absl::StatusOr<std::string> bytes = ReadKeyFile(fd, path);
  close(fd);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<sealed::SecretKey> key = sealed::SecretKey::FromBytes(*bytes);
  std::fill(bytes->begin(), bytes->end(), '\0');
  if (!key.ok()) return key.status();
  return MasterKey(*key);
}

absl::StatusOr<MasterKey> MasterKey::Create(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 && errno == EEXIST) {
    return absl::AlreadyExistsError(absl::StrCat("--master-key-file ", path, ": exists"));
  }
  if (fd < 0) return FileError(path, "create");
  const sealed::SecretKey key = sealed::SecretKey::Random();
  const bool written =
      write(fd, key.data(), sealed::kKeyBytes) == static_cast<ssize_t>(sealed::kKeyBytes) &&
      fsync(fd) == 0;
  const absl::Status failed = written ? absl::OkStatus() : FileError(path, "write");
  close(fd);
  if (!failed.ok()) {
    unlink(path.c_str());
    return failed;
  }
  return MasterKey(key);
}

std::string MasterKey::Wrap(const DataKey& key) const {
  const std::string nonce = sealed::RandomBytes(sealed::kNonceBytes);
  return nonce + sealed::GcmSeal(key_, nonce, WrapAad(key.id, key.scope), key.key->view());
}

absl::StatusOr<sealed::SecretKey> MasterKey::Unwrap(std::string_view wrapped, std::string_view id,
                                                    const KeyScope& scope) const {
  if (wrapped.size() != sealed::kNonceBytes + sealed::kKeyBytes + sealed::kTagBytes) {
    return absl::DataLossError("a wrapped data key of the wrong size");
  }
  absl::StatusOr<std::string> plain =
      sealed::GcmOpen(key_, wrapped.substr(0, sealed::kNonceBytes), WrapAad(id, scope),
                      wrapped.substr(sealed::kNonceBytes));
  if (!plain.ok()) {
    return absl::DataLossError(absl::StrCat("data key ", sealed::ToHex(id), " of ",
                                            scope.ToString(), " does not unwrap with master key ",
                                            id_));
  }
  absl::StatusOr<sealed::SecretKey> key = sealed::SecretKey::FromBytes(*plain);
  std::fill(plain->begin(), plain->end(), '\0');
  return key;
}

absl::StatusOr<DataKey> InMemoryDataKeys::Current(const KeyScope& scope) {
  {
    absl::MutexLock lock(&mu_);
    auto current = current_.find(scope.ToString());
    if (current != current_.end()) return by_id_.at(current->second);
  }
  return Rotate(scope);
}

absl::StatusOr<DataKey> InMemoryDataKeys::Find(std::string_view id) {
  absl::MutexLock lock(&mu_);
  auto found = by_id_.find(std::string(id));
  if (found == by_id_.end()) {
    return absl::NotFoundError(absl::StrCat("no data key ", sealed::ToHex(id)));
  }
  return found->second;
}

DataKey InMemoryDataKeys::Rotate(const KeyScope& scope) {
  DataKey key{sealed::RandomBytes(sealed::kKeyIdBytes), scope,
              std::make_shared<const sealed::SecretKey>(sealed::SecretKey::Random())};
  absl::MutexLock lock(&mu_);
  by_id_[key.id] = key;
  current_[scope.ToString()] = key.id;
  return key;
}

}  // namespace gradhub::checkpoint
