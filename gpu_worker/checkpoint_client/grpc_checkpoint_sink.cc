#include "gpu_worker/checkpoint_client/grpc_checkpoint_sink.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <vector>

#include "gpu_worker/checkpoint_client/chunk_upload.h"
#include "gradhub/v1/checkpoint.grpc.pb.h"
#include "services/common/blob_check.h"
#include "services/common/crc32c.h"
#include "services/common/direct_write.h"
#include "services/common/grpc_credentials.h"
#include "services/common/grpc_receive_window.h"
#include "services/common/grpc_retry.h"

namespace gradhub::checkpoint_client {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Cached blobs kept per job: the newest is what a restart on this node reads.
constexpr size_t kCachedBlobs = 2;

// The waits between the tries of a save or a load: kGrpcBackoff capped at 1 s instead of 5 s.
// While an upload waits, the training loop skips every checkpoint that comes due; a try
// against a store that is still down costs one refused connection (or, cut off, a call that
// fails once the channel gives up connecting), so trying every second is cheap, and the upload
// goes on within about a second of the store coming back instead of up to 5 s later.
constexpr BackoffPolicy kStoreBackoff{.initial = std::chrono::milliseconds(100),
                                      .max = std::chrono::seconds(1),
                                      .multiplier = 2.0,
                                      .jitter = 0.2};

// The channel's own reconnect backoff follows kStoreBackoff. By default gRPC waits 1 s after a
// failed connection attempt, then 1.6 times longer after each further one (up to 120 s), and
// while it waits every call fails at once without trying. The connect timeout stays gRPC's
// (20 s): a connection over a slow link or with TLS must not be cut short, and a SYN lost to
// an outage is sent again by TCP itself. See WaitBeforeRetry for the other half.
grpc::ChannelArguments StoreChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  const auto ms = [](std::chrono::nanoseconds d) {
    return static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
  };
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, ms(kStoreBackoff.initial));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ms(kStoreBackoff.max));
  return args;
}

// A failure the caller should not retry through; carries the gRPC status.
class CallFailed : public std::runtime_error {
 public:
  CallFailed(const std::string& what, const grpc::Status& status)
      : std::runtime_error(what + ": " + status.error_message() + " (code " +
                           std::to_string(status.error_code()) + ")"),
        code(status.error_code()) {}
  grpc::StatusCode code;
};

// Where a download's bytes go as they arrive: with a cache, a file beside the blob's cached
// name, renamed to it once the bytes are whole and checked, and mapped (a checkpoint too large
// for the rank's memory twice must not be read into it); without one, memory. A file that
// cannot be written falls back to memory (the cache is an optimisation).
class DownloadSpool {
 public:
  // `path`: the blob's cached name, or "" for memory. `size`: the bytes expected.
  DownloadSpool(std::string path, size_t size, std::ostream& log)
      : path_(std::move(path)), temp_(path_.empty() ? "" : path_ + ".download") {
    if (!temp_.empty()) {
      std::error_code error;
      fs::create_directories(fs::path(temp_).parent_path(), error);
      absl::StatusOr<OpenedForWrite> opened = OpenForWrite(temp_, O_CREAT | O_TRUNC, 0600, true);
      if (opened.ok()) {
        file_ = *opened;
      } else {
        log << "gradhub-trainer: checkpoint cache: " << opened.status().message()
            << "; downloading into memory\n";
      }
    }
    if (file_.fd < 0) memory_.reserve(size);
  }
  ~DownloadSpool() {
    if (file_.fd >= 0) close(file_.fd);
    std::error_code error;
    if (!temp_.empty()) fs::remove(temp_, error);  // a download that did not finish
  }
  DownloadSpool(const DownloadSpool&) = delete;
  DownloadSpool& operator=(const DownloadSpool&) = delete;

  void Append(std::string_view data) {
    if (file_.fd < 0) {
      memory_.append(data);
    } else if (absl::Status written = gradhub::Append(file_, data, held_, temp_); !written.ok()) {
      throw std::runtime_error("checkpoint cache: " + std::string(written.message()));
    }
    held_ += static_cast<int64_t>(data.size());
  }
  size_t size() const { return static_cast<size_t>(held_); }

  // The bytes, once checked: the file becomes the cached blob.
  trainer::CheckpointBytes Finish() {
    if (file_.fd < 0) return trainer::CheckpointBytes(std::move(memory_));
    close(file_.fd);
    file_.fd = -1;
    std::error_code error;
    fs::rename(temp_, path_, error);
    if (error)
      throw std::runtime_error("checkpoint cache: rename " + temp_ + ": " + error.message());
    return trainer::CheckpointBytes::MapFile(path_);
  }

 private:
  const std::string path_, temp_;
  OpenedForWrite file_;
  std::string memory_;
  int64_t held_ = 0;
};

class GrpcCheckpointSink final : public trainer::CheckpointSink {
 public:
  GrpcCheckpointSink(GrpcCheckpointSinkOptions options,
                     std::shared_ptr<grpc::ChannelCredentials> credentials)
      : options_(std::move(options)), log_(options_.log ? *options_.log : std::cerr) {
    grpc::ChannelArguments read_arguments = StoreChannelArguments();
    BoundReceiveWindow(read_arguments);
    writes_ = StoreConnection(options_.address, credentials, StoreChannelArguments());
    reads_ = StoreConnection(options_.address, std::move(credentials), read_arguments);
  }

  void Save(const trainer::Checkpoint& checkpoint) override {
    const uint32_t crc32c = Crc32c(checkpoint.bytes.view());
    const auto deadline = Clock::now() + options_.deadline;
    std::string sha256;  // the store's, from the commit's answer
    Retrying(writes_, "save step " + std::to_string(checkpoint.step), deadline,
             [&](int try_number) { sha256 = SaveOnce(checkpoint, crc32c, try_number); });
    if (!sha256.empty()) Cache(sha256, checkpoint.bytes.view());
  }

  std::optional<trainer::Checkpoint> LoadLatest() override {
    const auto deadline = Clock::now() + options_.deadline;
    std::optional<trainer::Checkpoint> loaded;
    Retrying(reads_, "load the latest checkpoint", deadline, [&](int) { loaded = LoadOnce(); });
    return loaded;
  }

 private:
  // One channel to the store and its stub.
  struct Connection {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::CheckpointService::Stub> stub;
  };
  static Connection StoreConnection(const std::string& address,
                                    std::shared_ptr<grpc::ChannelCredentials> credentials,
                                    const grpc::ChannelArguments& arguments) {
    Connection connection;
    connection.channel = grpc::CreateCustomChannel(address, std::move(credentials), arguments);
    connection.stub = v1::CheckpointService::NewStub(connection.channel);
    return connection;
  }

  // Calls `attempt` until it returns, backing off (grpc_retry.h) after retryable failures; a
  // DATA_LOSS or NOT_FOUND thrown by `attempt` is retried too (the steps above start over).
  // `used` is the connection the attempt calls through, watched between tries.
  template <typename Fn>
  void Retrying(const Connection& used, const std::string& what, Clock::time_point deadline,
                Fn&& attempt) {
    Backoff backoff(kStoreBackoff);
    const auto start = Clock::now();
    for (int try_number = 0;; ++try_number) {
      std::optional<std::chrono::nanoseconds> wait;
      try {
        attempt(try_number);
        if (try_number > 0) {
          log_
              << "gradhub-trainer: checkpoint store: " << what << ": done at try " << try_number + 1
              << ", "
              << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count()
              << " ms after the first\n";
        }
        return;
      } catch (const CallFailed& failure) {
        const bool again = IsRetryable(failure.code) ||
                           failure.code == grpc::StatusCode::DATA_LOSS ||
                           failure.code == grpc::StatusCode::NOT_FOUND;
        if (again) wait = backoff.NextBefore(deadline);
        if (!wait) {
          throw std::runtime_error("checkpoint store " + options_.address + ": " + what +
                                   " failed: " + failure.what());
        }
        log_ << "gradhub-trainer: checkpoint store: " << what << ": " << failure.what()
             << "; retrying in "
             << std::chrono::duration_cast<std::chrono::milliseconds>(*wait).count() << " ms\n";
      }
      WaitBeforeRetry(*used.channel, *wait);
    }
  }

  // The wait between two tries. While the channel is not connected it is spent watching the
  // channel, and ends as soon as it connects: gRPC learns how a connection attempt went only
  // while something polls the channel, and between two synchronous calls nothing does but its
  // backup poller, every 5 s. With sleeps, a store restarted after 3 s (SIGKILLed, a server
  // on the same port again) was reached 7.2 s after it was back, with gRPC's reconnect backoff
  // or kStoreBackoff alike; watching, 2.0 s with gRPC's backoff and 0.5-0.8 s with
  // kStoreBackoff (a client of this shape, 2 runs each). Through gradhub-checkpoint the
  // upload went on about 8 s after the store was back with sleeps (checkpoint_outage_e2e_test).
  // A connected channel (the store answered: busy, DATA_LOSS) is not watched: that would not
  // wait at all.
  static void WaitBeforeRetry(grpc::Channel& channel, std::chrono::nanoseconds wait) {
    if (channel.GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) {
      std::this_thread::sleep_for(wait);
      return;
    }
    channel.WaitForConnected(std::chrono::system_clock::now() + wait);
  }

  std::unique_ptr<grpc::ClientContext> Context() const {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + options_.rpc_timeout);
    if (!options_.token.empty()) context->AddMetadata("authorization", "Bearer " + options_.token);
    return context;
  }

  // Steps 1-3 of Save; returns the committed checkpoint's sha256. ALREADY_EXISTS at the start
  // means this step is committed already (an earlier try's commit went through but its answer
  // was lost): then "", and the bytes are not cached.
  std::string SaveOnce(const trainer::Checkpoint& checkpoint, uint32_t crc32c, int try_number) {
    char crc_hex[9];
    std::snprintf(crc_hex, sizeof crc_hex, "%08x", crc32c);
    v1::StartUploadRequest start;
    start.set_job(options_.job);
    start.set_attempt(options_.attempt);
    start.set_step(checkpoint.step);
    start.set_size_bytes(static_cast<int64_t>(checkpoint.bytes.size()));
    (*start.mutable_metadata())["format"] = "torch-archive";
    // Same id on every retry of one save; a new one after DATA_LOSS, which discards the upload.
    start.set_request_id("a" + std::to_string(options_.attempt) + "-s" +
                         std::to_string(checkpoint.step) + "-" + crc_hex + "-" +
                         std::to_string(checkpoint.bytes.size()) + "-" + std::to_string(restarts_));
    v1::StartUploadResponse started;
    grpc::Status status = writes_.stub->StartUpload(Context().get(), start, &started);
    if (status.error_code() == grpc::StatusCode::ALREADY_EXISTS) return "";
    if (!status.ok()) throw CallFailed("StartUpload", status);
    const int64_t held = try_number == 0 ? 0 : HeldBytes(started.upload_id());
    if (held > 0) {
      log_ << "gradhub-trainer: checkpoint store: save step " << checkpoint.step
           << ": resuming the upload at byte " << held << " of " << checkpoint.bytes.size() << "\n";
    }
    SendFrom(started.upload_id(), checkpoint.bytes.view(), held,
             std::max<int64_t>(started.chunk_size_bytes(), 64 << 10));
    v1::CommitCheckpointRequest commit;
    commit.set_upload_id(started.upload_id());
    commit.set_crc32c(crc32c);  // no sha256: the store's own is recorded
    v1::Checkpoint committed;
    status = writes_.stub->CommitCheckpoint(Context().get(), commit, &committed);
    if (status.error_code() == grpc::StatusCode::DATA_LOSS) ++restarts_;
    if (!status.ok()) throw CallFailed("CommitCheckpoint", status);
    return committed.sha256();
  }

  int64_t HeldBytes(const std::string& upload_id) {
    auto context = Context();
    const ChunkUploadResult probe = ProbeUpload(writes_.channel, context.get(), upload_id);
    if (!probe.status.ok()) throw CallFailed("UploadChunks (probe)", probe.status);
    return probe.received_bytes;
  }

  void SendFrom(const std::string& upload_id, std::string_view bytes, int64_t offset,
                int64_t chunk) {
    auto context = Context();
    const ChunkUploadResult sent =
        UploadChunks(writes_.channel, context.get(), upload_id, bytes, offset, chunk);
    if (!sent.status.ok()) throw CallFailed("UploadChunks", sent.status);
    const int64_t size = static_cast<int64_t>(bytes.size());
    if (sent.received_bytes != size) {
      throw CallFailed("UploadChunks",
                       grpc::Status(grpc::StatusCode::ABORTED,
                                    "server holds " + std::to_string(sent.received_bytes) + " of " +
                                        std::to_string(size) + " bytes"));
    }
  }

  std::optional<trainer::Checkpoint> LoadOnce() {
    v1::GetLatestCheckpointRequest request;
    request.set_job(options_.job);
    v1::Checkpoint latest;
    grpc::Status status = reads_.stub->GetLatestCheckpoint(Context().get(), request, &latest);
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) return std::nullopt;
    if (!status.ok()) throw CallFailed("GetLatestCheckpoint", status);
    if (std::optional<trainer::CheckpointBytes> cached = FromCache(latest)) {
      log_ << "gradhub-trainer: checkpoint " << latest.name() << " read from the local cache\n";
      return trainer::Checkpoint{latest.step(), *std::move(cached)};
    }
    return trainer::Checkpoint{latest.step(), Download(latest)};
  }

  // Resumes a broken stream at the bytes already received; the whole blob is checked as the
  // chunks arrive (BlobCheck: its crc32c where the checkpoint has one, else its sha256 on a
  // thread of its own), and the result at the end (the server checks the crc32c it recorded,
  // and says DATA_LOSS first if the blob differs from it). With a cache the bytes go to its
  // file as they arrive (DownloadSpool), which is then the cached copy.
  trainer::CheckpointBytes Download(const v1::Checkpoint& checkpoint) {
    const size_t size = static_cast<size_t>(checkpoint.size_bytes());
    DownloadSpool spool(CachePath(checkpoint.sha256()), size, log_);
    BlobCheck check(checkpoint.sha256(), Crc32cOf(checkpoint));
    for (int broken = 0;; ++broken) {
      v1::DownloadCheckpointRequest request;
      request.set_name(checkpoint.name());
      request.set_offset(static_cast<int64_t>(spool.size()));
      request.set_verify_sha256(verify_sha256_);
      auto context = Context();
      auto stream = reads_.stub->DownloadCheckpoint(context.get(), request);
      v1::DownloadCheckpointResponse chunk;
      while (stream->Read(&chunk)) {
        if (chunk.offset() != static_cast<int64_t>(spool.size())) {
          throw std::runtime_error("checkpoint store sent offset " +
                                   std::to_string(chunk.offset()) + ", expected " +
                                   std::to_string(spool.size()));
        }
        if (chunk.data().size() > size - spool.size()) {
          throw std::runtime_error("checkpoint store sent more than the " + std::to_string(size) +
                                   " bytes of " + checkpoint.name());
        }
        spool.Append(chunk.data());
        check.Update(chunk.mutable_data());
      }
      grpc::Status status = stream->Finish();
      if (status.ok()) break;
      if (!IsRetryable(status) || broken >= 3) throw CallFailed("DownloadCheckpoint", status);
      log_ << "gradhub-trainer: download of " << checkpoint.name() << " broke at " << spool.size()
           << " bytes: " << status.error_message() << "; resuming\n";
    }
    if (!check.Matches()) {
      // The server checked the crc32c it recorded; the next try asks it to hash the bytes too,
      // and to mark the checkpoint BAD if they are the ones that differ (step 3).
      verify_sha256_ = true;
      throw CallFailed("DownloadCheckpoint",
                       grpc::Status(grpc::StatusCode::DATA_LOSS,
                                    checkpoint.name() + " does not match its " + check.Expected()));
    }
    trainer::CheckpointBytes bytes = spool.Finish();
    PruneCache();
    return bytes;
  }

  // The cached blob of `sha256`; "" without a cache (or a hash).
  std::string CachePath(const std::string& sha256) const {
    if (options_.cache_dir.empty() || sha256.empty()) return "";
    return (fs::path(options_.cache_dir) / (sha256 + ".ckpt")).string();
  }

  static std::optional<uint32_t> Crc32cOf(const v1::Checkpoint& checkpoint) {
    return checkpoint.has_crc32c() ? std::optional<uint32_t>(checkpoint.crc32c()) : std::nullopt;
  }

  // The cached copy of `checkpoint`, checked as a download is. Mapped, not read: a pipeline's
  // checkpoint need not fit in the rank's memory (sinks.h).
  std::optional<trainer::CheckpointBytes> FromCache(const v1::Checkpoint& checkpoint) const {
    const std::string path = CachePath(checkpoint.sha256());
    if (path.empty() || !fs::exists(path)) return std::nullopt;
    try {
      trainer::CheckpointBytes bytes = trainer::CheckpointBytes::MapFile(path);
      if (BlobMatches(bytes.view(), checkpoint.sha256(), Crc32cOf(checkpoint))) return bytes;
    } catch (const std::runtime_error& error) {
      log_ << "gradhub-trainer: checkpoint cache: " << error.what() << "\n";
    }
    return std::nullopt;
  }

  // Best effort: the store is the source of truth, the cache only saves a download.
  void Cache(const std::string& sha256, std::string_view bytes) const {
    const std::string path = CachePath(sha256);
    if (path.empty()) return;
    std::error_code error;
    fs::create_directories(options_.cache_dir, error);
    const fs::path temp = path + ".tmp";
    // Around the page cache (direct_write.h): a buffered copy of every checkpoint took CPU from
    // the training loop (stall per 160 MiB checkpoint 0.39 s with it, 0.25 s without; same
    // machine, tests/bench/checkpoint/training_stall.sh) and evicted the node's page cache.
    absl::StatusOr<OpenedForWrite> opened = OpenForWrite(temp, O_CREAT | O_TRUNC, 0600, true);
    if (!opened.ok()) return;
    const absl::Status written = Append(*opened, bytes, 0, temp.string());
    close(opened->fd);
    if (!written.ok()) {  // a cache: the store has the checkpoint, only a faster restart is lost
      log_ << "gradhub-trainer: checkpoint cache: " << written.message() << "\n";
      fs::remove(temp, error);
      return;
    }
    fs::rename(temp, path, error);
    PruneCache();
  }

  // Keeps the newest kCachedBlobs.
  void PruneCache() const {
    if (options_.cache_dir.empty()) return;
    std::error_code error;
    std::vector<fs::directory_entry> cached;
    for (const auto& entry : fs::directory_iterator(options_.cache_dir, error)) {
      if (entry.path().extension() == ".ckpt") cached.push_back(entry);
    }
    std::sort(cached.begin(), cached.end(), [](const auto& a, const auto& b) {
      return a.last_write_time() > b.last_write_time();
    });
    for (size_t i = kCachedBlobs; i < cached.size(); ++i) fs::remove(cached[i].path(), error);
  }

  const GrpcCheckpointSinkOptions options_;
  std::ostream& log_;
  // Saves (StartUpload, the chunks, CommitCheckpoint) through gRPC's BDP-tuned window.
  Connection writes_;
  // Loads (GetLatestCheckpoint, DownloadCheckpoint) through a bounded receive window
  // (grpc_receive_window.h). Saves stay on their own channel: with the window bounded on the
  // one channel both used, checkpoint_outage_e2e_test failed in both runs whose result was read
  // (a committed checkpoint it listed was gone when it downloaded it) and passed in 2 of 2
  // without; why was not found.
  Connection reads_;
  int restarts_ = 0;  // DATA_LOSS restarts, part of the request id
  // Set once a download did not match its sha256: later downloads ask the server to check it.
  bool verify_sha256_ = false;
};

}  // namespace

std::shared_ptr<trainer::CheckpointSink> MakeGrpcCheckpointSink(GrpcCheckpointSinkOptions options) {
  auto credentials = ClientCredentials(options.tls_ca_file);
  if (!credentials.ok()) throw std::runtime_error(std::string(credentials.status().message()));
  return std::make_shared<GrpcCheckpointSink>(std::move(options), *std::move(credentials));
}

}  // namespace gradhub::checkpoint_client
