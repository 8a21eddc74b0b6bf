// A TCP client on loopback that writes HTTP by hand, for the tests of what a polite client never
// does: headers sent slowly or never finished, bodies that do not end, many connections from
// chosen source addresses (every 127.0.0.0/8 address is this host's on Linux, so the server
// tells "clients" apart by them). Header-only; blocking calls with timeouts; not thread-safe.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace gradhub::testing {

class RawHttpClient {
 public:
  RawHttpClient(int port, const std::string& source_ip = "127.0.0.1") {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in source{};
    source.sin_family = AF_INET;
    ::inet_pton(AF_INET, source_ip.c_str(), &source.sin_addr);
    sockaddr_in server{};
    server.sin_family = AF_INET;
    server.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &server.sin_addr);
    connected_ = fd_ >= 0 &&
                 ::bind(fd_, reinterpret_cast<sockaddr*>(&source), sizeof(source)) == 0 &&
                 ::connect(fd_, reinterpret_cast<sockaddr*>(&server), sizeof(server)) == 0;
  }
  ~RawHttpClient() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawHttpClient(const RawHttpClient&) = delete;
  RawHttpClient& operator=(const RawHttpClient&) = delete;

  bool connected() const { return connected_; }

  // All of `bytes`; false once the peer closed or reset.
  bool Send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      bytes.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Sends up to `total` body bytes (framed as chunks of 64 KiB when `chunked`, the last chunk
  // never sent) as fast as the peer takes them, and stops when a byte of an answer arrives, the
  // peer closes, or `timeout` passes. The body bytes sent.
  uint64_t SendBodyUntilAnswered(uint64_t total, bool chunked, absl::Duration timeout) {
    const std::string piece(64 << 10, 'x');
    const std::string frame = chunked ? absl::StrCat("10000\r\n", piece, "\r\n") : piece;
    const absl::Time deadline = absl::Now() + timeout;
    uint64_t sent = 0;
    size_t offset = 0;  // into `frame`
    while (sent < total && absl::Now() < deadline) {
      pollfd entry{.fd = fd_, .events = POLLIN | POLLOUT, .revents = 0};
      if (::poll(&entry, 1, 50) <= 0) continue;
      if (entry.revents & (POLLIN | POLLERR | POLLHUP)) break;
      const ssize_t n =
          ::send(fd_, frame.data() + offset, frame.size() - offset, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n <= 0) break;
      offset += static_cast<size_t>(n);
      if (offset == frame.size()) {
        offset = 0;
        sent += piece.size();
      }
    }
    return sent;
  }

  // What arrives until the peer closes (or resets) or `timeout` passes.
  std::string ReadUntilClosed(absl::Duration timeout) {
    return Read(timeout, [](const std::string&) { return false; });
  }
  // What arrives until a response's head (through its blank line) is in, or `timeout`.
  std::string ReadHead(absl::Duration timeout) {
    return Read(timeout,
                [](const std::string& in) { return in.find("\r\n\r\n") != std::string::npos; });
  }
  // The rest of a response with a Content-Length whose first bytes, through its head at least,
  // are `begun` (what ReadHead returned): the whole response, or what came by `timeout`.
  std::string ReadRestOfResponse(const std::string& begun, absl::Duration timeout) {
    const size_t end = begun.find("\r\n\r\n");
    const size_t field = begun.find("Content-Length: ");
    size_t length = 0;
    if (end == std::string::npos || field == std::string::npos ||
        !absl::SimpleAtoi(begun.substr(field + 16, begun.find("\r\n", field) - field - 16),
                          &length)) {
      return begun;
    }
    const size_t whole = end + 4 + length;
    return begun +
           Read(timeout, [&](const std::string& in) { return begun.size() + in.size() >= whole; });
  }
  // Whether the peer closed the connection (or reset it) within `timeout`, reading what came.
  bool ClosedWithin(absl::Duration timeout) {
    Read(timeout, [](const std::string&) { return false; });
    return closed_;
  }

  int fd() const { return fd_; }

 private:
  template <typename Done>
  std::string Read(absl::Duration timeout, Done done) {
    const absl::Time deadline = absl::Now() + timeout;
    std::string in;
    char buffer[16 << 10];
    while (!done(in)) {
      const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
      pollfd entry{.fd = fd_, .events = POLLIN, .revents = 0};
      if (left <= 0 || ::poll(&entry, 1, static_cast<int>(left)) <= 0) break;
      const ssize_t n = ::recv(fd_, buffer, sizeof(buffer), 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        closed_ = true;
        break;
      }
      in.append(buffer, static_cast<size_t>(n));
    }
    return in;
  }

  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
};

// The status of the response that `text` begins with ("HTTP/1.1 413 ..." is 413); -1 if none.
inline int StatusOf(const std::string& text) {
  int status = -1;
  if (text.rfind("HTTP/1.", 0) != 0 || text.size() < 12) return -1;
  return absl::SimpleAtoi(text.substr(9, 3), &status) ? status : -1;
}

}  // namespace gradhub::testing
