// bench_sealing: the cost of encryption at rest in the checkpoint store, in one run: the same
// blob through LocalBlobStore (plain) and through SealedBlobStore over it (AES-256-GCM, as
// gradhub-checkpoint stores every blob), in alternate rounds so that background load hits both
// alike. Each round:
//   upload:   Append in 4 MiB batches (what an upload stream's writer thread appends), then
//             Commit (fsync, rename, fsync of the directory);
//   download: Open at 0, Read in 1 MiB pieces to the end (what a download's read-ahead does).
// Output: one line per round and mode, then the medians in MB/s and sealed / plain, and the
// CPU seconds of each (this process's, all threads): on a shared machine the throughput moves
// with the load, the CPU cost much less.
//
// Usage: bench_sealing [--dir DIR] [--mib 256] [--rounds 3] [--direct true|false]
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "services/checkpoint/local_blob_store.h"
#include "services/checkpoint/sealed_blob_store.h"
#include "services/common/flags.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace ckpt = gradhub::checkpoint;
namespace fs = std::filesystem;

class OneTenant final : public ckpt::BlobScopes {
 public:
  absl::StatusOr<ckpt::BlobScope> OfUpload(const std::string&) override { return Scope(); }
  absl::StatusOr<ckpt::BlobScope> OfBlob(const std::string&) override { return Scope(); }

 private:
  static ckpt::BlobScope Scope() { return {ckpt::KeyScope::Tenant(1), "bench"}; }
};

struct Seconds {
  double upload = 0, download = 0;
  double upload_cpu = 0, download_cpu = 0;
};

// User and system CPU of this process.
double CpuSeconds() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

double Since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One upload and one download of `data` through `store`; exits on an error.
Seconds Round(ckpt::BlobStore& store, const std::string& data, int round) {
  const std::string upload = "bench-" + std::to_string(round);
  const std::string blob = "bench/" + std::to_string(round);
  constexpr size_t kBatch = 4 << 20;
  Seconds took;
  Clock::time_point start = Clock::now();
  double cpu = CpuSeconds();
  for (size_t at = 0; at < data.size(); at += kBatch) {
    const auto held =
        store.Append(upload, static_cast<int64_t>(at), std::string_view(data).substr(at, kBatch));
    if (!held.ok()) {
      std::cerr << "bench_sealing: append: " << held.status() << "\n";
      std::exit(1);
    }
  }
  if (absl::Status committed = store.Commit(upload, blob); !committed.ok()) {
    std::cerr << "bench_sealing: commit: " << committed << "\n";
    std::exit(1);
  }
  took.upload = Since(start);
  took.upload_cpu = CpuSeconds() - cpu;
  start = Clock::now();
  cpu = CpuSeconds();
  auto reader = store.Open(blob, 0);
  size_t read = 0;
  std::string piece;
  while (reader.ok()) {
    if (absl::Status status = (*reader)->Read(1 << 20, &piece); !status.ok()) {
      std::cerr << "bench_sealing: read: " << status << "\n";
      std::exit(1);
    }
    if (piece.empty()) break;
    read += piece.size();
  }
  took.download = Since(start);
  took.download_cpu = CpuSeconds() - cpu;
  if (!reader.ok() || read != data.size()) {
    std::cerr << "bench_sealing: read " << read << " of " << data.size() << " bytes\n";
    std::exit(1);
  }
  store.Delete(blob).IgnoreError();
  return took;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = fs::temp_directory_path().string();
  int64_t mib = 256, rounds = 3;
  bool direct = true;
  gradhub::Flags flags("bench_sealing",
                       "Upload and download MB/s of the blob store, plain and sealed");
  flags.String("dir", "", &dir, "Parent of the scratch data directory")
      .Int("mib", "", &mib, "Blob size in MiB")
      .Int("rounds", "", &rounds, "Rounds of each mode")
      .Bool("direct", "", &direct, "O_DIRECT, as gradhub-checkpoint writes");
  std::vector<std::string> args;
  if (auto exit = flags.ParseOrExitCode(argc, argv, &args)) return *exit;

  std::string data(static_cast<size_t>(mib) << 20, '\0');
  uint64_t x = 88172645463325252ull;  // not zeros: nothing compresses them
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(&data[i], &x, 8);
  }
  std::string work = (fs::path(dir) / "gradhub-bench-sealing-XXXXXX").string();
  if (mkdtemp(work.data()) == nullptr) return 1;
  auto local = ckpt::LocalBlobStore::Open(work + "/data", {.direct_io = direct});
  if (!local.ok()) return 1;
  ckpt::InMemoryDataKeys keys;
  OneTenant scopes;
  ckpt::SealedBlobStore sealed(local->get(), &keys, &scopes);

  std::vector<double> up[2], down[2], up_cpu[2], down_cpu[2];
  const double mb = static_cast<double>(data.size()) / 1e6;
  for (int round = 0; round < rounds; ++round) {
    for (int mode = 0; mode < 2; ++mode) {
      ckpt::BlobStore& store = mode == 0 ? static_cast<ckpt::BlobStore&>(**local) : sealed;
      const Seconds took = Round(store, data, round * 2 + mode);
      up[mode].push_back(mb / took.upload);
      down[mode].push_back(mb / took.download);
      up_cpu[mode].push_back(took.upload_cpu);
      down_cpu[mode].push_back(took.download_cpu);
      std::printf("round %d %-6s upload %8.1f MB/s  download %8.1f MB/s\n", round,
                  mode == 0 ? "plain" : "sealed", up[mode].back(), down[mode].back());
    }
  }
  std::printf("\n%lld MiB, %lld rounds, %s: medians\n", static_cast<long long>(mib),
              static_cast<long long>(rounds), direct ? "O_DIRECT" : "page cache");
  std::printf(
      "| | plain MB/s | sealed MB/s | sealed / plain | plain CPU s | sealed CPU s |\n"
      "|---|---|---|---|---|---|\n");
  std::printf("| upload (append + commit) | %.0f | %.0f | %.2f | %.3f | %.3f |\n", Median(up[0]),
              Median(up[1]), Median(up[1]) / Median(up[0]), Median(up_cpu[0]), Median(up_cpu[1]));
  std::printf("| download (open + read) | %.0f | %.0f | %.2f | %.3f | %.3f |\n", Median(down[0]),
              Median(down[1]), Median(down[1]) / Median(down[0]), Median(down_cpu[0]),
              Median(down_cpu[1]));
  fs::remove_all(work);
  return 0;
}
