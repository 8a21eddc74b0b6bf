// bench_checkpoint: one checkpoint through a running gradhub-checkpoint (see run.sh beside it),
// as a trainer moves it: one gRPC stream of chunks of the size the server announces, sent by
// the trainer's own code (gpu_worker/checkpoint_client/chunk_upload.h).
//
//   upload:   StartUpload, UploadChunks (each chunk with its crc32c, which the server checks
//             before writing), CommitCheckpoint (fsync, rename, transaction); timed from
//             StartUpload to the commit's answer. The client's crc32c of the blob is computed
//             before the clock starts (a trainer takes it on its save thread before it uploads:
//             that is the trainer's cost, which training_stall.sh measures, not the store's).
//             The client sends no sha256: the store hashes the bytes as they arrive and records
//             its own, as it does for a trainer; that hashing is inside the figure. After the
//             clock, the recorded sha256 is checked against the data's.
//   download: DownloadCheckpoint of the checkpoint uploaded before, from offset 0, checking what
//             arrives as `gradhub checkpoints download` and a trainer do (BlobCheck: against the
//             announced crc32c, or the sha256 where there is none); timed from the call to the
//             last byte verified.
//
// Output: one line, "<mode> <seconds> <bytes> <name>", for run.sh; an upload's line ends with
// the seconds of its CommitCheckpoint alone and the client's CPU seconds for the upload, a
// download's with the client's CPU seconds for the download.
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <utility>

#include "gpu_worker/checkpoint_client/chunk_upload.h"
#include "gradhub/v1/checkpoint.grpc.pb.h"
#include "services/common/abseil_mode.h"
#include "services/common/blob_check.h"
#include "services/common/crc32c.h"
#include "services/common/flags.h"
#include "services/common/grpc_receive_window.h"
#include "services/common/heap_mode.h"
#include "services/common/sha256.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace v1 = gradhub::v1;

struct Options {
  std::string server = "127.0.0.1:7071";
  std::string token;
  std::string mode = "upload";
  std::string job;   // jobs/<id>, for upload
  int64_t step = 1;  // for upload
  int64_t mib = 256;
  std::string name;   // for download
  std::string check;  // for download: "sha256" forces the sha256 check
};

std::unique_ptr<grpc::ClientContext> Context(const Options& options) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->AddMetadata("authorization", "Bearer " + options.token);
  return context;
}

// User and system CPU of this process (all its threads, gRPC's included).
double CpuSeconds() {
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

int Fail(const char* what, const grpc::Status& status) {
  std::cerr << "bench_checkpoint: " << what << ": " << status.error_code() << " "
            << status.error_message() << "\n";
  return 1;
}

int Upload(const std::shared_ptr<grpc::Channel>& channel, v1::CheckpointService::Stub& stub,
           const Options& options) {
  // Not zeros: a filesystem or a link that compressed zeros would flatter the figure.
  std::string data(static_cast<size_t>(options.mib) << 20, '\0');
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(&data[i], &x, 8);
  }
  const uint32_t crc32c = gradhub::Crc32c(data);
  const double cpu_start = CpuSeconds();
  const Clock::time_point start = Clock::now();
  v1::StartUploadRequest begin;
  begin.set_job(options.job);
  begin.set_attempt(1);
  begin.set_step(options.step);
  begin.set_size_bytes(static_cast<int64_t>(data.size()));
  v1::StartUploadResponse started;
  if (auto s = stub.StartUpload(Context(options).get(), begin, &started); !s.ok()) {
    return Fail("StartUpload", s);
  }
  // As the trainer sends (gpu_worker/checkpoint_client): the chunks framed around the bytes.
  auto context = Context(options);
  const gradhub::checkpoint_client::ChunkUploadResult sent =
      gradhub::checkpoint_client::UploadChunks(channel, context.get(), started.upload_id(), data, 0,
                                               started.chunk_size_bytes());
  if (!sent.status.ok()) return Fail("UploadChunks", sent.status);
  const Clock::time_point streamed = Clock::now();
  v1::CommitCheckpointRequest commit;
  commit.set_upload_id(started.upload_id());
  commit.set_crc32c(crc32c);
  v1::Checkpoint checkpoint;
  if (auto s = stub.CommitCheckpoint(Context(options).get(), commit, &checkpoint); !s.ok()) {
    return Fail("CommitCheckpoint", s);
  }
  const Clock::time_point end = Clock::now();
  if (checkpoint.sha256() != gradhub::Sha256Hex(data)) {
    std::fprintf(stderr, "bench_checkpoint: the store recorded sha256 %s, not the data's\n",
                 checkpoint.sha256().c_str());
    return 1;
  }
  std::printf("upload %.4f %zu %s %.4f %.4f\n", std::chrono::duration<double>(end - start).count(),
              data.size(), checkpoint.name().c_str(),
              std::chrono::duration<double>(end - streamed).count(), CpuSeconds() - cpu_start);
  return 0;
}

int Download(v1::CheckpointService::Stub& stub, const Options& options) {
  const double cpu_start = CpuSeconds();
  const Clock::time_point start = Clock::now();
  auto context = Context(options);
  v1::DownloadCheckpointRequest request;
  request.set_name(options.name);
  auto reader = stub.DownloadCheckpoint(context.get(), request);
  v1::DownloadCheckpointResponse message;
  std::optional<gradhub::BlobCheck> check;  // as the CLI: made from the first message
  size_t bytes = 0;
  while (reader->Read(&message)) {
    if (!check.has_value()) {
      const bool crc32c = message.has_crc32c() && options.check != "sha256";
      check.emplace(message.sha256(),
                    crc32c ? std::optional<uint32_t>(message.crc32c()) : std::nullopt);
    }
    bytes += message.data().size();
    check->Update(message.mutable_data());
  }
  if (auto s = reader->Finish(); !s.ok()) return Fail("DownloadCheckpoint", s);
  if (!check.has_value() || !check->Matches()) {
    std::cerr << "bench_checkpoint: the download does not match its "
              << (check.has_value() ? check->Expected() : "sha256") << "\n";
    return 1;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("download %.4f %zu %s %.4f\n", seconds, bytes, options.name.c_str(),
              CpuSeconds() - cpu_start);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gradhub::TurnOffMutexDeadlockDetection();
  gradhub::KeepFreedHeapForTheNextMessage(gradhub::kForMessages);
  Options options;
  gradhub::Flags flags("bench_checkpoint", "One checkpoint through gradhub-checkpoint.");
  flags.String("server", "", &options.server, "gradhub-checkpoint gRPC address")
      .String("token", "", &options.token, "Admin token")
      .String("mode", "", &options.mode, "upload or download")
      .String("job", "", &options.job, "upload: jobs/<id> (RUNNING at attempt 1)")
      .Int("step", "", &options.step, "upload: the checkpoint's step")
      .Int("mib", "", &options.mib, "upload: size in MiB")
      .String("name", "", &options.name, "download: jobs/<id>/checkpoints/<step>")
      .String("check", "", &options.check,
              "download: sha256 checks the sha256 even where a crc32c is announced (as clients "
              "did before the crc32c covered it)");
  auto parsed = flags.Parse(argc, argv);
  if (!parsed.ok() || parsed->help) {
    std::cerr << (parsed.ok() ? "" : std::string(parsed.status().message()) + "\n")
              << flags.Usage();
    return parsed.ok() ? 0 : 2;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(8 << 20);
  gradhub::BoundReceiveWindow(args);  // as trainers and the CLI download
  auto channel =
      grpc::CreateCustomChannel(options.server, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::CheckpointService::NewStub(channel);
  return options.mode == "upload" ? Upload(channel, *stub, options) : Download(*stub, options);
}
