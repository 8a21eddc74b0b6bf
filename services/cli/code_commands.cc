#include "services/cli/code_commands.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/common/code_archive/code_archive.h"
#include "services/common/grpc_retry.h"
#include "services/common/grpc_status.h"
#include "services/common/sha256.h"

namespace gradhub::cli {
namespace {

constexpr char kDigestPrefix[] = "sha256:";
// What code.proto allows in one UploadCode message.
constexpr size_t kUploadMessageBytes = size_t{4} << 20;

absl::Status FromGrpc(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

// What a push did, for the line on stderr and `code push`'s output.
struct Pushed {
  std::string digest;       // "sha256:<hex>" of the bytes packed here
  v1::CodeArchive archive;  // as the server keeps it
  code::ArchiveSummary summary;
  bool uploaded = false;  // false: the server had it already
  absl::Duration upload_time;
};

// Step 3: the archive the server already keeps for this tenant, or nullopt.
absl::StatusOr<std::optional<v1::CodeArchive>> Stored(Invocation& inv, const std::string& digest) {
  v1::GetCodeRequest request;
  request.set_name(digest);
  v1::CodeArchive archive;
  const grpc::Status status =
      inv.client().code().GetCode(inv.client().UnaryContext().get(), request, &archive);
  if (status.ok()) return archive;
  if (status.error_code() == grpc::StatusCode::NOT_FOUND) return std::nullopt;
  return FromGrpc(status);
}

// One UploadCode stream of `dir`, packed again as it is sent (no temporary copy). *local is
// set when packing failed, which no retry mends.
grpc::Status UploadOnce(Invocation& inv, const std::string& dir, const code::ArchiveLimits& limits,
                        const v1::UploadCodeHeader& header, v1::CodeArchive* archive,
                        absl::Status* local) {
  std::unique_ptr<grpc::ClientContext> context = inv.client().StreamContext();
  auto writer = inv.client().code().UploadCode(context.get(), archive);
  v1::UploadCodeRequest request;
  *request.mutable_header() = header;
  bool open = writer->Write(request);
  if (open) {
    const absl::StatusOr<code::ArchiveSummary> packed = code::PackDirectoryTo(
        dir,
        [&](std::string_view bytes) {
          request.set_data(bytes.data(), bytes.size());  // a 4 MiB piece: one message
          open = writer->Write(request);
          return open ? absl::OkStatus() : absl::UnavailableError("the upload stream broke");
        },
        limits);
    if (open && !packed.ok()) *local = packed.status();
    if (open && packed.ok() && packed->archive_bytes != header.size_bytes()) {
      *local = absl::AbortedError(absl::StrCat(dir, " changed while it was uploaded; push again"));
    }
    if (!local->ok()) context->TryCancel();
  }
  if (open && local->ok()) writer->WritesDone();
  return writer->Finish();
}

// Step 4: UploadOnce until it succeeds, fails for good, or kUploadRetryWindow has passed since
// the first failure.
absl::StatusOr<v1::CodeArchive> Upload(Invocation& inv, const std::string& dir,
                                       const code::ArchiveLimits& limits, const Pushed& pushed) {
  v1::UploadCodeHeader header;
  header.set_size_bytes(pushed.summary.archive_bytes);
  header.set_sha256(pushed.digest.substr(std::strlen(kDigestPrefix)));
  Backoff backoff(kGrpcBackoff);
  std::optional<Backoff::Clock::time_point> give_up;
  while (true) {
    v1::CodeArchive archive;
    absl::Status local;
    const grpc::Status status = UploadOnce(inv, dir, limits, header, &archive, &local);
    if (!local.ok()) return local;
    if (status.ok()) return archive;
    if (status.error_code() == grpc::StatusCode::DATA_LOSS) {  // other bytes than hashed
      return absl::AbortedError(absl::StrCat(dir, " changed while it was uploaded (",
                                             status.error_message(), "); push again"));
    }
    if (!IsTransient(status.error_code())) return FromGrpc(status);
    if (!give_up) give_up = Backoff::Clock::now() + absl::ToChronoNanoseconds(kUploadRetryWindow);
    const std::optional<std::chrono::nanoseconds> wait = backoff.NextBefore(*give_up);
    if (!wait) return FromGrpc(status);
    inv.err() << "gradhub: the upload failed (" << StatusCodeName(status.error_code()) << ": "
              << status.error_message() << "); sending it again\n";
    std::this_thread::sleep_for(*wait);
  }
}

// Steps 1-4 for directory `dir`: packed twice, never written to disk: once to hash it (is it
// stored already?), once more as it is sent, only when it is not.
absl::StatusOr<Pushed> Push(Invocation& inv, const std::string& dir, int64_t max_code_bytes) {
  code::ArchiveLimits limits;
  limits.max_archive_bytes = max_code_bytes;
  Pushed pushed;
  Sha256Stream sha;
  absl::StatusOr<code::ArchiveSummary> summary = code::PackDirectoryTo(
      dir,
      [&sha](std::string_view bytes) {
        sha.Update(bytes);
        return absl::OkStatus();
      },
      limits);
  if (!summary.ok() && !absl::StrContains(summary.status().message(), dir)) {
    // Its message names the entry relative to `dir`; say which directory that is.
    return absl::Status(summary.status().code(),
                        absl::StrCat(dir, ": ", summary.status().message()));
  }
  if (!summary.ok()) return summary.status();
  pushed.summary = *summary;
  pushed.digest = kDigestPrefix + sha.Hex();
  absl::StatusOr<std::optional<v1::CodeArchive>> stored = Stored(inv, pushed.digest);
  if (!stored.ok()) return stored.status();
  if (stored->has_value()) {
    pushed.archive = **stored;
    return pushed;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::CodeArchive> uploaded = Upload(inv, dir, limits, pushed);
  if (!uploaded.ok()) return uploaded.status();
  pushed.archive = *std::move(uploaded);
  pushed.uploaded = true;
  pushed.upload_time = absl::Now() - start;
  return pushed;
}

// Step 5.
void PrintPushed(Invocation& inv, const Pushed& pushed) {
  const int64_t bytes = pushed.summary.archive_bytes;
  std::string how = "already uploaded";
  if (pushed.uploaded) {
    const double seconds = std::max(absl::ToDoubleSeconds(pushed.upload_time), 1e-3);
    how = absl::StrFormat("uploaded in %.1f s, %s/s", seconds,
                          HumanBytes(static_cast<int64_t>(static_cast<double>(bytes) / seconds)));
  }
  inv.err() << "code: " << pushed.digest << " " << pushed.summary.entries << " entries, "
            << HumanBytes(bytes) << " (" << how << ")\n";
}

// A spec's `script.code` directory: relative to the spec file's folder, or to the working
// directory when the spec came from stdin.
std::string SpecRelativeDir(const std::string& spec_file, const std::string& dir) {
  const std::filesystem::path path(dir);
  if (path.is_absolute()) return dir;
  const bool from_stdin = spec_file == "-" || spec_file == "/dev/stdin";
  const std::filesystem::path base =
      from_stdin ? std::filesystem::current_path()
                 : std::filesystem::absolute(std::filesystem::path(spec_file)).parent_path();
  return (base / path).lexically_normal().string();
}

// `code get`'s argument as the server takes it: "sha256:<hex>" or "code/<hex>"; "" otherwise.
std::string CodeName(const std::string& arg) {
  if (IsCodeDigest(arg)) return arg;
  if (absl::StartsWith(arg, "code/") && IsCodeDigest(kDigestPrefix + arg.substr(5))) return arg;
  return "";
}

// `code get` as text: YAML, as the other get commands print.
std::string CodeArchiveSummary(const v1::CodeArchive& archive) {
  return absl::StrCat(
      "name: ", archive.name(), "\ndigest: ", archive.digest(),
      "\nsizeBytes: ", archive.size_bytes(), "  # ", HumanBytes(archive.size_bytes()),
      "\nunpackedBytes: ", archive.unpacked_bytes(), "  # ", HumanBytes(archive.unpacked_bytes()),
      "\nentries: ", archive.entries(), "\ncreateTime: ", FormatTime(archive.create_time()), "\n");
}

}  // namespace

bool IsCodeDigest(const std::string& text) {
  if (!absl::StartsWith(text, kDigestPrefix)) return false;
  const std::string hex = text.substr(sizeof(kDigestPrefix) - 1);
  return hex.size() == 64 && std::all_of(hex.begin(), hex.end(), [](char c) {
           return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f');
         });
}

void CodeFlags::Register(Invocation& inv, bool with_dir) {
  if (with_dir) {
    inv.flags().String("code", "", &dir,
                       "Pack and upload this directory as the script's code (script.code); it "
                       "wins over a script.code in the spec");
  }
  inv.flags().Int("max-code-bytes", "", &max_code_bytes,
                  "Largest code archive to upload (the server's own cap may be lower)");
}

int PushSpecCode(Invocation& inv, const CodeFlags& flags, const std::string& spec_file,
                 v1::JobSpec* spec) {
  const std::string& in_spec = spec->script().code();
  const bool spec_names_dir = spec->has_script() && !in_spec.empty() && !IsCodeDigest(in_spec);
  if (flags.dir.empty() && !spec_names_dir) return kOk;
  if (!spec->has_script()) {
    return inv.UsageError(
        "--code: the spec has no `script:` section; --code uploads the code "
        "of a script job");
  }
  std::string dir = flags.dir;
  if (!dir.empty() && !in_spec.empty()) {
    inv.err() << "gradhub: --code " << dir << " replaces the spec's script.code (" << in_spec
              << ")\n";
  }
  if (dir.empty()) dir = SpecRelativeDir(spec_file, in_spec);
  absl::StatusOr<Pushed> pushed = Push(inv, dir, flags.max_code_bytes);
  if (!pushed.ok()) return inv.Fail(ToGrpc(pushed.status()), inv.checkpoint_server());
  PrintPushed(inv, *pushed);
  spec->mutable_script()->set_code(pushed->digest);
  return kOk;
}

int CodePush(Invocation& inv) {
  CodeFlags flags;
  flags.Register(inv, /*with_dir=*/false);
  if (!inv.Parse(1, 1)) return inv.exit_code();
  absl::StatusOr<Pushed> pushed = Push(inv, inv.positional()[0], flags.max_code_bytes);
  if (!pushed.ok()) return inv.Fail(ToGrpc(pushed.status()), inv.checkpoint_server());
  PrintPushed(inv, *pushed);
  inv.out() << (inv.format() == Format::kJson ? ToJson(pushed->archive) : pushed->digest + "\n");
  return kOk;
}

int CodeGet(Invocation& inv) {
  if (!inv.Parse(1, 1)) return inv.exit_code();
  v1::GetCodeRequest request;
  request.set_name(CodeName(inv.positional()[0]));
  if (request.name().empty()) {
    return inv.UsageError("ARCHIVE must be sha256:<64 hex digits> or code/<64 hex digits>, not '" +
                          inv.positional()[0] + "'");
  }
  v1::CodeArchive archive;
  const grpc::Status status =
      inv.client().code().GetCode(inv.client().UnaryContext().get(), request, &archive);
  if (!status.ok()) return inv.Fail(status, inv.checkpoint_server());
  inv.out() << (inv.format() == Format::kJson ? ToJson(archive) : CodeArchiveSummary(archive));
  return kOk;
}

}  // namespace gradhub::cli
