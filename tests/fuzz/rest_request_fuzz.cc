// Fuzzes the REST gateway's request reading and routing (services/api/rest_gateway.cc) with
// the bytes a client sends on a connection, read as the gateway's connections are: through
// the edge's RequestStream over a plain transport (http_request_stream.h: header and body
// limits, FramingOf's reading of Content-Length and Transfer-Encoding), by httplib's HTTP/1.1
// reader configured by MakeHttpServer, routed by the gateway's path patterns (rest_paths), and
// parsed into the rpcs' requests (rest_request.h: paths, query parameters, JSON bodies). The
// handlers stop where the gateway's call the managers, which need PostgreSQL: each answers
// with the request it parsed, as JSON, or with the error. An input may hold several requests
// on one connection (keep-alive), as any client can send; it reaches the server through a
// socket pair, as a client's bytes would.
// Not covered: the accepting thread's admission (connections per client) and the token check
// before a body (admit_body), which need a listening server and PostgreSQL; tests/integration
// has them.
// Checked besides "never crashes" (ASan, UBSan):
//   1. no exception escapes a handler (httplib would answer 500 with its what() in a header);
//   2. every request parsed prints as JSON and parses back to the same message: what the
//      gateway answers, a client can read; a CreateJob spec that validates is stored as that
//      JSON (job_manager.cc), so a spec the api accepts is one it can store.
// Debian's httplib and protobuf are shared libraries built without coverage: the fuzzer is
// guided by the routes and parse paths taken here, and sees their crashes, not their branches.
#include <google/protobuf/util/field_comparator.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>
#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gradhub/v1/jobs.pb.h"
#include "gradhub/v1/nodes.pb.h"
#include "gradhub/v1/tenants.pb.h"
#include "services/api/rest_request.h"
#include "services/common/contract/job_spec.h"
#include "services/common/http_errors.h"
#include "services/common/http_request_stream.h"
#include "services/common/http_server.h"
#include "services/common/http_transport.h"

namespace {

namespace api = gradhub::api;
namespace paths = gradhub::api::rest_paths;
namespace v1 = gradhub::v1;
using google::protobuf::Message;
using httplib::Request;

// Requests read from one input at most: one connection's worth (httplib's keep-alive limit).
constexpr int kMaxRequestsPerInput = 5;
// Inputs past this are skipped: they fit the socket pair's buffer whole.
constexpr size_t kMaxInputBytes = 64 << 10;

void Require(bool condition) {
  if (!condition) std::abort();
}

// Server::process_request, protected: what a connection's thread runs for each request.
struct ConnectionServing : httplib::Server {
  static bool ServeOne(httplib::Server& server, httplib::Stream& stream, bool last, bool* closed,
                       const std::function<void(Request&)>& setup) {
    const auto serve = &ConnectionServing::process_request;
    return (server.*serve)(stream, last, *closed, setup);
  }
};

// The requests of one connection, as GuardedServer::ServeRequests serves them (http_server.cc):
// each within the stream's limits, its body bounded by the framing its headers announce; a
// request framed ambiguously is refused at once (RequestStream::Refuse) and ends the connection.
void ServeConnection(httplib::Server& server, gradhub::Transport& transport) {
  gradhub::RequestStream stream(transport, gradhub::RequestLimits{});
  for (int served = 0; served < kMaxRequestsPerInput; ++served) {
    stream.BeginRequest();
    bool closed = false;
    const bool last = served + 1 == kMaxRequestsPerInput;
    const bool answered =
        ConnectionServing::ServeOne(server, stream, last, &closed, [&](Request& r) {
          absl::StatusOr<gradhub::BodyFraming> framing = gradhub::FramingOf(r.headers);
          stream.BeginBody(framing.ok() ? *framing : gradhub::BodyFraming{});
          if (!framing.ok())
            stream.Refuse(gradhub::HttpStatusFor(framing.status().code()), framing.status());
        });
    if (!answered || closed || !stream.ReusableAfterRequest()) return;
  }
}

// Check 2: `message` prints and parses back to itself (NaN equal to NaN).
void RequireJsonRoundTrip(const Message& message) {
  std::string json;
  Require(google::protobuf::util::MessageToJsonString(message, &json).ok());
  std::unique_ptr<Message> again(message.New());
  Require(google::protobuf::util::JsonStringToMessage(json, again.get()).ok());
  google::protobuf::util::DefaultFieldComparator comparator;
  comparator.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differ;
  differ.set_field_comparator(&comparator);
  Require(differ.Compare(message, *again));
}

// A route's handler: `fill(request, &message)` parses the request as the gateway's handler does
// before it calls a manager; the answer is the message, or the error as the gateway sends it.
template <typename Proto, typename Fill>
httplib::Server::Handler Answer(Fill fill) {
  return [fill](const Request& request, httplib::Response& response) {
    Proto message;
    absl::Status parsed = api::CheckRequestText(request);  // as the gateway's Rpc()
    if (parsed.ok()) parsed = fill(request, &message);
    if (!parsed.ok()) {
      response.status = gradhub::HttpStatusFor(parsed.code());
      response.set_content(gradhub::HttpErrorJson(parsed) + "\n", "application/json");
      return;
    }
    RequireJsonRoundTrip(message);
    std::string json;
    (void)google::protobuf::util::MessageToJsonString(message, &json);
    response.set_content(json + "\n", "application/json");
  };
}

// A POST route as the gateway's Post() registers it: the body is read only when a length or
// chunking is announced; otherwise it is empty (RFC 9112 section 6.3).
void PostRoute(httplib::Server& server, const char* pattern, httplib::Server::Handler handler) {
  server.Post(pattern, [handler](const Request& request, httplib::Response& response,
                                 const httplib::ContentReader& content) {
    if (request.has_header("Content-Length") || request.has_header("Transfer-Encoding")) {
      std::string body;
      if (!content([&](const char* data, size_t size) {
            body.append(data, size);
            return true;
          })) {
        return;
      }
      const_cast<Request&>(request).body = std::move(body);  // httplib's own request, as there
    }
    handler(request, response);
  });
}

// The name from the path into a request's `name` (GetJob, WatchJob, GetNode).
template <typename Proto>
absl::Status NameOnly(const Request& request, Proto* message, std::string (*name)(const Request&)) {
  message->set_name(name(request));
  return absl::OkStatus();
}

// CreateJob: the body, then the spec's validation, CreateJob's first step (job_manager.cc).
absl::Status CreateJob(const Request& request, v1::JobSpec* spec) {
  GRADHUB_RETURN_IF_ERROR(api::ParseBody(request, spec));
  const std::vector<gradhub::SpecIssue> issues = gradhub::ValidateJobSpec(*spec);
  if (!issues.empty()) return absl::InvalidArgumentError(issues.front().message);
  return absl::OkStatus();
}

void RouteJobs(httplib::Server& server) {
  PostRoute(server, paths::kJobs, Answer<v1::JobSpec>(CreateJob));
  server.Get(paths::kJobs, Answer<v1::ListJobsRequest>(api::ParseListParams<v1::ListJobsRequest>));
  server.Get(paths::kJob, Answer<v1::GetJobRequest>([](const Request& r, v1::GetJobRequest* m) {
               return NameOnly(r, m, api::JobName);
             }));
  PostRoute(server, paths::kJobCancel,
            Answer<v1::CancelJobRequest>([](const Request& r, v1::CancelJobRequest* m) {
              GRADHUB_RETURN_IF_ERROR(api::ParseBody(r, m));
              return NameOnly(r, m, api::JobName);
            }));
  server.Get(paths::kJobEvents,
             Answer<v1::ListJobEventsRequest>([](const Request& r, v1::ListJobEventsRequest* m) {
               m->set_parent(api::JobName(r));
               return api::ParseListParams(r, m);
             }));
  server.Get(paths::kJobMetrics,
             Answer<v1::GetJobMetricsRequest>([](const Request& r, v1::GetJobMetricsRequest* m) {
               int32_t max_points = 0;
               GRADHUB_RETURN_IF_ERROR(api::IntParam(r, "maxPoints", &max_points));
               m->set_max_points(max_points);
               return NameOnly(r, m, api::JobName);
             }));
  server.Get(paths::kJobWatch,
             Answer<v1::WatchJobRequest>([](const Request& r, v1::WatchJobRequest* m) {
               return NameOnly(r, m, api::JobName);
             }));
  server.Get(paths::kJobLogs,
             Answer<v1::GetJobLogsRequest>([](const Request& r, v1::GetJobLogsRequest* m) {
               GRADHUB_ASSIGN_OR_RETURN(*m, api::ParseLogsRequest(r));
               return absl::OkStatus();
             }));
}

// `T` from BodyNamed<T>(request, name(request)) into *message.
template <typename T>
absl::Status Named(const Request& request, T* message, std::string name) {
  GRADHUB_ASSIGN_OR_RETURN(*message, api::BodyNamed<T>(request, name));
  return absl::OkStatus();
}

void RouteNodes(httplib::Server& server) {
  server.Get(paths::kNodes,
             Answer<v1::ListNodesRequest>(api::ParseListParams<v1::ListNodesRequest>));
  server.Get(paths::kNode, Answer<v1::GetNodeRequest>([](const Request& r, v1::GetNodeRequest* m) {
               return NameOnly(r, m, api::NodeName);
             }));
  PostRoute(server, paths::kNodeCordon,
            Answer<v1::CordonNodeRequest>([](const Request& r, v1::CordonNodeRequest* m) {
              return Named(r, m, api::NodeName(r));
            }));
  PostRoute(server, paths::kNodeDrain,
            Answer<v1::DrainNodeRequest>([](const Request& r, v1::DrainNodeRequest* m) {
              return Named(r, m, api::NodeName(r));
            }));
}

void RouteTenants(httplib::Server& server) {
  PostRoute(server, paths::kTenants,
            Answer<v1::CreateTenantRequest>([](const Request& r, v1::CreateTenantRequest* m) {
              GRADHUB_RETURN_IF_ERROR(api::ParseBody(r, m->mutable_tenant()));
              m->set_tenant_id(r.get_param_value("tenantId"));
              m->set_request_id(r.get_param_value("requestId"));
              return absl::OkStatus();
            }));
  server.Get(paths::kTenants,
             Answer<v1::ListTenantsRequest>(api::ParsePageParams<v1::ListTenantsRequest>));
  PostRoute(server, paths::kTenantTokens,
            Answer<v1::CreateTokenRequest>([](const Request& r, v1::CreateTokenRequest* m) {
              GRADHUB_RETURN_IF_ERROR(api::ParseBody(r, m->mutable_token()));
              m->set_parent(api::TenantName(r));
              return absl::OkStatus();
            }));
  PostRoute(server, paths::kTokenRevoke,
            Answer<v1::RevokeTokenRequest>([](const Request& r, v1::RevokeTokenRequest* m) {
              return Named(r, m, api::TenantName(r) + "/tokens/" + r.matches[2].str());
            }));
}

// The server, configured as the gateway's and routed once; requests are served on the
// fuzzer's thread only.
httplib::Server& FuzzedServer() {
  static httplib::Server* const server = [] {
    httplib::Server* made = gradhub::MakeHttpServer(gradhub::HttpServerOptions{}).release();
    made->set_exception_handler(
        [](const Request&, httplib::Response&, std::exception_ptr) { std::abort(); });  // check 1
    RouteJobs(*made);
    RouteNodes(*made);
    RouteTenants(*made);
    return made;
  }();
  return *server;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The client's end sends the input and shuts its sending side; the server's end is read as
  // a connection. Responses (a few KB at most) wait in the client's receive buffer.
  if (size > kMaxInputBytes) return 0;
  int ends[2];
  Require(socketpair(AF_UNIX, SOCK_STREAM, 0, ends) == 0);
  const int buffer = 2 * kMaxInputBytes;
  Require(setsockopt(ends[1], SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer) == 0);
  Require(size == 0 || write(ends[1], data, size) == static_cast<ssize_t>(size));
  Require(shutdown(ends[1], SHUT_WR) == 0);
  {
    std::unique_ptr<gradhub::Transport> transport = gradhub::PlainTransport(ends[0]);
    ServeConnection(FuzzedServer(), *transport);
  }
  close(ends[0]);
  close(ends[1]);
  return 0;
}
