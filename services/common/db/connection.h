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
};

// One PostgreSQL session (RAII over PGconn). Not thread-safe: use one per thread, through Pool.
class Connection {
 public:
  static absl::StatusOr<std::unique_ptr<Connection>> Open(const ConnectionOptions& options);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // One statement with $1..$n parameters (extended protocol: parameters are never spliced
  // into the SQL). This is the only way user data reaches the database. A statement with
  // parameters is prepared on its first use on this connection and only executed after that:
  // parsing and planning were 40% of PostgreSQL's CPU in a CreateJob. Statements without
  // parameters (BEGIN, COMMIT) are sent as they are. A text parameter holding a NUL is
  // INVALID_ARGUMENT, sent nowhere (error.h NulParameterStatus).
  absl::StatusOr<Result> Exec(std::string_view sql, absl::Span<const Param> params = {});

  // Past this many distinct statement texts (SQL assembled per request, such as list
  // filters), the rest run unprepared, so a connection's server memory stays bounded.
  static constexpr size_t kMaxPreparedStatements = 256;

  // A script of several statements without parameters (simple protocol). Only for SQL that
  // ships with the binary, such as migrations.
  absl::Status ExecScript(std::string_view sql);

  // False once the server connection is known to be gone; such a connection is discarded.
  bool healthy() const;
  // True inside BEGIN..COMMIT (idle, active or failed transaction).
  bool in_transaction() const;

  PGconn* raw() { return conn_; }

 private:
  explicit Connection(PGconn* conn) : conn_(conn) {}
  // The prepared statement's name for `sql`, preparing it now if need be; "" = run unprepared.
  absl::StatusOr<std::string> Prepared(const std::string& sql, int params);

  PGconn* conn_;
  std::unordered_map<std::string, std::string> prepared_;  // SQL text -> statement name
};

}  // namespace gradhub::db
