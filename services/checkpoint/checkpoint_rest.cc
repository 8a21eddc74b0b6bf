#include "services/checkpoint/checkpoint_rest.h"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "services/checkpoint/checkpoint_records.h"
#include "services/checkpoint/checkpoint_service.h"
#include "services/common/http_errors.h"
#include "services/common/status_macros.h"

namespace gradhub::checkpoint {
namespace {

constexpr char kShaHeader[] = "X-Checkpoint-Sha256";
constexpr char kCrc32cHeader[] = "X-Checkpoint-Crc32c";  // 8 lowercase hex digits
constexpr char kMetadataHeader[] = "X-Checkpoint-Metadata";
// Where LimitBodies sends a request whose body is over the limit: its handlers drop the body.
constexpr char kRefusedBodyPath[] = "/.gradhub/refused-body";

// The error answer gradhub-api gives too (services/common/http_errors.h).
void SendError(httplib::Response& response, const absl::Status& status) {
  response.status = HttpStatusFor(status.code());
  response.set_content(HttpErrorJson(status) + "\n", "application/json");
}

// The same with an HTTP status of its own (411, 413, 416), which says it in the body too.
void SendError(httplib::Response& response, const absl::Status& status, int http_status) {
  response.status = http_status;
  response.set_content(HttpErrorJson(status, http_status) + "\n", "application/json");
}

// Reads the rest of a body and drops it, so that the connection stays in step with a client
// that sends the whole body before it reads the answer.
void Drain(const httplib::ContentReader& body) {
  body([](const char*, size_t) { return true; });
}

// Whether a request carries a body of more than `limit` bytes, or one of unknown size.
bool BodyOver(const httplib::Request& request, size_t limit) {
  if (request.get_header_value("Transfer-Encoding") == "chunked") return true;
  uint64_t length = 0;
  return request.has_header("Content-Length") &&
         (!absl::SimpleAtoi(request.get_header_value("Content-Length"), &length) || length > limit);
}

template <typename T>
void Send(httplib::Response& response, const absl::StatusOr<T>& result) {
  if (!result.ok()) return SendError(response, result.status());
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(*result, &json, {});
  response.status = 200;
  response.set_content(json + "\n", "application/json");
}

std::string JobName(const httplib::Request& request) { return "jobs/" + request.matches[1].str(); }

std::string CheckpointNameOf(const httplib::Request& request) {
  return absl::StrCat("jobs/", request.matches[1].str(), "/checkpoints/", request.matches[2].str());
}

// The offset a `Range` header asks for: 0 without one, N for `bytes=N-`; nullopt for any other
// form (several ranges, a closed range, a suffix), which this server does not serve.
std::optional<int64_t> RangeOffset(const httplib::Request& request) {
  if (!request.has_header("Range")) return 0;
  const absl::StatusOr<int64_t> offset = OpenRangeOffset(request.get_header_value("Range"));
  return offset.ok() ? std::optional<int64_t>(*offset) : std::nullopt;
}

// `X-Checkpoint-Metadata: key=value,key=value` into *metadata.
absl::Status ParseMetadata(const std::string& header,
                           google::protobuf::Map<std::string, std::string>* metadata) {
  if (header.empty()) return absl::OkStatus();
  for (absl::string_view entry : absl::StrSplit(header, ',')) {
    const std::vector<std::string> pair = absl::StrSplit(entry, absl::MaxSplits('=', 1));
    if (pair.size() != 2 || pair[0].empty() || pair[1].find('=') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          kMetadataHeader, ": '", entry, "' is not key=value (entries separated by commas)"));
    }
    (*metadata)[pair[0]] = pair[1];
  }
  return absl::OkStatus();
}

// 411 for an upload without a Content-Length, 413 for one over `max_bytes`, with *why; 0 when
// its size may be taken.
int RefusedLength(const httplib::Request& request, int64_t max_bytes, absl::Status* why) {
  uint64_t length = 0;
  if (!request.has_header("Content-Length") ||
      !absl::SimpleAtoi(request.get_header_value("Content-Length"), &length)) {
    *why = absl::InvalidArgumentError("Content-Length: required (the body's exact size)");
    return 411;
  }
  if (length > static_cast<uint64_t>(max_bytes)) {
    *why =
        absl::ResourceExhaustedError(absl::StrCat("Content-Length: ", length, " bytes is over the ",
                                                  max_bytes, " bytes a checkpoint may have"));
    return 413;
  }
  return 0;
}

// What an upload's URL and headers say: StartUpload's request and the client's check of the
// body to commit (its sha256, its CRC-32C, or both).
struct UploadRequest {
  v1::StartUploadRequest start;
  std::string sha256;
  std::optional<uint32_t> crc32c;
};

// A checkpoint's digests in the headers that name them (a download's, a refused upload's).
void SetDigestHeaders(const v1::Checkpoint& checkpoint, httplib::Response& response) {
  response.set_header(kShaHeader, checkpoint.sha256());
  if (checkpoint.has_crc32c()) {
    response.set_header(kCrc32cHeader, absl::StrFormat("%08x", checkpoint.crc32c()));
  }
}

// X-Checkpoint-Crc32c's value: 8 lowercase hex digits, as downloads send it.
std::optional<uint32_t> ParseCrc32c(const std::string& hex) {
  if (hex.size() != 8 || hex.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return std::nullopt;
  }
  return static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
}

// The body's end-to-end check: a sha256 (the content key), a CRC-32C (a tenth of the client's
// CPU: what the `gradhub` module sends where gradhub's engine is loaded), or both; at least one.
absl::Status ParseBodyCheck(const httplib::Request& request, UploadRequest& upload) {
  const bool has_sha = request.has_header(kShaHeader);
  const bool has_crc = request.has_header(kCrc32cHeader);
  if (!has_sha && !has_crc) {
    return absl::InvalidArgumentError(absl::StrCat(
        kShaHeader, " or ", kCrc32cHeader,
        ": one is required, the body's sha256 (64 lowercase hex characters) or its CRC-32C "
        "(8 lowercase hex digits)"));
  }
  if (has_sha) {
    upload.sha256 = request.get_header_value(kShaHeader);
    if (!IsSha256Hex(upload.sha256)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kShaHeader, ": the body's sha256 as 64 lowercase hex characters"));
    }
  }
  if (has_crc) {
    upload.crc32c = ParseCrc32c(request.get_header_value(kCrc32cHeader));
    if (!upload.crc32c) {
      return absl::InvalidArgumentError(
          absl::StrCat(kCrc32cHeader, ": the body's CRC-32C as 8 lowercase hex digits"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<UploadRequest> ParseUpload(const httplib::Request& request) {
  UploadRequest upload;
  int64_t step = 0, size = 0;
  int32_t attempt = 0;
  if (!absl::SimpleAtoi(request.matches[2].str(), &step)) {
    return absl::InvalidArgumentError("step: the path's last part must be an integer");
  }
  if (!absl::SimpleAtoi(request.get_param_value("attempt"), &attempt)) {
    return absl::InvalidArgumentError("attempt: the query must say ?attempt=N, an integer");
  }
  GRADHUB_RETURN_IF_ERROR(ParseBodyCheck(request, upload));
  (void)absl::SimpleAtoi(request.get_header_value("Content-Length"), &size);  // checked before
  upload.start.set_job(JobName(request));
  upload.start.set_attempt(attempt);
  upload.start.set_step(step);
  upload.start.set_size_bytes(size);
  GRADHUB_RETURN_IF_ERROR(
      ParseMetadata(request.get_header_value(kMetadataHeader), upload.start.mutable_metadata()));
  return upload;
}

// The body of an upload into `writer`, in chunks of `chunk_bytes` (none with a crc32c: the
// store computes the digests of what it received, which the commit checks against the
// client's). After a failed write the rest of the body is still read, and dropped.
absl::Status Receive(const httplib::ContentReader& body, UploadWriter& writer, size_t chunk_bytes,
                     int64_t size) {
  std::string pending;
  pending.reserve(chunk_bytes);
  int64_t offset = 0;
  absl::Status written;
  const auto pass = [&] {
    const int64_t length = static_cast<int64_t>(pending.size());
    if (written.ok()) written = writer.Write(offset, std::exchange(pending, {}), std::nullopt);
    offset += length;
    pending.reserve(chunk_bytes);
  };
  const bool whole = body([&](const char* data, size_t length) {
    while (length > 0) {
      const size_t take = std::min(length, chunk_bytes - pending.size());
      pending.append(data, take);
      data += take;
      length -= take;
      if (pending.size() == chunk_bytes) pass();
    }
    return true;
  });
  if (!pending.empty()) pass();
  const absl::StatusOr<int64_t> held = writer.Finish();
  GRADHUB_RETURN_IF_ERROR(written);
  if (!held.ok()) return held.status();
  if (!whole || *held != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "body: ", *held, " of the ", size, " bytes of its Content-Length arrived; nothing kept"));
  }
  return absl::OkStatus();
}

}  // namespace

CheckpointRest::CheckpointRest(CheckpointManager* manager, const api::Authenticator* auth,
                               CheckpointMetrics* metrics, CheckpointRestOptions options)
    : manager_(manager), auth_(auth), metrics_(metrics), options_(std::move(options)) {
  // The listener takes bodies of any size; LimitBodies and the PUT routes apply the limits.
  HttpServerOptions listener = options_;
  listener.max_body_bytes = std::numeric_limits<size_t>::max();
  server_ = MakeHttpServer(listener);
  LimitBodies();
  Route();
  RouteDownload();
  RouteUpload();
}

CheckpointRest::~CheckpointRest() { Stop(); }

absl::StatusOr<int> CheckpointRest::Start(const std::string& host, int port) {
  // Last, after every PUT route: httplib would read a body no route streams into memory.
  server_->Put(".*", [](const httplib::Request&, httplib::Response& response,
                        const httplib::ContentReader& body) {
    Drain(body);
    response.status = 404;
  });
  return StartHttpServer(*server_, options_, host, port, &thread_);
}

absl::StatusOr<Caller> CheckpointRest::CallerOf(const httplib::Request& request) const {
  return IdentifyCaller(*auth_, request.get_header_value("Authorization"));
}

void CheckpointRest::LimitBodies() {
  // Before routing, the body still unread: one over the limit goes to kRefusedBodyPath.
  // (httplib reads no body of a GET.)
  server_->set_pre_routing_handler(
      [limit = options_.max_body_bytes](const httplib::Request& request, httplib::Response&) {
        if (request.method != "PUT" && BodyOver(request, limit)) {
          // The Request object is the server's own (not const), which makes this well-defined.
          const_cast<httplib::Request&>(request).path = kRefusedBodyPath;
        }
        return httplib::Server::HandlerResponse::Unhandled;
      });
  const auto refuse = [](const httplib::Request&, httplib::Response& response,
                         const httplib::ContentReader& body) {
    Drain(body);
    response.status = 413;  // the error handler writes the body
  };
  server_->Post(kRefusedBodyPath, refuse);
  server_->Patch(kRefusedBodyPath, refuse);
  server_->Delete(kRefusedBodyPath, refuse);
}

void CheckpointRest::Stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

void CheckpointRest::Route() {
  // Liveness needs nothing but this process; readiness needs the database and its schema.
  server_->Get("/healthz", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("ok\n", "text/plain");
  });
  server_->Get("/readyz", [this](const httplib::Request&, httplib::Response& response) {
    const absl::Status ready = manager_->CheckReady();
    if (!ready.ok()) return SendError(response, ready);
    response.set_content("ok\n", "text/plain");
  });
  server_->Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    response.set_content(metrics_->Scrape(), "text/plain; version=0.0.4");
  });
  auto caller = [this](const httplib::Request& request) { return CallerOf(request); };
  server_->Get(R"(/v1/jobs/([^/:]+)/checkpoints)", [=](const httplib::Request& request,
                                                       httplib::Response& response) {
    const absl::StatusOr<Caller> who = caller(request);
    if (!who.ok()) return SendError(response, who.status());
    v1::ListCheckpointsRequest list;
    list.set_parent(JobName(request));
    int32_t page_size = 0;
    if (request.has_param("pageSize") &&
        !absl::SimpleAtoi(request.get_param_value("pageSize"), &page_size)) {
      return SendError(response, absl::InvalidArgumentError("pageSize: not an integer"));
    }
    list.set_page_size(page_size);
    list.set_page_token(request.get_param_value("pageToken"));
    list.set_filter(request.get_param_value("filter"));
    Send(response, manager_->List(*who, list));
  });
  server_->Get(R"(/v1/jobs/([^/:]+)/checkpoints:latest)",
               [=](const httplib::Request& request, httplib::Response& response) {
                 const absl::StatusOr<Caller> who = caller(request);
                 if (!who.ok()) return SendError(response, who.status());
                 Send(response, manager_->GetLatest(*who, JobName(request)));
               });
  server_->Delete(R"(/v1/jobs/([^/:]+)/checkpoints/([^/:]+))",
                  [=](const httplib::Request& request, httplib::Response& response) {
                    const absl::StatusOr<Caller> who = caller(request);
                    if (!who.ok()) return SendError(response, who.status());
                    const absl::Status deleted = manager_->Delete(*who, CheckpointNameOf(request));
                    if (!deleted.ok()) return SendError(response, deleted);
                    response.set_content("{}\n", "application/json");
                  });
  // httplib's own errors (no route, malformed request) in the same shape as the handlers'.
  server_->set_error_handler([](const httplib::Request&, httplib::Response& response) {
    if (!response.body.empty()) return;
    // The body's code is the HTTP status sent (a 413 says 413, not its gRPC meaning's 429).
    const int status = response.status;
    response.set_content(HttpErrorJson(StatusForHttpError(status), status) + "\n",
                         "application/json");
  });
}

void CheckpointRest::RouteDownload() {
  server_->Get(
      R"(/v1/jobs/([^/:]+)/checkpoints/([^/:]+):download)",
      [this](const httplib::Request& request, httplib::Response& response) {
        // httplib 0.11 applies a request's Range to whatever the handler answers, error bodies
        // included; the range is served here, so it must not apply it again. The Request object is
        // the server's own (not const), which makes this cast well-defined.
        const_cast<httplib::Request&>(request).ranges.clear();
        const absl::StatusOr<Caller> who = CallerOf(request);
        if (!who.ok()) return SendError(response, who.status());
        const std::optional<int64_t> offset = RangeOffset(request);
        if (!offset) {
          return SendError(response,
                           absl::OutOfRangeError("Range: only a single `bytes=N-` is served"), 416);
        }
        absl::StatusOr<std::unique_ptr<CheckpointDownload>> opened =
            manager_->OpenDownload(*who, CheckpointNameOf(request), *offset,
                                   request.get_param_value("verifySha256") == "true");
        if (!opened.ok()) return SendError(response, opened.status());
        const int64_t size = (*opened)->checkpoint().size_bytes();
        if (request.has_header("Range") && *offset >= size) {
          SendError(response, absl::OutOfRangeError(
                                  absl::StrCat("Range: the checkpoint has ", size, " bytes")));
          response.status = 416;
          response.set_header("Content-Range", absl::StrCat("bytes */", size));
          return;
        }
        if (request.has_header("Range")) {
          response.status = 206;
          response.set_header("Content-Range",
                              absl::StrCat("bytes ", *offset, "-", size - 1, "/", size));
        }
        SetDigestHeaders((*opened)->checkpoint(), response);
        std::shared_ptr<CheckpointDownload> download = *std::move(opened);
        response.set_content_provider(
            static_cast<size_t>(size - *offset), "application/octet-stream",
            [this, download, chunk = std::string()](size_t, size_t,
                                                    httplib::DataSink& sink) mutable {
              // Returning false drops the connection short of Content-Length: a client cannot take
              // a corrupt blob's bytes for a whole checkpoint.
              if (!download->Next(&chunk).ok()) return false;
              if (chunk.empty()) return true;
              if (metrics_ != nullptr)
                metrics_->RecordSent("rest", static_cast<int64_t>(chunk.size()));
              return sink.write(chunk.data(), chunk.size());
            });
      });
}

void CheckpointRest::RouteUpload() {
  server_->Put(
      R"(/v1/jobs/([^/:]+)/checkpoints/([^/:]+))",
      [this](const httplib::Request& request, httplib::Response& response,
             const httplib::ContentReader& body) {
        // The body's size first: nothing else is worth reading a body that is refused.
        absl::Status refused;
        if (const int http_status = RefusedLength(request, options_.max_upload_bytes, &refused)) {
          Drain(body);
          return SendError(response, refused, http_status);
        }
        const absl::StatusOr<v1::Checkpoint> committed = Upload(request, body);
        if (absl::IsAlreadyExists(committed.status())) {
          const absl::StatusOr<Caller> who = CallerOf(request);
          if (who.ok()) SetCommittedDigests(*who, CheckpointNameOf(request), response);
        }
        Send(response, committed);
      });
}

absl::StatusOr<v1::Checkpoint> CheckpointRest::Upload(const httplib::Request& request,
                                                      const httplib::ContentReader& body) {
  // 1. Who, what, and the upload opened: all before a byte of the body is stored. Refused
  //    here, the body is read and dropped (see the top).
  absl::StatusOr<Caller> who = CallerOf(request);
  absl::StatusOr<UploadRequest> upload = who.ok() ? ParseUpload(request) : who.status();
  absl::StatusOr<std::unique_ptr<UploadWriter>> writer =
      upload.ok() ? OpenUpload(*who, upload->start) : upload.status();
  if (!writer.ok()) {
    Drain(body);
    return writer.status();
  }
  // 2. The body, streamed into the upload.
  v1::CommitCheckpointRequest commit;
  commit.set_upload_id((*writer)->upload_id());
  GRADHUB_RETURN_IF_ERROR(Receive(body, **writer,
                                  static_cast<size_t>(manager_->options().chunk_size_bytes),
                                  upload->start.size_bytes()));
  writer->reset();  // done: its transfer slot goes back
  // 3. The commit, which checks the store's digests of the body against the headers'.
  commit.set_sha256(upload->sha256);
  if (upload->crc32c) commit.set_crc32c(*upload->crc32c);
  return manager_->Commit(*who, commit);
}

absl::StatusOr<std::unique_ptr<UploadWriter>> CheckpointRest::OpenUpload(
    const Caller& caller, const v1::StartUploadRequest& start) {
  GRADHUB_ASSIGN_OR_RETURN(const v1::StartUploadResponse started,
                           manager_->StartUpload(caller, start));
  return manager_->OpenUpload(caller, started.upload_id());
}

void CheckpointRest::SetCommittedDigests(const Caller& caller, const std::string& name,
                                         httplib::Response& response) {
  absl::StatusOr<std::unique_ptr<CheckpointDownload>> committed =
      manager_->OpenDownload(caller, name, 0);
  if (!committed.ok()) return;
  SetDigestHeaders((*committed)->checkpoint(), response);
}

}  // namespace gradhub::checkpoint
