#include "services/common/http_request_stream.h"

#include <poll.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "services/common/http_errors.h"

namespace gradhub {
namespace {

// A request's line and headers, in all (httplib bounds each line, not their number).
constexpr uint64_t kMaxHeaderBytes = 64 << 10;
constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

const char* ReasonPhrase(int http_status) {
  switch (http_status) {
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 408:
      return "Request Timeout";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 501:
      return "Not Implemented";
    default:
      return "Error";
  }
}

}  // namespace

absl::StatusOr<BodyFraming> FramingOf(const httplib::Headers& headers) {
  const size_t lengths = headers.count("Content-Length");
  const size_t codings = headers.count("Transfer-Encoding");
  if (lengths > 0 && codings > 0) {
    return absl::InvalidArgumentError(
        "request: both Content-Length and Transfer-Encoding; send one of them");
  }
  if (codings > 0) {
    const auto coding = headers.find("Transfer-Encoding");
    if (codings > 1 ||
        !absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(coding->second), "chunked")) {
      return absl::UnimplementedError(
          "Transfer-Encoding: only \"chunked\" is accepted (no other transfer coding)");
    }
    return BodyFraming{.kind = BodyFraming::Kind::kChunked};
  }
  if (lengths == 0) return BodyFraming{};
  const auto length = headers.find("Content-Length");
  const absl::string_view digits = absl::StripAsciiWhitespace(length->second);
  uint64_t bytes = 0;
  if (lengths > 1 || digits.empty() || digits.size() > 19 ||
      !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(digits, &bytes)) {
    return absl::InvalidArgumentError("Content-Length: must be one decimal number of bytes");
  }
  return BodyFraming{.kind = BodyFraming::Kind::kLength, .length = bytes};
}

void RequestStream::BeginRequest() {
  phase_ = Phase::kHeaders;
  phase_start_ = absl::Now();
  phase_bytes_ = 0;
  framing_ = BodyFraming{};
  response_started_ = false;
}

void RequestStream::BeginBody(const BodyFraming& framing) {
  phase_ = Phase::kBody;
  phase_start_ = absl::Now();
  phase_bytes_ = 0;
  framing_ = framing;
  switch (framing.kind) {
    case BodyFraming::Kind::kNone:
      body_limit_ = 0;
      break;
    case BodyFraming::Kind::kLength:
      body_limit_ = framing.length;
      break;
    case BodyFraming::Kind::kChunked:
      body_limit_ = limits_.max_body_bytes > kUnlimited - kChunkFramingBytes
                        ? kUnlimited
                        : limits_.max_body_bytes + kChunkFramingBytes;
      break;
  }
}

uint64_t RequestStream::BodyBytesLeft() const {
  const uint64_t limit = phase_ == Phase::kHeaders ? kMaxHeaderBytes : body_limit_;
  return limit - std::min(limit, phase_bytes_);
}

bool RequestStream::ReusableAfterRequest() const {
  if (refused_ || close_after_response_) return false;
  if (phase_ != Phase::kBody) return true;
  return framing_.kind == BodyFraming::Kind::kNone ||
         (framing_.kind == BodyFraming::Kind::kLength && phase_bytes_ == framing_.length);
}

ssize_t RequestStream::read(char* ptr, size_t size) {
  if (refused_) return -1;
  const uint64_t left = BodyBytesLeft();
  if (left == 0) {
    if (phase_ == Phase::kHeaders) {
      Refuse(431, absl::InvalidArgumentError(
                      absl::StrCat("request headers: over ", kMaxHeaderBytes, " bytes in all")));
      return -1;
    }
    if (framing_.kind != BodyFraming::Kind::kChunked) return 0;  // the body's end
    Refuse(413, absl::ResourceExhaustedError(absl::StrCat("request body: over the ",
                                                          limits_.max_body_bytes, "-byte limit")));
    return -1;
  }
  if (buffer_begin_ == buffer_end_ && !Fill()) return -1;
  const size_t n =
      static_cast<size_t>(std::min<uint64_t>({size, buffer_end_ - buffer_begin_, left}));
  std::memcpy(ptr, buffer_.data() + buffer_begin_, n);
  buffer_begin_ += n;
  phase_bytes_ += n;
  return static_cast<ssize_t>(n);
}

bool RequestStream::Fill() {
  buffer_begin_ = buffer_end_ = 0;
  while (true) {
    const ssize_t n = transport_.Read(buffer_.data(), buffer_.size());
    if (n > 0) {
      buffer_end_ = static_cast<size_t>(n);
      return true;
    }
    if (n == 0 || n == Transport::kFailed) return false;
    const short event = n == Transport::kWantRead ? POLLIN : POLLOUT;
    if (!WaitReady(transport_.fd(), event, ReadDeadline())) {
      RefuseLate();
      return false;
    }
  }
}

absl::Time RequestStream::ReadDeadline() const {
  if (phase_ == Phase::kHeaders) return phase_start_ + limits_.header_timeout;
  return phase_start_ + limits_.body_timeout +
         absl::Seconds(static_cast<double>(phase_bytes_) / limits_.body_min_rate);
}

void RequestStream::RefuseLate() {
  if (phase_ == Phase::kHeaders && phase_bytes_ == 0) {
    refused_ = true;  // an idle connection: nothing to answer
    return;
  }
  Refuse(408, absl::DeadlineExceededError(
                  phase_ == Phase::kHeaders
                      ? absl::StrCat("request headers: not all in within ",
                                     absl::FormatDuration(limits_.header_timeout),
                                     " (--http-header-timeout)")
                      : absl::StrCat("request body: slower than ", limits_.body_min_rate,
                                     " bytes/s after ", absl::FormatDuration(limits_.body_timeout),
                                     " (--http-body-min-rate, --http-body-timeout)")));
}

void RequestStream::Refuse(int http_status, const absl::Status& error) {
  if (!refused_ && !response_started_) {
    const std::string body = HttpErrorJson(error, http_status) + "\n";
    const std::string head =
        absl::StrCat("HTTP/1.1 ", http_status, " ", ReasonPhrase(http_status),
                     "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                     "\r\nConnection: close\r\n\r\n");
    (void)(WriteAll(head.data(), head.size()) && WriteAll(body.data(), body.size()));
  }
  refused_ = true;
}

ssize_t RequestStream::write(const char* ptr, size_t size) {
  if (refused_) return -1;
  // httplib writes an interim "100 Continue" whole, before the body: a limit the body breaks
  // later can still be answered.
  const bool interim = absl::string_view(ptr, std::min<size_t>(size, 10)) == "HTTP/1.1 1";
  response_started_ = response_started_ || !interim;
  return WriteAll(ptr, size) ? static_cast<ssize_t>(size) : -1;
}

bool RequestStream::WriteAll(const char* data, size_t size) {
  const absl::Time deadline = absl::Now() + kWriteTimeout;
  while (size > 0) {
    const ssize_t n = transport_.Write(data, size);
    if (n > 0) {
      data += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n != Transport::kWantRead && n != Transport::kWantWrite) return false;
    const short event = n == Transport::kWantRead ? POLLIN : POLLOUT;
    if (!WaitReady(transport_.fd(), event, deadline)) return false;
  }
  return true;
}

bool RequestStream::is_readable() const {
  return !refused_ &&
         (buffer_begin_ != buffer_end_ || WaitReady(transport_.fd(), POLLIN, ReadDeadline()));
}

bool RequestStream::is_writable() const {
  // The peer closed its end (httplib's own streams answer the same): nobody reads what follows.
  pollfd peer{.fd = transport_.fd(), .events = POLLRDHUP, .revents = 0};
  const bool closed = ::poll(&peer, 1, 0) > 0 && (peer.revents & (POLLRDHUP | POLLHUP | POLLERR));
  return !refused_ && !closed && WaitReady(transport_.fd(), POLLOUT, absl::Now() + kWriteTimeout);
}

void RequestStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  SocketAddress(transport_.fd(), /*peer=*/true, &ip, &port);
}

void RequestStream::get_local_ip_and_port(std::string& ip, int& port) const {
  SocketAddress(transport_.fd(), /*peer=*/false, &ip, &port);
}

}  // namespace gradhub
