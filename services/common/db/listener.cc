#include "services/common/db/listener.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "services/common/db/error.h"
#include "services/common/status_macros.h"

namespace gradhub::db {
namespace {

constexpr size_t kMaxChannelLength = 63;  // PostgreSQL's NAMEDATALEN - 1

absl::Status CheckPayload(std::string_view payload) {
  if (payload.size() > kMaxNotifyPayloadBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload: ", payload.size(), " bytes, at most ", kMaxNotifyPayloadBytes));
  }
  return absl::OkStatus();
}

// The socket readable (or failed: libpq then reports it), or `wait` over.
bool Readable(int fd, absl::Duration wait) {
  pollfd entry{fd, POLLIN, 0};
  const int ms = static_cast<int>(absl::ToInt64Milliseconds(wait));
  const int ready = ::poll(&entry, 1, std::max(ms, 1));
  return ready > 0 || (ready < 0 && errno != EINTR);
}

}  // namespace

absl::Status CheckChannelName(std::string_view channel, std::string_view field) {
  if (channel.empty() || channel.size() > kMaxChannelLength) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(field), ": must be 1-", kMaxChannelLength, " characters"));
  }
  const bool allowed = std::all_of(channel.begin(), channel.end(), [](char c) {
    return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '_';
  });
  if (!allowed || absl::ascii_isdigit(channel.front())) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(field), ": only a-z, 0-9 and _, not starting with a digit"));
  }
  return absl::OkStatus();
}

absl::Status Notify(Transaction& tx, std::string_view channel, std::string_view payload) {
  GRADHUB_RETURN_IF_ERROR(CheckChannelName(channel));
  GRADHUB_RETURN_IF_ERROR(CheckPayload(payload));
  return tx.Exec("SELECT pg_notify($1, $2)", {channel, payload}).status();
}

absl::Status Notify(Pool& pool, std::string_view channel, std::string_view payload) {
  GRADHUB_RETURN_IF_ERROR(CheckChannelName(channel));
  GRADHUB_RETURN_IF_ERROR(CheckPayload(payload));
  return pool.Exec("SELECT pg_notify($1, $2)", {channel, payload}).status();
}

Listener::Listener(ListenerOptions options) : options_(std::move(options)) {}

Listener::~Listener() { Stop(); }

absl::Status Listener::CheckOptions() const {
  if (options_.channels.empty()) {
    return absl::InvalidArgumentError("channels: at least one is needed");
  }
  for (size_t i = 0; i < options_.channels.size(); ++i) {
    GRADHUB_RETURN_IF_ERROR(
        CheckChannelName(options_.channels[i], absl::StrCat("channels[", i, "]")));
  }
  if (!options_.on_notification) return absl::InvalidArgumentError("on_notification: required");
  if (options_.first_backoff <= absl::ZeroDuration() ||
      options_.max_backoff < options_.first_backoff) {
    return absl::InvalidArgumentError(
        "first_backoff, max_backoff: need 0 < first_backoff <= max_backoff");
  }
  if (options_.stop_check <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("stop_check: must be positive");
  }
  return absl::OkStatus();
}

absl::Status Listener::Start() {
  if (thread_.joinable()) return absl::FailedPreconditionError("Start: already started");
  GRADHUB_RETURN_IF_ERROR(CheckOptions());
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void Listener::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool Listener::WaitUntilListening(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_until(lock, absl::ToChronoTime(deadline),
                      [this] { return listening_ || stopping_; });
  return listening_;
}

void Listener::SetListening(bool listening) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    listening_ = listening;
  }
  changed_.notify_all();
}

bool Listener::Pause(absl::Duration pause) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_for(lock, absl::ToChronoNanoseconds(pause), [this] { return stopping_.load(); });
  return !stopping_;
}

void Listener::Run() {
  absl::Duration backoff = options_.first_backoff;
  bool connected_before = false;
  bool failing = false;  // logged since the last success (one line per outage)
  while (!stopping_) {
    absl::StatusOr<std::unique_ptr<Connection>> connection = ConnectAndListen();
    if (!connection.ok()) {
      if (!failing) std::cerr << "gradhub: listener: " << connection.status() << "\n";
      failing = true;
      if (!Pause(backoff)) break;
      backoff = std::min(backoff * 2, options_.max_backoff);
      continue;
    }
    if (failing) std::cerr << "gradhub: listener: listening again\n";
    failing = false;
    backoff = options_.first_backoff;
    SetListening(true);
    if (connected_before && options_.on_reconnected) options_.on_reconnected();
    connected_before = true;
    const absl::Status lost = Receive(**connection);
    SetListening(false);
    if (!lost.ok()) {
      std::cerr << "gradhub: listener: connection lost, reconnecting: " << lost << "\n";
      failing = true;
    }
  }
}

absl::StatusOr<std::unique_ptr<Connection>> Listener::ConnectAndListen() {
  GRADHUB_ASSIGN_OR_RETURN(std::unique_ptr<Connection> connection,
                           Connection::Open(options_.connection));
  // Checked names (CheckOptions) are the same identifier quoted or not; quoting keeps them so.
  std::string listen;
  for (const std::string& channel : options_.channels) {
    absl::StrAppend(&listen, "LISTEN \"", channel, "\";");
  }
  GRADHUB_RETURN_IF_ERROR(connection->ExecScript(listen));
  return connection;
}

absl::Status Listener::Receive(Connection& connection) {
  PGconn* conn = connection.raw();
  while (!stopping_) {
    // A failed connection has no socket (-1), which poll(2) ignores: nothing would end it.
    if (PQstatus(conn) == CONNECTION_BAD) return StatusFromConnection(conn, "listen");
    if (!Readable(PQsocket(conn), options_.stop_check)) continue;
    // Reads whatever came; 0 when the connection failed (closed, reset, or dropped by the
    // kernel as silent). A notification read with the failure is still delivered.
    const bool read = PQconsumeInput(conn) != 0;
    Deliver(conn);
    if (!read) return StatusFromConnection(conn, "listen");
  }
  return absl::OkStatus();
}

void Listener::Deliver(PGconn* conn) {
  while (PGnotify* notify = PQnotifies(conn)) {
    const std::string channel = notify->relname;
    const std::string payload = notify->extra == nullptr ? "" : notify->extra;
    PQfreemem(notify);
    options_.on_notification(channel, payload);
  }
}

}  // namespace gradhub::db
