#include "services/common/http_server.h"

#include <httplib.h>

#include "absl/strings/str_cat.h"

namespace gradhub {

std::unique_ptr<httplib::Server> MakeHttpServer(const HttpServerOptions& options) {
  std::unique_ptr<httplib::Server> server;
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    server = std::make_unique<httplib::SSLServer>(options.tls_cert_file.c_str(),
                                                  options.tls_key_file.c_str());
  } else {
    server = std::make_unique<httplib::Server>();
  }
  server->set_payload_max_length(options.max_body_bytes);
  const int threads = options.max_concurrent_requests;
  server->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  return server;
}

absl::StatusOr<int> StartHttpServer(httplib::Server& server, const HttpServerOptions& options,
                                    const std::string& host, int port, std::thread* thread) {
  if (!server.is_valid()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls: cannot load the certificate '", options.tls_cert_file, "' with the key '",
        options.tls_key_file, "' (both PEM files, the key matching the certificate)"));
  }
  const int bound = port == 0 ? server.bind_to_any_port(host.c_str())
                              : (server.bind_to_port(host.c_str(), port) ? port : -1);
  if (bound < 0) return absl::UnavailableError(absl::StrCat("cannot listen on ", host, ":", port));
  *thread = std::thread([&server] { server.listen_after_bind(); });
  return bound;
}

}  // namespace gradhub
