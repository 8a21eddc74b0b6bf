// One connection's bytes as cpp-httplib reads and writes them (an httplib::Stream), with the
// time and size limits httplib 0.11 lacks applied to every request, whatever its route:
//   1. BeginRequest(): the server starts to wait for a request; its line and headers must be
//      in within header_timeout (a slow client), else 408, or a silent close when not one byte
//      came (an idle keep-alive connection).
//   2. BeginBody(headers): the headers are in (httplib's setup_request hook, before any byte of
//      the body is read). The framing they announce bounds what may be read:
//        - neither Content-Length nor Transfer-Encoding: no body (RFC 9112 section 6.3), so
//          reads end at once instead of waiting for the connection to close;
//        - Content-Length: at most that many bytes are read as this request's;
//        - chunked: at most max_body_bytes plus kChunkFramingBytes on the wire.
//      A body must arrive within body_timeout plus 1 s for every body_min_rate bytes.
//   3. A request that breaks a limit of step 1 or 2 is answered here, at once, before httplib
//      reads further: 408 or 413 with the JSON error of http_errors.h and "Connection: close".
//      From then on every read fails and httplib's own writes are dropped (it answers the
//      failed read with a 400 of its own), and the server ends the connection after it.
// Writes wait at most kWriteTimeout for the peer to take each part (a stream to a client that
// stopped reading ends). Not thread-safe: the thread serving the connection uses it.
#pragma once

#include <httplib.h>

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "services/common/edge_limits.h"
#include "services/common/http_transport.h"

namespace gradhub {

// How a request's headers say its body ends (RFC 9112 section 6).
struct BodyFraming {
  enum class Kind { kNone, kLength, kChunked };
  Kind kind = Kind::kNone;
  uint64_t length = 0;  // kLength
};

// The framing of a request with these headers, or the error to refuse it with when httplib
// would read it otherwise than its sender meant (request smuggling): INVALID_ARGUMENT for a
// Content-Length that is not one decimal number, or for both Content-Length and
// Transfer-Encoding; UNIMPLEMENTED for a transfer coding other than "chunked" alone.
absl::StatusOr<BodyFraming> FramingOf(const httplib::Headers& headers);

// What one request may take (edge_limits.h; max_body_bytes from HttpServerOptions).
struct RequestLimits {
  absl::Duration header_timeout = absl::Seconds(10);
  absl::Duration body_timeout = absl::Seconds(10);
  int64_t body_min_rate = 8 << 10;
  uint64_t max_body_bytes = 4 << 20;
};

class RequestStream final : public httplib::Stream {
 public:
  // The wire bytes a chunked body may take beyond max_body_bytes, for its chunk framing.
  static constexpr uint64_t kChunkFramingBytes = 64 << 10;
  static constexpr absl::Duration kWriteTimeout = absl::Seconds(5);

  RequestStream(Transport& transport, const RequestLimits& limits)
      : transport_(transport), limits_(limits) {}

  // Step 1.
  void BeginRequest();
  // Step 2, with FramingOf the request's headers.
  void BeginBody(const BodyFraming& framing);
  // Answers the request now with `http_status` and `error` (step 3), unless a part of a
  // response was already written. Either way the request is over: reads fail, writes drop.
  void Refuse(int http_status, const absl::Status& error);

  // The connection ends after this request (it was refused from its headers, unread).
  void CloseAfterResponse() { close_after_response_ = true; }

  // Whether the connection can serve another request: nothing was refused and the body the
  // request announced was read to its end (none left that would be taken for a request).
  bool ReusableAfterRequest() const;
  bool refused() const { return refused_; }

  // httplib::Stream. is_writable is false once the peer closed its end (a stream's client that
  // went away), else waits up to kWriteTimeout for room.
  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return transport_.fd(); }

 private:
  enum class Phase { kHeaders, kBody };

  // Fills buffer_ from the transport, waiting until the phase's deadline; false when nothing
  // came (the peer ended, a failure, or the deadline, which step 3 answers).
  bool Fill();
  absl::Time ReadDeadline() const;
  void RefuseLate();
  // Writes all of [data, data+size) within kWriteTimeout; false on failure.
  bool WriteAll(const char* data, size_t size);
  // The bytes of this phase's body that read() may still hand out.
  uint64_t BodyBytesLeft() const;

  Transport& transport_;
  const RequestLimits limits_;
  Phase phase_ = Phase::kHeaders;
  BodyFraming framing_;
  absl::Time phase_start_ = absl::Now();
  uint64_t phase_bytes_ = 0;  // read by httplib in this phase
  uint64_t body_limit_ = 0;   // most bytes the body may take on the wire
  bool response_started_ = false;
  bool refused_ = false;
  bool close_after_response_ = false;
  // Bytes received and not yet read: httplib reads headers one byte at a time.
  std::array<char, 4096> buffer_{};
  size_t buffer_begin_ = 0, buffer_end_ = 0;
};

}  // namespace gradhub
