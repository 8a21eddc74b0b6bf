#include "services/checkpoint/checkpoint_rest.h"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/checkpoint/checkpoint_service.h"
#include "services/common/http_errors.h"

namespace gradhub::checkpoint {
namespace {

constexpr char kShaHeader[] = "X-Checkpoint-Sha256";

// The error answer gradhub-api gives too (services/common/http_errors.h).
void SendError(httplib::Response& response, const absl::Status& status) {
  response.status = HttpStatusFor(status.code());
  response.set_content(HttpErrorJson(status) + "\n", "application/json");
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
  static const std::regex kOpenRange(R"(\s*bytes\s*=\s*([0-9]{1,18})\s*-\s*)");
  std::smatch match;
  const std::string range = request.get_header_value("Range");
  int64_t offset = 0;
  if (!std::regex_match(range, match, kOpenRange) || !absl::SimpleAtoi(match[1].str(), &offset)) {
    return std::nullopt;
  }
  return offset;
}

}  // namespace

CheckpointRest::CheckpointRest(CheckpointManager* manager, const api::Authenticator* auth,
                               CheckpointMetrics* metrics, CheckpointRestOptions options)
    : manager_(manager), auth_(auth), metrics_(metrics), options_(std::move(options)) {
  server_ = MakeHttpServer(options_);
  Route();
  RouteDownload();
}

CheckpointRest::~CheckpointRest() { Stop(); }

absl::StatusOr<int> CheckpointRest::Start(const std::string& host, int port) {
  return StartHttpServer(*server_, options_, host, port, &thread_);
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
  auto caller = [this](const httplib::Request& request) {
    return IdentifyCaller(*auth_, request.get_header_value("Authorization"),
                          request.get_header_value(kNodeMetadata),
                          request.get_header_value(kNodeSessionMetadata));
  };
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
        const absl::StatusOr<Caller> who =
            IdentifyCaller(*auth_, request.get_header_value("Authorization"),
                           request.get_header_value(kNodeMetadata),
                           request.get_header_value(kNodeSessionMetadata));
        if (!who.ok()) return SendError(response, who.status());
        const std::optional<int64_t> offset = RangeOffset(request);
        if (!offset) {
          SendError(response, absl::OutOfRangeError("Range: only a single `bytes=N-` is served"));
          response.status = 416;
          return;
        }
        absl::StatusOr<std::unique_ptr<CheckpointDownload>> opened =
            manager_->OpenDownload(*who, CheckpointNameOf(request), *offset);
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
        response.set_header(kShaHeader, (*opened)->checkpoint().sha256());
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

}  // namespace gradhub::checkpoint
