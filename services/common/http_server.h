// The cpp-httplib listener under every gradhub REST server: HTTPS when a certificate and key are
// given, a bounded pool of request threads, a port bound before serving (0 = a free one), the
// serving loop on a thread of the caller's. The servers keep their routes and their Stop().
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace httplib {
class Server;
}

namespace gradhub {

struct HttpServerOptions {
  // Both set = HTTPS only (PEM files).
  std::string tls_cert_file;
  std::string tls_key_file;
  // Larger request bodies are refused with 413 before they are parsed.
  size_t max_body_bytes = 4 << 20;
  // Requests served at once; a streaming response holds one for its whole life.
  int max_concurrent_requests = 64;
};

std::unique_ptr<httplib::Server> MakeHttpServer(const HttpServerOptions& options);

// Binds host:port and starts `server`'s loop on *thread. Returns the bound port. The socket
// listens from the bind on, so requests queue in its backlog until the loop runs.
// INVALID_ARGUMENT for TLS files that did not load, UNAVAILABLE for a port that is taken.
absl::StatusOr<int> StartHttpServer(httplib::Server& server, const HttpServerOptions& options,
                                    const std::string& host, int port, std::thread* thread);

}  // namespace gradhub
