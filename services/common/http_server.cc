#include "services/common/http_server.h"

#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "services/common/connection_threads.h"
#include "services/common/http_connection_limits.h"
#include "services/common/http_errors.h"
#include "services/common/http_request_stream.h"
#include "services/common/http_transport.h"

namespace gradhub {
namespace {

// Connections waiting to be accepted; httplib 0.11 listens with a backlog of 5, which drops
// the SYNs of a burst (a client then waits a second to retry).
constexpr int kListenBacklog = 1024;
// After answering a request whose body was left unread, the server ends its side and reads
// (and drops) what the client still sends, up to these, before it closes the socket: closing
// with unread bytes would send a reset, which can destroy the answer before the client reads it.
constexpr size_t kLingerBytes = 1 << 20;
constexpr absl::Duration kLingerTime = absl::Seconds(2);

// A request refused from its headers (step 3 of http_server.h), on its way from the
// setup_request hook to the Expect handler that answers it, on the thread serving it.
struct Refusal {
  int http_status = 400;
  absl::Status error;
};
thread_local std::optional<Refusal> pending_refusal;

// What httplib's accept loop hands over runs at once on the accepting thread: the admission
// (GuardedServer::process_and_close_socket), which passes an admitted connection to a thread of
// its own. When the loop ends (stop()), `on_shutdown` ends the connections.
class RunOnAcceptingThread final : public httplib::TaskQueue {
 public:
  explicit RunOnAcceptingThread(std::function<void()> on_shutdown)
      : on_shutdown_(std::move(on_shutdown)) {}
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override { on_shutdown_(); }

 private:
  std::function<void()> on_shutdown_;
};

// Reads and drops what the peer still sends, within kLingerBytes and kLingerTime.
void Linger(int fd) {
  const absl::Time deadline = absl::Now() + kLingerTime;
  char sink[16 << 10];
  size_t dropped = 0;
  while (dropped < kLingerBytes && WaitReady(fd, POLLIN, deadline)) {
    const ssize_t n = ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return;
    if (n > 0) dropped += static_cast<size_t>(n);
  }
}

// A connection refused at admission: a 429 that the client may read (plain HTTP only: TLS would
// need the handshake it is refused), then the close. Never waits.
void RefuseConnection(int fd, bool tls, const absl::Status& error) {
  if (!tls) {
    const std::string body = HttpErrorJson(error) + "\n";
    const std::string answer = absl::StrCat(
        "HTTP/1.1 ", HttpStatusFor(error.code()),
        " Too Many Requests\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
        "\r\nConnection: close\r\n\r\n", body);
    (void)::send(fd, answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

class GuardedServer final : public httplib::Server {
 public:
  // `tls`: the loaded certificate, or why it did not load; null = plain HTTP.
  GuardedServer(const HttpServerOptions& options, absl::StatusOr<std::unique_ptr<TlsContext>> tls)
      : options_(options),
        tls_status_(tls.status()),
        tls_(tls.ok() ? *std::move(tls) : nullptr),
        connections_(options.limits),
        threads_(options.idle_threads) {
    new_task_queue = [this] {
      return new RunOnAcceptingThread([this] {
        connections_.ShutDownWaiting();
        threads_.Drain();
      });
    };
    set_payload_max_length(options.max_body_bytes);
    set_expect_100_continue_handler(AnswerRefusal);
    // SO_REUSEADDR instead of httplib's SO_REUSEPORT: a restarted server binds its port again
    // while its killed predecessor's connections sit in TIME_WAIT, and no other process can
    // bind the same port beside it and take a share of its connections.
    set_socket_options([](socket_t sock) {
      const int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    });
  }

  // TLS asked for and not loaded: StartHttpServer refuses to serve, with tls_status().
  bool is_valid() const override { return tls_status_.ok(); }
  const absl::Status& tls_status() const { return tls_status_; }

  // After the bind: a backlog that holds a burst.
  void RaiseBacklog() { ::listen(svr_sock_, kListenBacklog); }

 private:
  bool stopping() const { return svr_sock_ == INVALID_SOCKET; }

  // Step 1, on the accepting thread (httplib calls it through the task queue above).
  bool process_and_close_socket(socket_t fd) override {
    std::string client;
    int port = 0;
    SocketAddress(fd, /*peer=*/true, &client, &port);
    absl::StatusOr<ConnectionTable::Admission> admitted = connections_.Admit(fd, client);
    if (!admitted.ok()) {
      RefuseConnection(fd, /*tls=*/tls_ != nullptr, admitted.status());
      return false;
    }
    auto admission = std::make_shared<ConnectionTable::Admission>(*std::move(admitted));
    threads_.Run([this, fd, admission] { Serve(fd, std::move(*admission)); });
    return true;
  }

  // Step 2: the connection's life on its own thread, the TLS handshake within the header time.
  void Serve(int fd, ConnectionTable::Admission admission) {
    std::unique_ptr<Transport> transport =
        tls_ ? tls_->Accept(fd, absl::Now() + options_.limits.header_timeout) : PlainTransport(fd);
    if (transport != nullptr) {
      const bool clean = ServeRequests(*transport, admission);
      transport->EndWrites();
      if (!clean) Linger(fd);
      transport.reset();
    }
    admission = ConnectionTable::Admission();  // out of the table before the fd can be reused
    ::close(fd);
  }

  // Step 3 for each request, as httplib's keep-alive loop does. False when the connection ends
  // with input it did not read (a refused request, a body left unread).
  bool ServeRequests(Transport& transport, ConnectionTable::Admission& admission) {
    RequestStream stream(transport, RequestLimitsOf(options_));
    for (size_t served = 0; served < keep_alive_max_count_; ++served) {
      admission.MarkWaiting();
      if (stopping()) break;
      stream.BeginRequest();
      bool closed = false;
      const bool last = served + 1 == keep_alive_max_count_;
      const bool answered = process_request(stream, last, closed, [&](httplib::Request& request) {
        admission.MarkBusy();
        SetUpRequest(stream, request);
      });
      if (!answered || closed || !stream.ReusableAfterRequest()) break;
    }
    return stream.ReusableAfterRequest();
  }

  // httplib's setup_request hook: the headers are in, no byte of the body is read.
  void SetUpRequest(RequestStream& stream, httplib::Request& request) const {
    absl::StatusOr<BodyFraming> framing = FramingOf(request.headers);
    stream.BeginBody(framing.ok() ? *framing : BodyFraming{});
    pending_refusal = framing.ok()
                          ? RefusalFor(request, *framing)
                          : Refusal{HttpStatusFor(framing.status().code()), framing.status()};
    if (!pending_refusal) return;
    // httplib answers from the Expect handler, before routing and reading, when the request
    // expects 100-continue: the one exit it has between the headers and the handlers.
    stream.CloseAfterResponse();
    request.headers.erase("Expect");
    request.headers.emplace("Expect", "100-continue");
    request.headers.erase("Connection");
    request.headers.emplace("Connection", "close");
  }

  std::optional<Refusal> RefusalFor(const httplib::Request& request,
                                    const BodyFraming& framing) const {
    if (framing.kind == BodyFraming::Kind::kNone) return std::nullopt;
    const std::string coding = request.get_header_value("Content-Encoding");
    if (!coding.empty() && !absl::EqualsIgnoreCase(coding, "identity")) {
      return Refusal{415, absl::InvalidArgumentError(
                              "Content-Encoding: request bodies are taken uncompressed only")};
    }
    // Who asks comes before what it sends: a caller without the right learns no limit.
    if (options_.admit_body) {
      absl::Status admitted = options_.admit_body(request);
      if (!admitted.ok()) return Refusal{HttpStatusFor(admitted.code()), std::move(admitted)};
    }
    if (framing.kind == BodyFraming::Kind::kLength && framing.length > options_.max_body_bytes) {
      return Refusal{413, absl::ResourceExhaustedError(absl::StrCat(
                              "request body: its ", framing.length, " bytes are over the ",
                              options_.max_body_bytes, "-byte limit"))};
    }
    return std::nullopt;
  }

  // The Expect: 100-continue handler: the refusal SetUpRequest left, else 100 (httplib's own
  // answer to a client that asked).
  static int AnswerRefusal(const httplib::Request&, httplib::Response& response) {
    if (!pending_refusal) return 100;
    const Refusal refusal = *std::exchange(pending_refusal, std::nullopt);
    response.status = refusal.http_status;
    response.set_content(HttpErrorJson(refusal.error, refusal.http_status) + "\n",
                         "application/json");
    return refusal.http_status;
  }

  static RequestLimits RequestLimitsOf(const HttpServerOptions& options) {
    return RequestLimits{.header_timeout = options.limits.header_timeout,
                         .body_timeout = options.limits.body_timeout,
                         .body_min_rate = options.limits.body_min_rate,
                         .max_body_bytes = options.max_body_bytes};
  }

  const HttpServerOptions options_;
  const absl::Status tls_status_;
  const std::unique_ptr<TlsContext> tls_;  // null = plain HTTP
  ConnectionTable connections_;
  ConnectionThreads threads_;
};

}  // namespace

std::unique_ptr<httplib::Server> MakeHttpServer(const HttpServerOptions& options) {
  const bool tls = !options.tls_cert_file.empty() || !options.tls_key_file.empty();
  return std::make_unique<GuardedServer>(
      options, tls ? TlsContext::Load(options.tls_cert_file, options.tls_key_file)
                   : absl::StatusOr<std::unique_ptr<TlsContext>>(nullptr));
}

absl::StatusOr<int> StartHttpServer(httplib::Server& server, const HttpServerOptions& options,
                                    const std::string& host, int port, std::thread* thread) {
  auto* guarded = dynamic_cast<GuardedServer*>(&server);
  if (guarded == nullptr) return absl::InvalidArgumentError("the server is not MakeHttpServer's");
  if (!guarded->is_valid()) return guarded->tls_status();
  if (absl::Status limits = options.limits.Validate(); !limits.ok()) return limits;
  if (options.idle_threads < 0) return absl::InvalidArgumentError("idle_threads: must be >= 0");
  const int bound = port == 0 ? server.bind_to_any_port(host.c_str())
                              : (server.bind_to_port(host.c_str(), port) ? port : -1);
  if (bound < 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port));
  guarded->RaiseBacklog();
  *thread = std::thread([&server] { server.listen_after_bind(); });
  return bound;
}

}  // namespace gradhub
