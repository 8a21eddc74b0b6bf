#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "services/common/db/connection.h"

namespace gradhub::db {

// One forward-only schema change: migrations/NNNN_name.sql.
struct Migration {
  int version = 0;
  std::string name;
  std::string sql;
};

// The migrations under migrations/, compiled into the binary (library gradhub_migrations) so a
// deployed service needs no SQL files beside it.
const std::vector<Migration>& BuiltinMigrations();

struct MigrationReport {
  std::vector<int> applied;  // versions applied by this run, in order
  int current_version = 0;   // newest version in the database afterwards
};

// Brings a database to the newest schema.
//
// Protocol, safe with any number of migrators at once (several api replicas starting
// together):
//  1. Take a session-level advisory lock (kAdvisoryLockKey) on a dedicated connection;
//     concurrent migrators queue here, bounded by `lock_timeout`.
//  2. Create schema_migrations if missing, and read what is applied.
//  3. Refuse to go on if an applied migration's checksum differs from ours (someone edited a
//     shipped migration) or the database has versions we do not know (a newer binary ran).
//  4. Apply each missing migration in its own transaction together with its
//     schema_migrations row, so a failing migration leaves nothing behind.
//  5. Release the lock (also released by the server if this process dies).
class Migrator {
 public:
  // "gradhub.migrations" as a stable 63-bit number; any constant works, as long as all
  // migrators agree.
  static constexpr int64_t kAdvisoryLockKey = 0x67726164687562;

  explicit Migrator(std::vector<Migration> migrations = BuiltinMigrations(),
                    absl::Duration lock_timeout = absl::Seconds(60));

  absl::StatusOr<MigrationReport> Apply(Connection& connection) const;

  // Opens a connection of its own with `options` (without a statement timeout: a migration may
  // rewrite large tables), applies, and says what it did in one line: "schema up to date at
  // version N" or "applied migrations 4, 5; schema at version N". What servers run at start.
  absl::StatusOr<std::string> ApplyWith(ConnectionOptions options) const;

  // OK when every migration is applied (for /readyz); FAILED_PRECONDITION naming the first
  // missing one otherwise.
  absl::Status CheckUpToDate(Connection& connection) const;

 private:
  absl::Status Validate() const;

  std::vector<Migration> migrations_;
  absl::Duration lock_timeout_;
};

}  // namespace gradhub::db
