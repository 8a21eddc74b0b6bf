#include "services/common/http_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gradhub {
namespace {

void MakeNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

class Plain final : public Transport {
 public:
  explicit Plain(int fd) : Transport(fd) {}

  ssize_t Read(char* data, size_t size) override {
    while (true) {
      const ssize_t n = ::recv(fd(), data, size, 0);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? kWantRead : kFailed;
    }
  }

  ssize_t Write(const char* data, size_t size) override {
    while (true) {
      // MSG_NOSIGNAL: a peer that went away is an error here, not a SIGPIPE for the process.
      const ssize_t n = ::send(fd(), data, size, MSG_NOSIGNAL);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK ? kWantWrite : kFailed;
    }
  }

  void EndWrites() override { ::shutdown(fd(), SHUT_WR); }
};

// What SSL_read, SSL_write or SSL_accept returning `result` means in Transport's codes.
ssize_t TlsOutcome(SSL* ssl, int result) {
  if (result > 0) return result;
  switch (SSL_get_error(ssl, result)) {
    case SSL_ERROR_WANT_READ:
      return Transport::kWantRead;
    case SSL_ERROR_WANT_WRITE:
      return Transport::kWantWrite;
    case SSL_ERROR_ZERO_RETURN:
      return 0;  // close_notify
    default:
      ERR_clear_error();  // the queue is per thread: leave nothing for the next connection
      return Transport::kFailed;
  }
}

class Tls final : public Transport {
 public:
  Tls(int fd, SSL* ssl) : Transport(fd), ssl_(ssl) {}
  ~Tls() override { SSL_free(ssl_); }

  ssize_t Read(char* data, size_t size) override {
    return TlsOutcome(ssl_,
                      SSL_read(ssl_, data, static_cast<int>(std::min<size_t>(size, INT_MAX))));
  }
  ssize_t Write(const char* data, size_t size) override {
    return TlsOutcome(ssl_,
                      SSL_write(ssl_, data, static_cast<int>(std::min<size_t>(size, INT_MAX))));
  }
  void EndWrites() override {
    (void)SSL_shutdown(ssl_);  // sends close_notify; the peer's answer is not awaited
    ERR_clear_error();
    ::shutdown(fd(), SHUT_WR);
  }

 private:
  SSL* const ssl_;
};

}  // namespace

bool WaitReady(int fd, short events, absl::Time deadline) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    pollfd entry{.fd = fd, .events = events, .revents = 0};
    const int ms = static_cast<int>(std::min<int64_t>(
        absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), INT_MAX));
    const int ready = ::poll(&entry, 1, ms);
    if (ready > 0) return true;  // the event, or POLLHUP/POLLERR: the next call says which
    if (ready < 0 && errno != EINTR) return false;
  }
}

void SocketAddress(int fd, bool peer, std::string* ip, int* port) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  auto* raw = reinterpret_cast<sockaddr*>(&address);
  char host[NI_MAXHOST] = "";
  char service[NI_MAXSERV] = "";
  const bool known = (peer ? getpeername(fd, raw, &length) : getsockname(fd, raw, &length)) == 0 &&
                     getnameinfo(raw, length, host, sizeof(host), service, sizeof(service),
                                 NI_NUMERICHOST | NI_NUMERICSERV) == 0;
  absl::string_view text = known ? host : "";
  absl::ConsumePrefix(&text, "::ffff:");
  *ip = std::string(text);
  *port = known ? std::atoi(service) : 0;
}

std::unique_ptr<Transport> PlainTransport(int fd) {
  MakeNonBlocking(fd);
  return std::make_unique<Plain>(fd);
}

absl::StatusOr<std::unique_ptr<TlsContext>> TlsContext::Load(const std::string& cert_file,
                                                             const std::string& key_file) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  const bool loaded = ctx != nullptr && SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) == 1 &&
                      SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) == 1 &&
                      SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) == 1 &&
                      SSL_CTX_check_private_key(ctx) == 1;
  ERR_clear_error();
  if (!loaded) {
    SSL_CTX_free(ctx);
    return absl::InvalidArgumentError(
        absl::StrCat("tls: cannot load the certificate '", cert_file, "' with the key '", key_file,
                     "' (both PEM files, the key matching the certificate)"));
  }
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  // Writes may end part-way (WriteAll goes on from there) and resume from another address.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  return std::unique_ptr<TlsContext>(new TlsContext(ctx));
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

std::unique_ptr<Transport> TlsContext::Accept(int fd, absl::Time deadline) const {
  MakeNonBlocking(fd);
  SSL* ssl = SSL_new(ctx_);
  if (ssl == nullptr || SSL_set_fd(ssl, fd) != 1) {
    SSL_free(ssl);
    ERR_clear_error();
    return nullptr;
  }
  auto transport = std::make_unique<Tls>(fd, ssl);  // frees ssl from here on
  while (true) {
    const ssize_t step = TlsOutcome(ssl, SSL_accept(ssl));
    if (step > 0) return transport;
    if (step != Transport::kWantRead && step != Transport::kWantWrite) return nullptr;
    if (!WaitReady(fd, step == Transport::kWantRead ? POLLIN : POLLOUT, deadline)) return nullptr;
  }
}

}  // namespace gradhub
