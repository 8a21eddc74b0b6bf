#include "services/common/db/connection.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "services/common/db/error.h"
#include "services/common/status_macros.h"

namespace gradhub::db {

absl::StatusOr<std::unique_ptr<Connection>> Connection::Open(const ConnectionOptions& options) {
  std::string timeout =
      std::to_string(std::max<int64_t>(1, absl::ToInt64Seconds(options.connect_timeout)));
  std::string server_options =
      absl::StrCat("-c statement_timeout=", absl::ToInt64Milliseconds(options.statement_timeout));
  // expand_dbname lets `dbname` carry a whole URL; the later keywords override its settings.
  const char* keywords[] = {"dbname", "connect_timeout", "application_name", "options", nullptr};
  const char* values[] = {options.url.c_str(), timeout.c_str(), options.application_name.c_str(),
                          server_options.c_str(), nullptr};
  PGconn* conn = PQconnectdbParams(keywords, values, /*expand_dbname=*/1);
  if (conn == nullptr || PQstatus(conn) != CONNECTION_OK) {
    absl::Status status = StatusFromConnection(conn, "connect");
    PQfinish(conn);
    return status;
  }
  // Server notices ("relation already exists, skipping") would go to stderr by default; they
  // are never actionable for a service.
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  return std::unique_ptr<Connection>(new Connection(conn));
}

Connection::~Connection() { PQfinish(conn_); }

absl::StatusOr<std::string> Connection::Prepared(const std::string& sql, int params) {
  if (params == 0) return std::string();
  if (auto found = prepared_.find(sql); found != prepared_.end()) return found->second;
  if (prepared_.size() >= kMaxPreparedStatements) return std::string();
  std::string name = absl::StrCat("gradhub_", prepared_.size() + 1);
  // Parameter types are inferred from the SQL, exactly as PQexecParams does with no types.
  Result prepared(PQprepare(conn_, name.c_str(), sql.c_str(), params, /*paramTypes=*/nullptr));
  if (!prepared.raw() || PQresultStatus(prepared.raw()) != PGRES_COMMAND_OK) {
    return StatusFromResult(prepared.raw(), conn_, sql);
  }
  prepared_.emplace(sql, name);
  return name;
}

absl::StatusOr<Result> Connection::Exec(std::string_view sql, absl::Span<const Param> params) {
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const Param& param : params) {
    if (param.holds_nul()) return NulParameterStatus(sql);
    values.push_back(param.c_str());
  }
  const std::string statement(sql);
  GRADHUB_ASSIGN_OR_RETURN(const std::string name,
                           Prepared(statement, static_cast<int>(values.size())));
  Result result(name.empty()
                    ? PQexecParams(conn_, statement.c_str(), static_cast<int>(values.size()),
                                   /*paramTypes=*/nullptr, values.data(),
                                   /*paramLengths=*/nullptr, /*paramFormats=*/nullptr,
                                   /*resultFormat=text*/ 0)
                    : PQexecPrepared(conn_, name.c_str(), static_cast<int>(values.size()),
                                     values.data(), /*paramLengths=*/nullptr,
                                     /*paramFormats=*/nullptr, /*resultFormat=text*/ 0));
  ExecStatusType status = result.raw() ? PQresultStatus(result.raw()) : PGRES_FATAL_ERROR;
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    return StatusFromResult(result.raw(), conn_, sql);
  }
  return result;
}

absl::Status Connection::ExecScript(std::string_view sql) {
  std::string script(sql);
  Result result(PQexec(conn_, script.c_str()));
  ExecStatusType status = result.raw() ? PQresultStatus(result.raw()) : PGRES_FATAL_ERROR;
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    return StatusFromResult(result.raw(), conn_, sql);
  }
  return absl::OkStatus();
}

bool Connection::healthy() const { return PQstatus(conn_) == CONNECTION_OK; }

bool Connection::in_transaction() const {
  PGTransactionStatusType status = PQtransactionStatus(conn_);
  return status == PQTRANS_INTRANS || status == PQTRANS_INERROR || status == PQTRANS_ACTIVE;
}

}  // namespace gradhub::db
