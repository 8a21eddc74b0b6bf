// CodeCache: the code archives of script jobs (code.proto), downloaded once per node and kept
// by digest, so that every attempt of every rank placed here unpacks the same verified bytes
// without asking gradhub-checkpoint again.
//
// Files, all in one directory (<work-dir>/code, mode 0700, the agent's own: ranks never read
// it; they get an unpacked copy):
//   <hex>.tar       a whole archive whose sha256 is <hex>;
//   <hex>.tar.part  a download in progress, renamed to <hex>.tar only once verified.
//
// Fetch(digest, address), for "sha256:<hex>":
//   1. Cached and verified: the path, at once.
//   2. Another call is fetching the same digest: wait for it and share its result (one
//      download per digest, however many ranks start at once).
//   3. Cached from before the agent started: hash the file once; a mismatch (a disk or a hand
//      that changed it) removes it and goes on with 4.
//   4. Download with DownloadCode into <hex>.tar.part, hashing the bytes as they arrive. A
//      stream that breaks is asked again from the offset already written; failures the node's
//      clients retry (grpc_retry.h IsRetryable) wait through the shared backoff, up to
//      `fetch_timeout` after the fetch began. Then rename to <hex>.tar only when the sha256
//      matches the digest: DATA_LOSS otherwise, with nothing kept. No fsync: step 3 hashes
//      what a crash may have torn before it is used, so a flush would only slow every start.
//   5. Evict: while the archives add up to more than `max_bytes`, remove the least recently
//      used one that no Lease holds and no call is fetching.
//
// Thread-safe: any number of threads may Fetch or Acquire at once.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "services/common/backoff.h"
#include "services/common/grpc_retry.h"

namespace gradhub::agent {

struct CodeCacheOptions {
  // TLS to gradhub-checkpoint as the agent's other channels have it (--tls-ca); nullptr =
  // plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // The node token: nodes may download any archive, for the jobs placed on them.
  std::string token;
  // The archives kept, in bytes; the least recently used go beyond it (step 5).
  int64_t max_bytes = int64_t{4} << 30;
  // How long one Fetch may keep trying (step 4).
  absl::Duration fetch_timeout = absl::Minutes(5);
  BackoffPolicy backoff = kGrpcBackoff;
};

// What the cache has done, for logs and tests.
struct CodeCacheStats {
  int64_t downloads = 0;         // archives downloaded whole and verified
  int64_t bytes_downloaded = 0;  // every byte received, resumed streams included
  int64_t rejected = 0;          // downloads or cached files whose sha256 did not match
  int64_t evicted = 0;
};

class CodeCache {
 public:
  // Keeps `digest`'s archive from eviction while it lives, e.g. while a rank's copy is
  // unpacked from it. Movable.
  class Lease {
   public:
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    ~Lease();
    const std::string& path() const { return path_; }

   private:
    friend class CodeCache;
    Lease(CodeCache* cache, std::string hex, std::string path);
    void Release();
    CodeCache* cache_;
    std::string hex_;
    std::string path_;
  };

  // Creates `dir` (0700) and takes stock of what an earlier agent left there: archives are kept
  // (hashed again before their first use), partial downloads removed. A directory that cannot
  // be used is reported by status() and by every Fetch.
  CodeCache(std::string dir, CodeCacheOptions options);
  ~CodeCache();
  CodeCache(const CodeCache&) = delete;
  CodeCache& operator=(const CodeCache&) = delete;

  // The verified archive "<dir>/<hex>.tar" for `digest` ("sha256:<hex>"), fetched from the
  // gradhub-checkpoint at `checkpoint_address` (host:port) when it is not cached (steps 1-5
  // above). INVALID_ARGUMENT for a malformed digest, DATA_LOSS for bytes that do not match it,
  // the server's error (NOT_FOUND, ...) otherwise.
  absl::StatusOr<std::string> Fetch(const std::string& digest,
                                    const std::string& checkpoint_address);
  // Fetch, with the archive held until the Lease ends: use it where the file is read after the
  // call, so that another job's fetch cannot evict it in between.
  absl::StatusOr<Lease> Acquire(const std::string& digest, const std::string& checkpoint_address);

  // OK, or why the directory cannot be used.
  absl::Status status() const { return setup_; }
  CodeCacheStats stats() const;
  const std::string& dir() const { return dir_; }

 private:
  // An archive known to the cache: on disk, or being fetched (then held by a Lease).
  struct Entry {
    // kUnverified: left by an earlier agent, not hashed yet by this one (step 3).
    enum State { kAbsent, kUnverified, kVerified };
    State state = kAbsent;
    int64_t size = 0;
    uint64_t last_use = 0;  // a tick of use_clock_: larger = more recent
    int leases = 0;
  };
  struct Flight;  // one fetch of one digest, shared by the calls that wait for it

  absl::Status SetUpDirectory();
  // Steps 2-4 for an archive not verified yet: as the one fetching, or as one waiting.
  absl::Status FetchOnce(const std::string& hex, const std::string& address);
  absl::Status VerifyOrDownload(const std::string& hex, const std::string& address);
  // Step 4 into <hex>.tar.part; on success the entry is verified and in place.
  absl::Status Download(const std::string& hex, const std::string& address);
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);
  // Step 5. Removes files while holding mu_: eviction is rare and an unlink is fast.
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unlease(const std::string& hex);
  std::string ArchivePath(const std::string& hex) const;

  const std::string dir_;
  const CodeCacheOptions options_;
  absl::Status setup_;
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);  // by hex
  std::map<std::string, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
  uint64_t use_clock_ ABSL_GUARDED_BY(mu_) = 0;
  CodeCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradhub::agent
