// The bytes of one accepted HTTP connection, plain TCP or TLS, on a non-blocking socket: what
// the request stream of http_request_stream.h reads and writes. Each call does what it can at
// once and says when it would have to wait; the caller waits (WaitReady) with its own deadline,
// so that no limit depends on a socket option. Not thread-safe: one connection, one thread.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace gradhub {

class Transport {
 public:
  // What Read and Write return when they did nothing: wait for the socket to be readable
  // (kWantRead) or writable (kWantWrite), then call again; kFailed ends the connection.
  static constexpr ssize_t kFailed = -1;
  static constexpr ssize_t kWantRead = -2;
  static constexpr ssize_t kWantWrite = -3;

  explicit Transport(int fd) : fd_(fd) {}
  virtual ~Transport() = default;
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // Bytes > 0, 0 when the peer ended the connection, or one of the codes above.
  virtual ssize_t Read(char* data, size_t size) = 0;
  virtual ssize_t Write(const char* data, size_t size) = 0;
  // Ends the sending side: TLS close_notify (TLS only), then a TCP FIN. The socket stays open.
  virtual void EndWrites() = 0;

  int fd() const { return fd_; }

 private:
  const int fd_;
};

// Waits until `fd` has `events` (POLLIN, POLLOUT) or the peer hung up: true; false at
// `deadline` or on a poll error.
bool WaitReady(int fd, short events, absl::Time deadline);

// The numeric address and port of the socket's peer (`peer`) or its own end; an IPv4 peer of
// a dual-stack socket reads "10.0.0.1", not "::ffff:10.0.0.1". Empty and 0 when unknown.
void SocketAddress(int fd, bool peer, std::string* ip, int* port);

// `fd` made non-blocking; it stays the caller's to close.
std::unique_ptr<Transport> PlainTransport(int fd);

// A server's TLS certificate and key, loaded once; Accept is thread-safe.
class TlsContext {
 public:
  // INVALID_ARGUMENT naming the files when they do not load or do not match.
  static absl::StatusOr<std::unique_ptr<TlsContext>> Load(const std::string& cert_file,
                                                          const std::string& key_file);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // The server side of the handshake on `fd` (made non-blocking), done by `deadline`; nullptr
  // when it failed or took longer. `fd` stays the caller's to close.
  std::unique_ptr<Transport> Accept(int fd, absl::Time deadline) const;

 private:
  explicit TlsContext(SSL_CTX* ctx) : ctx_(ctx) {}
  SSL_CTX* ctx_;
};

}  // namespace gradhub
