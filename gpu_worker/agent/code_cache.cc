#include "gpu_worker/agent/code_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gradhub/v1/code.grpc.pb.h"
#include "services/common/sha256.h"

namespace gradhub::agent {
namespace {

constexpr char kDigestPrefix[] = "sha256:";
constexpr char kArchiveSuffix[] = ".tar";
constexpr char kPartSuffix[] = ".tar.part";

bool IsLowerHex64(std::string_view text) {
  return text.size() == 64 && std::all_of(text.begin(), text.end(), [](char c) {
           return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f');
         });
}

// "sha256:<hex>" -> <hex>.
absl::StatusOr<std::string> HexOf(const std::string& digest) {
  if (!absl::StartsWith(digest, kDigestPrefix) ||
      !IsLowerHex64(std::string_view(digest).substr(sizeof(kDigestPrefix) - 1))) {
    return absl::InvalidArgumentError(
        absl::StrCat("code digest '", digest, "' is not sha256:<64 lowercase hex digits>"));
  }
  return digest.substr(sizeof(kDigestPrefix) - 1);
}

absl::Status ErrnoError(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// A download's file as it grows: the bytes so far, their running sha256, and the first local
// error (which no retry of the stream can fix).
struct PartialFile {
  PartialFile(std::string file, int64_t max) : path(std::move(file)), max_bytes(max) {}
  ~PartialFile() {
    if (fd >= 0) close(fd);
  }

  absl::Status Open() {
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    return fd >= 0 ? absl::OkStatus() : ErrnoError("create " + path);
  }
  void Append(std::string_view data) {
    if (written + static_cast<int64_t>(data.size()) > max_bytes) {
      error = absl::ResourceExhaustedError(
          absl::StrCat("the archive is larger than the node's code cache (", max_bytes, " bytes)"));
      return;
    }
    sha.Update(data);
    for (size_t done = 0; done < data.size();) {
      const ssize_t n = write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        error = ErrnoError("write " + path);
        return;
      }
      done += static_cast<size_t>(n);
    }
    written += static_cast<int64_t>(data.size());
  }
  // No fsync: the cache is not the archive's home, only a copy checked by its sha256. After a
  // crash, an archive found at start-up is hashed again before its first use (step 3), so a
  // torn file is fetched again; a flush would only add a disk write to every rank's start.
  absl::Status Close() {
    const int result = close(fd);
    fd = -1;
    return result == 0 ? absl::OkStatus() : ErrnoError("close " + path);
  }

  const std::string path;
  const int64_t max_bytes;
  int fd = -1;
  int64_t written = 0;
  Sha256Stream sha;
  absl::Status error;
};

// One DownloadCode stream from partial->written to its end (or its failure).
grpc::Status StreamInto(v1::CodeService::Stub& stub, const std::string& token,
                        const std::string& hex, absl::Time deadline, PartialFile* partial) {
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  context.set_deadline(absl::ToChronoTime(deadline));
  v1::DownloadCodeRequest request;
  request.set_name("code/" + hex);
  request.set_offset(partial->written);
  std::unique_ptr<grpc::ClientReader<v1::DownloadCodeResponse>> reader =
      stub.DownloadCode(&context, request);
  v1::DownloadCodeResponse message;
  while (reader->Read(&message)) {
    partial->Append(message.data());
    if (!partial->error.ok()) {
      context.TryCancel();
      break;
    }
  }
  return reader->Finish();
}

// Streams until the archive is whole, resuming where a broken stream stopped; retried as the
// node's clients retry (IsRetryable, the shared backoff) until `options.fetch_timeout`.
grpc::Status StreamWithRetries(v1::CodeService::Stub& stub, const CodeCacheOptions& options,
                               const std::string& hex, const std::string& address,
                               PartialFile* partial) {
  Backoff backoff(options.backoff);
  const auto steady_deadline =
      Backoff::Clock::now() + absl::ToChronoNanoseconds(options.fetch_timeout);
  const absl::Time deadline = absl::Now() + options.fetch_timeout;
  while (true) {
    const int64_t before = partial->written;
    const grpc::Status status = StreamInto(stub, options.token, hex, deadline, partial);
    if (status.ok() || !partial->error.ok() || !IsRetryable(status)) return status;
    if (partial->written > before) backoff.Reset();
    const std::optional<std::chrono::nanoseconds> wait = backoff.NextBefore(steady_deadline);
    if (!wait) return status;
    std::cerr << "gradhub-agent: downloading code/" << hex << " from " << address << ": "
              << status.error_message() << " (" << status.error_code() << "); again from byte "
              << partial->written << "\n";
    std::this_thread::sleep_for(*wait);
  }
}

// Renames a verified download into place (atomic; not made durable, see PartialFile::Close).
absl::Status Publish(const std::string& from, const std::string& to) {
  if (rename(from.c_str(), to.c_str()) != 0) return ErrnoError("rename " + from);
  return absl::OkStatus();
}

// The directory's entries in the order of their modification, oldest first, so that the
// archives an earlier agent used last are the last to go.
std::vector<std::filesystem::directory_entry> ByModification(const std::string& dir) {
  std::vector<std::filesystem::directory_entry> files;
  std::error_code error;
  for (const auto& file : std::filesystem::directory_iterator(dir, error)) files.push_back(file);
  auto mtime = [](const std::filesystem::directory_entry& file) {
    std::error_code ignored;
    return file.last_write_time(ignored);
  };
  std::sort(files.begin(), files.end(),
            [&](const auto& a, const auto& b) { return mtime(a) < mtime(b); });
  return files;
}

}  // namespace

struct CodeCache::Flight {
  absl::Notification done;
  absl::Status status;
};

// ---------------------------------------------------------------------------------------------
// Lease.

CodeCache::Lease::Lease(CodeCache* cache, std::string hex, std::string path)
    : cache_(cache), hex_(std::move(hex)), path_(std::move(path)) {}

CodeCache::Lease::Lease(Lease&& other) noexcept
    : cache_(std::exchange(other.cache_, nullptr)),
      hex_(std::move(other.hex_)),
      path_(std::move(other.path_)) {}

CodeCache::Lease& CodeCache::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    Release();
    cache_ = std::exchange(other.cache_, nullptr);
    hex_ = std::move(other.hex_);
    path_ = std::move(other.path_);
  }
  return *this;
}

CodeCache::Lease::~Lease() { Release(); }

void CodeCache::Lease::Release() {
  if (cache_ != nullptr) std::exchange(cache_, nullptr)->Unlease(hex_);
}

// ---------------------------------------------------------------------------------------------
// Start-up.

CodeCache::CodeCache(std::string dir, CodeCacheOptions options)
    : dir_(std::move(dir)), options_(std::move(options)) {
  setup_ = SetUpDirectory();
  if (!setup_.ok()) return;
  absl::MutexLock lock(&mu_);
  for (const auto& file : ByModification(dir_)) {
    const std::string name = file.path().filename().string();
    std::error_code error;
    if (absl::EndsWith(name, kPartSuffix)) {
      // A download the last agent did not finish: its bytes were never verified.
      std::filesystem::remove(file.path(), error);
    } else if (absl::EndsWith(name, kArchiveSuffix) && file.is_regular_file(error) &&
               IsLowerHex64(name.substr(0, name.size() - sizeof(kArchiveSuffix) + 1))) {
      Entry& entry = entries_[name.substr(0, 64)];
      entry.size = static_cast<int64_t>(file.file_size(error));
      entry.last_use = ++use_clock_;
      entry.state = Entry::kUnverified;
    }
  }
  EvictLocked();
}

CodeCache::~CodeCache() = default;

absl::Status CodeCache::SetUpDirectory() {
  std::error_code error;
  std::filesystem::create_directories(dir_, error);
  if (error) return absl::InternalError(absl::StrCat(dir_, ": ", error.message()));
  struct stat info {};
  if (lstat(dir_.c_str(), &info) != 0) return ErrnoError(dir_);
  if (!S_ISDIR(info.st_mode) || info.st_uid != geteuid()) {
    // Ranks run as another user; a directory they could have made or replaced by a link could
    // hand the agent bytes of their choosing.
    return absl::FailedPreconditionError(absl::StrCat(
        dir_, ": must be a directory owned by the agent's user (uid ", geteuid(), "), not a link"));
  }
  if (chmod(dir_.c_str(), 0700) != 0) return ErrnoError("chmod " + dir_);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Fetch.

absl::StatusOr<std::string> CodeCache::Fetch(const std::string& digest,
                                             const std::string& checkpoint_address) {
  absl::StatusOr<Lease> lease = Acquire(digest, checkpoint_address);
  if (!lease.ok()) return lease.status();
  return lease->path();
}

absl::StatusOr<CodeCache::Lease> CodeCache::Acquire(const std::string& digest,
                                                    const std::string& checkpoint_address) {
  absl::StatusOr<std::string> hex = HexOf(digest);
  if (!hex.ok()) return hex.status();
  if (!setup_.ok()) return setup_;
  {
    // Held from here on, so that no other fetch evicts it between its download and our use.
    absl::MutexLock lock(&mu_);
    Entry& entry = entries_[*hex];
    ++entry.leases;
    entry.last_use = ++use_clock_;
  }
  Lease lease(this, *hex, ArchivePath(*hex));
  if (absl::Status fetched = FetchOnce(*hex, checkpoint_address); !fetched.ok()) return fetched;
  return lease;
}

absl::Status CodeCache::FetchOnce(const std::string& hex, const std::string& address) {
  std::shared_ptr<Flight> flight;
  bool leader = false;
  {
    absl::MutexLock lock(&mu_);
    if (entries_.at(hex).state == Entry::kVerified) return absl::OkStatus();
    auto [found, inserted] = flights_.try_emplace(hex);
    if (inserted) found->second = std::make_shared<Flight>();
    flight = found->second;
    leader = inserted;
  }
  if (!leader) {
    flight->done.WaitForNotification();
    return flight->status;
  }
  flight->status = VerifyOrDownload(hex, address);
  {
    absl::MutexLock lock(&mu_);
    flights_.erase(hex);
    EvictLocked();
  }
  flight->done.Notify();
  return flight->status;
}

absl::Status CodeCache::VerifyOrDownload(const std::string& hex, const std::string& address) {
  const std::string path = ArchivePath(hex);
  bool cached = false;
  {
    absl::MutexLock lock(&mu_);
    cached = entries_.at(hex).state == Entry::kUnverified;
  }
  if (cached) {
    // Step 3: left by an earlier agent, so not verified by this one.
    absl::StatusOr<std::string> sha = Sha256OfFile(path);
    absl::MutexLock lock(&mu_);
    Entry& entry = entries_.at(hex);
    if (sha.ok() && *sha == hex) {
      entry.state = Entry::kVerified;
      return absl::OkStatus();
    }
    std::cerr << "gradhub-agent: cached code " << path << " no longer has its sha256 ("
              << (sha.ok() ? *sha : sha.status().ToString()) << "); downloading it again\n";
    std::error_code ignored;  // a file that cannot go is overwritten by the download's rename
    std::filesystem::remove(path, ignored);
    entry.state = Entry::kAbsent;
    entry.size = 0;
    ++stats_.rejected;
  }
  return Download(hex, address);
}

absl::Status CodeCache::Download(const std::string& hex, const std::string& address) {
  PartialFile partial(ArchivePath(hex) + ".part", options_.max_bytes);
  if (absl::Status opened = partial.Open(); !opened.ok()) return opened;
  const grpc::Status streamed = StreamWithRetries(*v1::CodeService::NewStub(ChannelTo(address)),
                                                  options_, hex, address, &partial);
  absl::Status status = partial.error;
  if (status.ok() && !streamed.ok()) {
    status = absl::Status(
        static_cast<absl::StatusCode>(streamed.error_code()),
        absl::StrCat("downloading code/", hex, " from ", address, ": ", streamed.error_message()));
  }
  if (status.ok() && partial.sha.Hex() != hex) {
    status = absl::DataLossError(absl::StrCat("the ", partial.written, " bytes of code/", hex,
                                              " from ", address, " hash to ", partial.sha.Hex()));
  }
  if (status.ok()) status = partial.Close();
  if (status.ok()) status = Publish(partial.path, ArchivePath(hex));
  absl::MutexLock lock(&mu_);
  stats_.bytes_downloaded += partial.written;
  if (!status.ok()) {
    std::error_code ignored;
    std::filesystem::remove(partial.path, ignored);
    if (status.code() == absl::StatusCode::kDataLoss) ++stats_.rejected;
    return status;
  }
  Entry& entry = entries_.at(hex);
  entry.state = Entry::kVerified;
  entry.size = partial.written;
  ++stats_.downloads;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Files, channels, eviction.

std::shared_ptr<grpc::Channel> CodeCache::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& channel = channels_[address];
  if (channel == nullptr) {
    grpc::ChannelArguments args;
    // A download is one long stream: keepalive notices a server that went away mid-way.
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
    channel = grpc::CreateCustomChannel(
        address,
        options_.credentials != nullptr ? options_.credentials : grpc::InsecureChannelCredentials(),
        args);
  }
  return channel;
}

void CodeCache::EvictLocked() {
  int64_t total = 0;
  for (const auto& [hex, entry] : entries_) {
    if (entry.state != Entry::kAbsent) total += entry.size;
  }
  while (total > options_.max_bytes) {
    auto oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      const Entry& entry = it->second;
      if (entry.state == Entry::kAbsent || entry.leases > 0) continue;
      if (oldest == entries_.end() || entry.last_use < oldest->second.last_use) oldest = it;
    }
    if (oldest == entries_.end()) return;  // every archive is in use: over budget for now
    std::error_code error;
    std::filesystem::remove(ArchivePath(oldest->first), error);
    total -= oldest->second.size;
    ++stats_.evicted;
    entries_.erase(oldest);
  }
}

void CodeCache::Unlease(const std::string& hex) {
  absl::MutexLock lock(&mu_);
  auto found = entries_.find(hex);
  if (found == entries_.end()) return;
  if (--found->second.leases == 0 && found->second.state == Entry::kAbsent) entries_.erase(found);
}

CodeCacheStats CodeCache::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::string CodeCache::ArchivePath(const std::string& hex) const {
  return absl::StrCat(dir_, "/", hex, kArchiveSuffix);
}

}  // namespace gradhub::agent
