// The cpp-httplib listener under every gradhub REST server (the api's gateway, the checkpoint
// store, the metrics service): HTTPS when a certificate and key are given, a port bound before
// serving (0 = a free one), the serving loop on a thread of the caller's. The servers keep their
// routes and their Stop().
//
// It serves hostile clients too (edge_limits.h). Each connection goes through:
//   1. Admission, on the accepting thread, before any other thread serves it: at most
//      limits.max_connections_per_client from one address (beyond, 429 and closed) and
//      limits.max_connections in all (beyond, the one idle longest is closed to make room,
//      else the new one is refused): http_connection_limits.h. So a slow or greedy client
//      cannot make the probes wait for a thread.
//   2. A thread of its own (connection_threads.h) for as long as it lives.
//   3. For each request (http_request_stream.h): its headers within limits.header_timeout;
//      then, before a byte of the body is read, the request is refused from its headers alone
//      when it announces a body that is over max_body_bytes (413), framed ambiguously (400,
//      501), compressed (415), or not accepted by admit_body (e.g. 401 without a valid token);
//      then the body is read within its time and size limits, whatever its framing
//      (Content-Length, chunked, none). A refused request is answered and its connection ends.
// Handlers see requests as httplib gives them; they never run for a refused one.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "services/common/edge_limits.h"

namespace httplib {
class Server;
struct Request;
}  // namespace httplib

namespace gradhub {

struct HttpServerOptions {
  // Both set = HTTPS only (PEM files).
  std::string tls_cert_file;
  std::string tls_key_file;
  // Larger request bodies are refused with 413 before a byte of them is read (a chunked one once
  // it passes the limit).
  size_t max_body_bytes = 4 << 20;
  // Connections, header and body times (edge_limits.h; from the server's flags).
  HttpLimits limits;
  // Threads kept, once their connection ended, for the next ones.
  int idle_threads = 16;
  // Step 3: called with the headers of each request that announces a body, before a byte of it
  // is read; a non-OK status is the answer (the HTTP status of its code, the JSON error), the
  // body is not read and the connection ends. Called on the connection's thread, so it must be
  // thread-safe. Empty = every body within the limits is read.
  std::function<absl::Status(const httplib::Request&)> admit_body;
};

std::unique_ptr<httplib::Server> MakeHttpServer(const HttpServerOptions& options);

// Binds host:port and starts `server`'s loop on *thread. Returns the bound port. The socket
// listens from the bind on, so requests queue in its backlog until the loop runs.
// INVALID_ARGUMENT for TLS files that did not load or a limit out of range (naming its flag),
// UNAVAILABLE for a port that is taken. `server` must come from MakeHttpServer(options).
absl::StatusOr<int> StartHttpServer(httplib::Server& server, const HttpServerOptions& options,
                                    const std::string& host, int port, std::thread* thread);

}  // namespace gradhub
