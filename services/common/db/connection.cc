#include "services/common/db/connection.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "services/common/db/error.h"
#include "services/common/status_macros.h"

namespace gradhub::db {
namespace {

enum class Ready { kYes, kDeadline, kNetworkError };

// poll(2) on `fd` for `events` until `deadline`. With `read_error`, kNetworkError: the kernel
// has given up on the connection because the peer or the path is gone (its pending error, read
// and cleared here, is a timeout or an unreachable host), not because the server closed or
// reset it. Never during a connect: libpq reads the socket's error itself to see whether the
// connect succeeded, and a transient one cleared here would read as success.
Ready WaitReady(int fd, short events, absl::Time deadline, bool read_error) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    const int ms =
        deadline == absl::InfiniteFuture()
            ? -1
            : static_cast<int>(std::max<int64_t>(
                  0, absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)))));
    pollfd entry{fd, events, 0};
    const int ready = ::poll(&entry, 1, ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) return Ready::kDeadline;
    if (ready > 0 && read_error && (entry.revents & (POLLERR | POLLHUP)) != 0) {
      int error = 0;
      socklen_t length = sizeof(error);
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 &&
          (error == ETIMEDOUT || error == EHOSTUNREACH || error == ENETUNREACH ||
           error == EHOSTDOWN)) {
        return Ready::kNetworkError;
      }
    }
    return Ready::kYes;  // ready, or an error libpq will read and report itself
  }
}

// The TCP settings of both ends (ConnectionOptions::silence_timeout): keepalives once a second
// of idleness, and the connection dropped once anything sent, a keepalive included, has gone
// unanswered for the timeout. The server's are session settings, sent as startup options.
struct Keepalive {
  std::string idle = "1", interval = "1", count, user_timeout_ms;
};

Keepalive KeepaliveFor(absl::Duration silence_timeout) {
  Keepalive keepalive;
  keepalive.count = std::to_string(std::max<int64_t>(1, absl::ToInt64Seconds(silence_timeout)));
  keepalive.user_timeout_ms =
      std::to_string(std::max<int64_t>(1, absl::ToInt64Milliseconds(silence_timeout)));
  return keepalive;
}

std::string ServerOptions(const ConnectionOptions& options, const Keepalive& keepalive) {
  return absl::StrCat("-c statement_timeout=", absl::ToInt64Milliseconds(options.statement_timeout),
                      " -c tcp_keepalives_idle=", keepalive.idle,
                      " -c tcp_keepalives_interval=", keepalive.interval,
                      " -c tcp_keepalives_count=", keepalive.count,
                      " -c tcp_user_timeout=", keepalive.user_timeout_ms);
}

// The connect protocol of PQconnectStartParams: poll in the direction libpq asks for until it
// is done, failed, or `until` passes. Returns whether `until` passed first.
bool ConnectTimedOut(PGconn* conn, absl::Time until) {
  PostgresPollingStatusType step = PGRES_POLLING_WRITING;
  while (PQstatus(conn) != CONNECTION_BAD && step != PGRES_POLLING_OK &&
         step != PGRES_POLLING_FAILED) {
    const short events = step == PGRES_POLLING_READING ? POLLIN : POLLOUT;
    if (WaitReady(PQsocket(conn), events, until, /*read_error=*/false) == Ready::kDeadline) {
      return true;
    }
    step = PQconnectPoll(conn);
  }
  return false;
}

// libpq's multi-line messages as one line of the log.
std::string OneLine(const char* text) {
  std::string line = text == nullptr ? "" : text;
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  for (char& c : line) {
    if (c == '\n' || c == '\t') c = ' ';
  }
  return line;
}

// Whether libpq's connect failed because the kernel gave up on an unanswered one (its SYNs
// outlived TCP_USER_TIMEOUT, which is shorter than connect_timeout) or the host is unreachable,
// rather than being refused. libpq has read the socket's error itself, so this reads its
// message, which quotes strerror(3) of this process (the same locale).
bool ConnectFailedSilently(PGconn* conn) {
  if (conn == nullptr) return false;
  const std::string message = PQerrorMessage(conn);
  for (int error : {ETIMEDOUT, EHOSTUNREACH, ENETUNREACH}) {
    if (message.find(std::strerror(error)) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const ConnectionOptions& options,
                                                             absl::Time deadline) {
  const Keepalive keepalive = KeepaliveFor(options.silence_timeout);
  const std::string server_options = ServerOptions(options, keepalive);
  // expand_dbname lets `dbname` carry a whole URL; the later keywords override its settings.
  // libpq's own connect_timeout applies only to blocking connects; ours is `until` below.
  const char* keywords[] = {"dbname",           "application_name", "options",
                            "keepalives",       "keepalives_idle",  "keepalives_interval",
                            "keepalives_count", "tcp_user_timeout", nullptr};
  const char* values[] = {options.url.c_str(),
                          options.application_name.c_str(),
                          server_options.c_str(),
                          "1",
                          keepalive.idle.c_str(),
                          keepalive.interval.c_str(),
                          keepalive.count.c_str(),
                          keepalive.user_timeout_ms.c_str(),
                          nullptr};
  const absl::Time started = absl::Now();
  const absl::Time timeout_at = started + options.connect_timeout;
  const absl::Time until = std::min(deadline, timeout_at);
  PGconn* conn = PQconnectStartParams(keywords, values, /*expand_dbname=*/1);
  if (conn != nullptr && ConnectTimedOut(conn, until)) {
    const std::string where =
        absl::StrCat(PQhost(conn) ? PQhost(conn) : "?", ":", PQport(conn) ? PQport(conn) : "?");
    PQfinish(conn);
    if (until < timeout_at) return CallerDeadlineStatus("connect");
    return SilenceStatus(absl::StrCat("the database did not answer a connect within ",
                                      absl::FormatDuration(options.connect_timeout)),
                         absl::StrCat("connect to ", where, ": no answer within ",
                                      absl::FormatDuration(options.connect_timeout)));
  }
  if (conn == nullptr || PQstatus(conn) != CONNECTION_OK) {
    absl::Status status =
        ConnectFailedSilently(conn)
            ? SilenceStatus("the database did not answer a connect",
                            absl::StrCat("connect: ", OneLine(PQerrorMessage(conn))))
            : StatusFromConnection(conn, "connect");
    PQfinish(conn);
    return status;
  }
  // Server notices ("relation already exists, skipping") would go to stderr by default; they
  // are never actionable for a service.
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  // Sends go to libpq's buffer and out as the socket takes them (Await), never blocking.
  PQsetnonblocking(conn, 1);
  return std::unique_ptr<Connection>(new Connection(conn, options.silence_timeout));
}

Connection::~Connection() { PQfinish(conn_); }

absl::Status Connection::WaitFor(short events, std::string_view sql, absl::Time deadline) {
  switch (WaitReady(PQsocket(conn_), events, deadline, /*read_error=*/true)) {
    case Ready::kYes:
      return absl::OkStatus();
    case Ready::kDeadline:
      abandoned_ = true;  // its answer may still come, into a connection nobody reads
      return CallerDeadlineStatus(sql.substr(0, 80));
    case Ready::kNetworkError:
      break;
  }
  abandoned_ = true;
  silent_ = true;
  return SilenceStatus(
      absl::StrCat("the database stopped answering (nothing for ",
                   absl::FormatDuration(silence_timeout_), ")"),
      absl::StrCat("no answer for ", absl::FormatDuration(silence_timeout_),
                   " (the kernel dropped the connection) in: ", std::string(sql.substr(0, 80))));
}

absl::StatusOr<Result> Connection::Await(int sent, std::string_view sql, absl::Time deadline) {
  if (sent == 0) return StatusFromResult(nullptr, conn_, sql);
  // 1. Flush what libpq buffered; read meanwhile if the server talks (libpq's protocol).
  for (int flushed = PQflush(conn_); flushed != 0; flushed = PQflush(conn_)) {
    if (flushed < 0) return StatusFromResult(nullptr, conn_, sql);
    GRADHUB_RETURN_IF_ERROR(WaitFor(POLLIN | POLLOUT, sql, deadline));
    if (PQconsumeInput(conn_) == 0) return StatusFromResult(nullptr, conn_, sql);
  }
  // 2. Every result, reading whenever libpq needs more; the last one is the answer (a failed
  //    statement ends a script, so its error is the last).
  std::optional<Result> last;
  while (true) {
    while (PQisBusy(conn_)) {
      GRADHUB_RETURN_IF_ERROR(WaitFor(POLLIN, sql, deadline));
      if (PQconsumeInput(conn_) == 0) return StatusFromResult(nullptr, conn_, sql);
    }
    PGresult* next = PQgetResult(conn_);
    if (next == nullptr) break;
    last.emplace(next);
  }
  if (!last) return StatusFromResult(nullptr, conn_, sql);
  return std::move(*last);
}

absl::StatusOr<std::string> Connection::Prepared(const std::string& sql, int params,
                                                 absl::Time deadline) {
  if (params == 0) return std::string();
  if (auto found = prepared_.find(sql); found != prepared_.end()) return found->second;
  if (prepared_.size() >= kMaxPreparedStatements) return std::string();
  std::string name = absl::StrCat("gradhub_", prepared_.size() + 1);
  // Parameter types are inferred from the SQL, exactly as PQexecParams does with no types.
  GRADHUB_ASSIGN_OR_RETURN(Result prepared, Await(PQsendPrepare(conn_, name.c_str(), sql.c_str(),
                                                                params, /*paramTypes=*/nullptr),
                                                  sql, deadline));
  if (PQresultStatus(prepared.raw()) != PGRES_COMMAND_OK) {
    return StatusFromResult(prepared.raw(), conn_, sql);
  }
  prepared_.emplace(sql, name);
  return name;
}

absl::StatusOr<Result> Connection::Exec(std::string_view sql, absl::Span<const Param> params,
                                        absl::Time deadline) {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const Param& param : params) {
    if (param.holds_nul()) return NulParameterStatus(sql);
    values.push_back(param.c_str());
  }
  const std::string statement(sql);
  const int count = static_cast<int>(values.size());
  GRADHUB_ASSIGN_OR_RETURN(const std::string name, Prepared(statement, count, deadline));
  const int sent = name.empty()
                       ? PQsendQueryParams(conn_, statement.c_str(), count, /*paramTypes=*/nullptr,
                                           values.data(), /*paramLengths=*/nullptr,
                                           /*paramFormats=*/nullptr, /*resultFormat=text*/ 0)
                       : PQsendQueryPrepared(conn_, name.c_str(), count, values.data(),
                                             /*paramLengths=*/nullptr, /*paramFormats=*/nullptr,
                                             /*resultFormat=text*/ 0);
  GRADHUB_ASSIGN_OR_RETURN(Result result, Await(sent, sql, deadline));
  ExecStatusType status = PQresultStatus(result.raw());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    return StatusFromResult(result.raw(), conn_, sql);
  }
  return result;
}

absl::Status Connection::ExecScript(std::string_view sql) {
  std::string script(sql);
  GRADHUB_ASSIGN_OR_RETURN(Result result,
                           Await(PQsendQuery(conn_, script.c_str()), sql, absl::InfiniteFuture()));
  ExecStatusType status = PQresultStatus(result.raw());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    return StatusFromResult(result.raw(), conn_, sql);
  }
  return absl::OkStatus();
}

bool Connection::healthy() const { return !abandoned_ && PQstatus(conn_) == CONNECTION_OK; }

bool Connection::in_transaction() const {
  PGTransactionStatusType status = PQtransactionStatus(conn_);
  return status == PQTRANS_INTRANS || status == PQTRANS_INERROR || status == PQTRANS_ACTIVE;
}

}  // namespace gradhub::db
