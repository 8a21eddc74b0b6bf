#pragma once

#include <libpq-fe.h>

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "services/common/db/param.h"
#include "services/common/db/result.h"

namespace gradhub::db {

struct ConnectionOptions {
  // libpq connection URL or key=value string, e.g. postgresql://user@host:5432/gradhub.
  std::string url;
  absl::Duration connect_timeout = absl::Seconds(5);
  std::string application_name = "gradhub";
  // Server-side limit per statement, so a stuck query cannot hold a pooled connection
  // forever; zero disables it.
  absl::Duration statement_timeout = absl::Seconds(30);
  // How long either end of an open connection may go unanswered before the kernel drops it:
  // data not acknowledged, keepalives (one a second when idle) not answered; also a connect
  // whose SYNs go unanswered, when that is shorter than connect_timeout. A database whose
  // packets are dropped never resets a connection, and without this a statement would wait
  // for TCP's own limit (15 minutes), the server's backend (holding its transaction's locks,
  // the scheduler's included) for its keepalive time (2 hours). A slow statement on a live
  // link is not cut: the kernel acknowledges while the server works.
  absl::Duration silence_timeout = absl::Seconds(2);
};

// One PostgreSQL session (RAII over PGconn). Not thread-safe: use one per thread, through Pool.
//
// Every wait for the server is bounded: a connect by connect_timeout, an open connection by
// silence_timeout, and a statement or connect also by the caller's `deadline`, if any. A
// silent database is reported as such (error.h IsSilence, and silent() here), so that the pool
// stops trying it (pool.h). The socket is non-blocking; libpq is only asked to go on once
// poll(2) says it can.
class Connection {
 public:
  // `deadline`: the caller's; reached first, the connect is DEADLINE_EXCEEDED (not silence).
  static absl::StatusOr<std::unique_ptr<Connection>> Open(
      const ConnectionOptions& options, absl::Time deadline = absl::InfiniteFuture());
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // One statement with $1..$n parameters (extended protocol: parameters are never spliced
  // into the SQL). This is the only way user data reaches the database. A statement with
  // parameters is prepared on its first use on this connection and only executed after that:
  // parsing and planning were 40% of PostgreSQL's CPU in a CreateJob. Statements without
  // parameters (BEGIN, COMMIT) are sent as they are. A text parameter holding a NUL is
  // INVALID_ARGUMENT, sent nowhere (error.h NulParameterStatus).
  // A statement past `deadline` is DEADLINE_EXCEEDED and the connection is abandoned (closed
  // when released): its answer may still come.
  absl::StatusOr<Result> Exec(std::string_view sql, absl::Span<const Param> params = {},
                              absl::Time deadline = absl::InfiniteFuture());

  // Past this many distinct statement texts (SQL assembled per request, such as list
  // filters), the rest run unprepared, so a connection's server memory stays bounded.
  static constexpr size_t kMaxPreparedStatements = 256;

  // A script of several statements without parameters (simple protocol). Only for SQL that
  // ships with the binary, such as migrations.
  absl::Status ExecScript(std::string_view sql);

  // False once the server connection is known to be gone, or was abandoned in the middle of a
  // statement; such a connection is discarded.
  bool healthy() const;
  // The server stayed silent on it (IsSilence): not only this connection is likely gone.
  bool silent() const { return silent_; }
  // Gone: silent, or closed or reset (a server restart). Not when abandoned at a deadline.
  bool lost() const { return silent_ || PQstatus(conn_) == CONNECTION_BAD; }
  // True inside BEGIN..COMMIT (idle, active or failed transaction).
  bool in_transaction() const;

  PGconn* raw() { return conn_; }

 private:
  Connection(PGconn* conn, absl::Duration silence_timeout)
      : conn_(conn), silence_timeout_(silence_timeout) {}
  // The prepared statement's name for `sql`, preparing it now if need be; "" = run unprepared.
  absl::StatusOr<std::string> Prepared(const std::string& sql, int params, absl::Time deadline);
  // After a PQsend* call that returned `sent`: flushes, waits for the whole answer and
  // returns its last result (as PQexec does), or why there is none.
  absl::StatusOr<Result> Await(int sent, std::string_view sql, absl::Time deadline);
  // Waits until the socket is ready for `events`: OK, or the silence / deadline status (the
  // connection is then abandoned).
  absl::Status WaitFor(short events, std::string_view sql, absl::Time deadline);

  PGconn* conn_;
  absl::Duration silence_timeout_;
  bool abandoned_ = false;
  bool silent_ = false;
  std::unordered_map<std::string, std::string> prepared_;  // SQL text -> statement name
};

}  // namespace gradhub::db
