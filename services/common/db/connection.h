#pragma once

#include <libpq-fe.h>

#include <memory>
#include <string>
#include <string_view>

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
  // into the SQL). This is the only way user data reaches the database.
  absl::StatusOr<Result> Exec(std::string_view sql, absl::Span<const Param> params = {});

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
  PGconn* conn_;
};

}  // namespace gradhub::db
