#include "services/common/db/migrator.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "services/common/sha256.h"
#include "services/common/status_macros.h"

namespace gradhub::db {
namespace {

constexpr std::string_view kCreateTable = R"sql(
  CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY CHECK (version > 0),
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
  ))sql";

std::string Label(const Migration& migration) {
  return absl::StrFormat("%04d_%s", migration.version, migration.name);
}

struct Applied {
  std::string name;
  std::string checksum;
};

absl::StatusOr<std::map<int, Applied>> ReadApplied(Connection& connection) {
  GRADHUB_ASSIGN_OR_RETURN(
      Result rows, connection.Exec("SELECT version, name, checksum FROM schema_migrations"));
  std::map<int, Applied> applied;
  for (Row row : rows) {
    applied[row.Get<int32_t>("version")] = {row.Get<std::string>("name"),
                                            row.Get<std::string>("checksum")};
  }
  return applied;
}

// Holds the migration advisory lock for its lifetime.
class AdvisoryLock {
 public:
  static absl::StatusOr<AdvisoryLock> Take(Connection& connection, absl::Duration timeout) {
    GRADHUB_RETURN_IF_ERROR(connection
                                .Exec("SELECT set_config('lock_timeout', $1, false)",
                                      {absl::StrCat(absl::ToInt64Milliseconds(timeout), "ms")})
                                .status());
    GRADHUB_RETURN_IF_ERROR(
        connection.Exec("SELECT pg_advisory_lock($1)", {Migrator::kAdvisoryLockKey}).status());
    return AdvisoryLock(&connection);
  }
  AdvisoryLock(AdvisoryLock&& other) noexcept : connection_(other.connection_) {
    other.connection_ = nullptr;
  }
  ~AdvisoryLock() {
    if (connection_ != nullptr && connection_->healthy()) {
      connection_->Exec("SELECT pg_advisory_unlock($1)", {Migrator::kAdvisoryLockKey})
          .IgnoreError();
    }
  }

 private:
  explicit AdvisoryLock(Connection* connection) : connection_(connection) {}
  Connection* connection_;
};

}  // namespace

Migrator::Migrator(std::vector<Migration> migrations, absl::Duration lock_timeout)
    : migrations_(std::move(migrations)), lock_timeout_(lock_timeout) {
  std::sort(migrations_.begin(), migrations_.end(),
            [](const Migration& a, const Migration& b) { return a.version < b.version; });
}

absl::Status Migrator::Validate() const {
  for (size_t i = 0; i < migrations_.size(); ++i) {
    if (migrations_[i].version <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("migration ", Label(migrations_[i]), ": version must be positive"));
    }
    if (i > 0 && migrations_[i].version == migrations_[i - 1].version) {
      return absl::InvalidArgumentError(absl::StrCat("migrations ", Label(migrations_[i - 1]),
                                                     " and ", Label(migrations_[i]),
                                                     " share a version number"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<MigrationReport> Migrator::Apply(Connection& connection) const {
  GRADHUB_RETURN_IF_ERROR(Validate());
  GRADHUB_ASSIGN_OR_RETURN(AdvisoryLock lock, AdvisoryLock::Take(connection, lock_timeout_));
  GRADHUB_RETURN_IF_ERROR(connection.ExecScript(kCreateTable));
  GRADHUB_ASSIGN_OR_RETURN(auto applied, ReadApplied(connection));

  std::map<int, const Migration*> known;
  for (const Migration& migration : migrations_) known[migration.version] = &migration;
  for (const auto& [version, row] : applied) {
    auto it = known.find(version);
    if (it == known.end()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "database has migration %04d_%s, which this binary does not know: it was migrated by "
          "a newer gradhub",
          version, row.name));
    }
    if (Sha256Hex(it->second->sql) != row.checksum) {
      return absl::FailedPreconditionError(
          absl::StrCat("migration ", Label(*it->second),
                       " differs from the one applied to the database; applied migrations are "
                       "never edited, add a new one instead"));
    }
  }

  MigrationReport report;
  for (const Migration& migration : migrations_) {
    if (applied.count(migration.version) > 0) continue;
    absl::Status status = [&]() -> absl::Status {
      GRADHUB_RETURN_IF_ERROR(connection.ExecScript("BEGIN"));
      GRADHUB_RETURN_IF_ERROR(connection.ExecScript(migration.sql));
      GRADHUB_RETURN_IF_ERROR(
          connection
              .Exec("INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                    {migration.version, migration.name, Sha256Hex(migration.sql)})
              .status());
      return connection.ExecScript("COMMIT");
    }();
    if (!status.ok()) {
      if (connection.healthy()) connection.ExecScript("ROLLBACK").IgnoreError();
      return absl::Status(status.code(),
                          absl::StrCat("migration ", Label(migration),
                                       " failed and was rolled back: ", status.message()));
    }
    report.applied.push_back(migration.version);
  }
  report.current_version = migrations_.empty() ? 0 : migrations_.back().version;
  if (!applied.empty())
    report.current_version = std::max(report.current_version, applied.rbegin()->first);
  return report;
}

absl::Status Migrator::CheckUpToDate(Connection& connection) const {
  GRADHUB_ASSIGN_OR_RETURN(
      Result exists, connection.Exec("SELECT to_regclass('schema_migrations') IS NOT NULL AS ok"));
  if (!exists.row(0).Get<bool>("ok")) {
    return absl::FailedPreconditionError("database has no schema_migrations: not migrated");
  }
  GRADHUB_ASSIGN_OR_RETURN(auto applied, ReadApplied(connection));
  for (const Migration& migration : migrations_) {
    if (applied.count(migration.version) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("migration ", Label(migration), " is not applied"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Migrator::ApplyWith(ConnectionOptions options) const {
  options.statement_timeout = absl::ZeroDuration();
  GRADHUB_ASSIGN_OR_RETURN(std::unique_ptr<Connection> connection, Connection::Open(options));
  GRADHUB_ASSIGN_OR_RETURN(const MigrationReport report, Apply(*connection));
  if (report.applied.empty()) {
    return absl::StrCat("schema up to date at version ", report.current_version);
  }
  return absl::StrCat("applied migrations ", absl::StrJoin(report.applied, ", "),
                      "; schema at version ", report.current_version);
}

}  // namespace gradhub::db
