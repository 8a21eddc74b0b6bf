#include "services/checkpoint/code_rest.h"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "services/checkpoint/checkpoint_service.h"
#include "services/common/http_errors.h"
#include "services/common/status_macros.h"

namespace gradhub::checkpoint {
namespace {

constexpr char kShaHeader[] = "X-Code-Sha256";
// The body goes to the store in pieces of this size (httplib hands it over in a few KiB).
constexpr size_t kPieceBytes = 1 << 20;

// An error in the body every gradhub REST server answers with; `http_status` 0 = the one of
// its code.
void SendError(httplib::Response& response, const absl::Status& status, int http_status = 0) {
  response.status = http_status != 0 ? http_status : HttpStatusFor(status.code());
  response.set_content(
      (http_status != 0 ? HttpErrorJson(status, http_status) : HttpErrorJson(status)) + "\n",
      "application/json");
}

void Send(httplib::Response& response, const absl::StatusOr<v1::CodeArchive>& archive) {
  if (!archive.ok()) return SendError(response, archive.status());
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(*archive, &json, {});
  response.status = 200;
  response.set_content(json + "\n", "application/json");
}

// Reads the rest of a body and drops it.
void Drain(const httplib::ContentReader& body) {
  body([](const char*, size_t) { return true; });
}

// The offset `Range: bytes=N-` asks for (0 without a Range); OUT_OF_RANGE for any other range.
absl::StatusOr<int64_t> RangeOffset(const httplib::Request& request) {
  if (!request.has_header("Range")) return 0;
  return OpenRangeOffset(request.get_header_value("Range"));
}

// The body into `upload` in pieces of kPieceBytes. After a failed write the rest is still read,
// and dropped.
absl::Status Receive(const httplib::ContentReader& body, CodeUpload& upload) {
  std::string piece;
  absl::Status written;
  const auto pass = [&] {
    if (written.ok()) written = upload.Write(std::exchange(piece, std::string()));
    piece.clear();
  };
  const bool whole = body([&](const char* data, size_t length) {
    if (piece.empty()) piece.reserve(kPieceBytes);
    piece.append(data, length);
    if (piece.size() >= kPieceBytes) pass();
    return true;
  });
  if (!piece.empty()) pass();
  GRADHUB_RETURN_IF_ERROR(written);
  if (!whole) return absl::DataLossError("body: it ended before its Content-Length; nothing kept");
  return absl::OkStatus();
}

}  // namespace

CodeRest::CodeRest(httplib::Server& server, CodeStore* store, const api::Authenticator* auth,
                   CheckpointMetrics* metrics)
    : store_(store), auth_(auth), metrics_(metrics) {
  RouteUpload(server);
  RouteRead(server);
}

absl::StatusOr<Caller> CodeRest::CallerOf(const httplib::Request& request) const {
  return IdentifyCaller(*auth_, request.get_header_value("Authorization"));
}

void CodeRest::RouteUpload(httplib::Server& server) {
  server.Put("/v1/code", [this](const httplib::Request& request, httplib::Response& response,
                                const httplib::ContentReader& body) {
    if (!request.has_header("Content-Length")) {
      Drain(body);
      return SendError(response,
                       absl::InvalidArgumentError("Content-Length: required (the archive's size)"),
                       411);
    }
    Send(response, Upload(request, body));
  });
}

absl::StatusOr<v1::CodeArchive> CodeRest::Upload(const httplib::Request& request,
                                                 const httplib::ContentReader& body) {
  absl::StatusOr<std::unique_ptr<CodeUpload>> upload = StartUpload(request);
  if (!upload.ok()) {
    Drain(body);
    return upload.status();
  }
  // A body cut short discards the upload with its CodeUpload.
  GRADHUB_RETURN_IF_ERROR(Receive(body, **upload));
  return (*upload)->Finish();
}

absl::StatusOr<std::unique_ptr<CodeUpload>> CodeRest::StartUpload(const httplib::Request& request) {
  GRADHUB_ASSIGN_OR_RETURN(const Caller caller, CallerOf(request));
  int64_t size = 0;
  if (!absl::SimpleAtoi(request.get_header_value("Content-Length"), &size)) {
    return absl::InvalidArgumentError("Content-Length: not a number");
  }
  v1::UploadCodeHeader header;
  header.set_size_bytes(size);
  header.set_sha256(request.get_header_value(kShaHeader));
  return store_->StartUpload(caller, header);
}

void CodeRest::RouteRead(httplib::Server& server) {
  server.Get(R"(/v1/code/([^/:]+))",
             [this](const httplib::Request& request, httplib::Response& response) {
               const absl::StatusOr<Caller> who = CallerOf(request);
               if (!who.ok()) return SendError(response, who.status());
               Send(response, store_->Get(*who, "code/" + request.matches[1].str()));
             });
  server.Get(R"(/v1/code/([^/:]+):download)",
             [this](const httplib::Request& request, httplib::Response& response) {
               Download(request, response);
             });
}

void CodeRest::Download(const httplib::Request& request, httplib::Response& response) {
  // httplib would apply the Range to whatever is answered: it is served here instead (as
  // CheckpointRest's download does). The Request object is the server's own (not const).
  const_cast<httplib::Request&>(request).ranges.clear();
  const bool ranged = request.has_header("Range");
  absl::StatusOr<std::unique_ptr<CodeDownload>> opened = OpenDownload(request);
  if (!opened.ok()) {
    return SendError(response, opened.status(),
                     ranged && absl::IsOutOfRange(opened.status()) ? 416 : 0);
  }
  const int64_t size = (*opened)->archive().size_bytes(), offset = (*opened)->offset();
  if (ranged && offset >= size) {
    response.set_header("Content-Range", absl::StrCat("bytes */", size));
    return SendError(response,
                     absl::OutOfRangeError(absl::StrCat("Range: the archive has ", size, " bytes")),
                     416);
  }
  if (ranged) {
    response.status = 206;
    response.set_header("Content-Range", absl::StrCat("bytes ", offset, "-", size - 1, "/", size));
  }
  response.set_header(kShaHeader, (*opened)->archive().digest().substr(sizeof("sha256:") - 1));
  std::shared_ptr<CodeDownload> download = *std::move(opened);
  response.set_content_provider(
      static_cast<size_t>(size - offset), "application/octet-stream",
      [this, download, chunk = std::string()](size_t, size_t, httplib::DataSink& sink) mutable {
        // false drops the connection short of Content-Length: a client cannot take a corrupt
        // archive's bytes for a whole one.
        if (!download->Next(&chunk).ok()) return false;
        if (chunk.empty()) return true;
        if (metrics_ != nullptr) metrics_->RecordSent("rest", static_cast<int64_t>(chunk.size()));
        return sink.write(chunk.data(), chunk.size());
      });
}

absl::StatusOr<std::unique_ptr<CodeDownload>> CodeRest::OpenDownload(
    const httplib::Request& request) {
  GRADHUB_ASSIGN_OR_RETURN(const Caller caller, CallerOf(request));
  GRADHUB_ASSIGN_OR_RETURN(const int64_t offset, RangeOffset(request));
  return store_->OpenDownload(caller, "code/" + request.matches[1].str(), offset);
}

}  // namespace gradhub::checkpoint
