#include "services/cli/checkpoint_commands.h"

#include <google/protobuf/struct.pb.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <regex>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "services/cli/commands.h"
#include "services/common/blob_check.h"
#include "services/common/grpc_retry.h"

namespace gradhub::cli {
namespace {

// What one download has written so far.
struct Progress {
  Progress(std::ofstream* out, bool verify) : file(out), verify_sha256(verify) {}
  std::ofstream* file;
  bool verify_sha256;  // DownloadCheckpointRequest.verify_sha256
  // Made from the first message: its crc32c where it has one, else its sha256 (hashed on a
  // thread of its own while the next chunks arrive).
  std::optional<BlobCheck> check;
  int64_t written = 0;
  std::string announced_sha256;
};

// One DownloadCheckpoint stream from progress->written; its final status.
grpc::Status StreamInto(Invocation& inv, const std::string& name, Progress* progress) {
  std::unique_ptr<grpc::ClientContext> context = inv.client().StreamContext();
  v1::DownloadCheckpointRequest request;
  request.set_name(name);
  request.set_offset(progress->written);
  request.set_verify_sha256(progress->verify_sha256);
  auto reader = inv.client().checkpoints().DownloadCheckpoint(context.get(), request);
  v1::DownloadCheckpointResponse message;
  while (reader->Read(&message)) {
    if (!progress->check.has_value()) {
      progress->announced_sha256 = message.sha256();
      progress->check.emplace(message.sha256(), message.has_crc32c()
                                                    ? std::optional<uint32_t>(message.crc32c())
                                                    : std::nullopt);
    }
    if (message.offset() != progress->written) {
      context->TryCancel();
      reader->Finish();
      return grpc::Status(grpc::StatusCode::INTERNAL,
                          absl::StrCat("the server sent offset ", message.offset(), " where ",
                                       progress->written, " was expected"));
    }
    progress->file->write(message.data().data(),
                          static_cast<std::streamsize>(message.data().size()));
    if (!*progress->file) {
      context->TryCancel();
      reader->Finish();
      return grpc::Status(grpc::StatusCode::INTERNAL, "cannot write the output file");
    }
    progress->written += static_cast<int64_t>(message.data().size());
    progress->check->Update(message.mutable_data());
  }
  return reader->Finish();
}

// A broken stream, worth one more try from where it stopped (services/common/grpc_retry.h).
bool Resumable(const grpc::Status& status) { return IsTransient(status.error_code()); }

void PrintDownloaded(Invocation& inv, const std::string& name, const std::string& file,
                     const Progress& progress) {
  if (inv.format() == Format::kJson) {
    google::protobuf::Struct result;
    auto& fields = *result.mutable_fields();
    fields["name"].set_string_value(name);
    fields["file"].set_string_value(file);
    fields["sizeBytes"].set_string_value(absl::StrCat(progress.written));
    fields["sha256"].set_string_value(progress.announced_sha256);
    fields["verified"].set_string_value(progress.check->Expected());
    inv.out() << ToJson(result);
  } else {
    inv.out() << file << "\n";
    inv.err() << "downloaded " << name << ": " << HumanBytes(progress.written) << ", "
              << progress.check->Expected() << " verified (sha256 " << progress.announced_sha256
              << ")\n";
  }
}

}  // namespace

std::string CheckpointName(const std::string& arg) {
  static const std::regex kName("jobs/[^/]+/checkpoints/[0-9]+");
  return std::regex_match(arg, kName) ? arg : "";
}

int CheckpointsList(Invocation& inv) {
  std::string state, page_token;
  int64_t page_size = 0;
  bool all = false;
  inv.flags()
      .String("state", "", &state, "Only checkpoints in this state (UPLOADING, COMMITTED, BAD)")
      .Int("page-size", "", &page_size, "Checkpoints per call; 0 = the server's default (50)")
      .Bool("all", "", &all, "Every page, not only the first")
      .String("page-token", "", &page_token, "Continue after the page that returned this token");
  if (!inv.Parse(1, 1)) return inv.exit_code();
  const std::string job = JobName(inv.positional()[0]);
  if (job.empty()) return inv.UsageError("JOB must be jobs/<id> or <id>");
  if (page_size < 0 || page_size > std::numeric_limits<int32_t>::max()) {
    return inv.UsageError("--page-size: must be between 0 and 2^31-1");
  }
  absl::StatusOr<std::string> filter = BuildFilter({{"state", absl::AsciiStrToUpper(state)}}, {});
  if (!filter.ok()) return inv.UsageError(std::string(filter.status().message()));
  v1::ListCheckpointsRequest request;
  request.set_parent(job);
  request.set_page_size(static_cast<int32_t>(page_size));
  request.set_page_token(page_token);
  request.set_filter(*filter);
  v1::ListCheckpointsResponse listed;
  while (true) {
    v1::ListCheckpointsResponse page;
    const grpc::Status status = inv.client().checkpoints().ListCheckpoints(
        inv.client().UnaryContext().get(), request, &page);
    if (!status.ok()) return inv.Fail(status, inv.checkpoint_server());
    for (v1::Checkpoint& c : *page.mutable_checkpoints()) *listed.add_checkpoints() = std::move(c);
    listed.set_next_page_token(page.next_page_token());
    if (!all || page.next_page_token().empty() || page.next_page_token() == request.page_token())
      break;
    request.set_page_token(page.next_page_token());
  }
  if (inv.format() == Format::kJson) {
    inv.out() << ToJson(listed);
    return kOk;
  }
  std::vector<const v1::Checkpoint*> rows;
  for (const v1::Checkpoint& c : listed.checkpoints()) rows.push_back(&c);
  inv.out() << CheckpointsTable(rows);
  if (!listed.next_page_token().empty()) {
    inv.err() << "(more results: add --all, or --page-token " << listed.next_page_token() << ")\n";
  }
  return kOk;
}

int CheckpointsDownload(Invocation& inv) {
  std::string file;
  inv.ShortFlag("-o", "--file");
  inv.flags().String("file", "", &file, "-o: where to write the checkpoint (required)");
  if (!inv.Parse(1, 1)) return inv.exit_code();
  const std::string name = CheckpointName(inv.positional()[0]);
  if (name.empty()) return inv.UsageError("NAME must be jobs/<id>/checkpoints/<step>");
  if (file.empty()) return inv.UsageError("download needs -o FILE");
  const std::string partial = file + ".tmp";
  grpc::Status status;
  for (const bool verify_sha256 : {false, true}) {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    if (!out) return inv.Fail(kInternal, "INTERNAL", "cannot create " + partial);
    Progress progress(&out, verify_sha256);
    // 1. and 2.: one stream, and one more from where it broke.
    status = StreamInto(inv, name, &progress);
    if (Resumable(status)) {
      inv.err() << "gradhub: the download broke at byte " << progress.written << " ("
                << status.error_message() << "); resuming\n";
      status = StreamInto(inv, name, &progress);
    }
    out.close();
    if (!status.ok()) break;
    // 3. The bytes as written against the crc32c (else the sha256) the server announced.
    if (progress.check.has_value() && !progress.announced_sha256.empty() &&
        progress.check->Matches()) {
      // 4.
      std::error_code error;
      std::filesystem::rename(partial, file, error);
      if (!error) {
        PrintDownloaded(inv, name, file, progress);
        return kOk;
      }
      status = grpc::Status(grpc::StatusCode::INTERNAL, "rename: " + error.message());
      break;
    }
    status = grpc::Status(
        grpc::StatusCode::DATA_LOSS,
        absl::StrCat("the ", progress.written, " bytes received do not match the announced ",
                     progress.check.has_value() ? progress.check->Expected() : "sha256"));
    if (!verify_sha256) {
      inv.err() << "gradhub: " << status.error_message()
                << "; downloading again, the server checking the sha256 too\n";
    }
  }
  std::remove(partial.c_str());
  return inv.Fail(status, inv.checkpoint_server());
}

}  // namespace gradhub::cli
