#pragma once

#include <string>

#include "absl/time/time.h"
#include "services/common/flags.h"

namespace gradhub::api {

// Every setting of gradhub-api, with its flag, environment variable and default.
struct ApiConfig {
  std::string database_url = "postgresql://gradhub@127.0.0.1:5432/gradhub";
  absl::Duration migration_lock_timeout = absl::Seconds(60);
  absl::Duration database_connect_timeout = absl::Seconds(5);

  void Register(Flags& flags) {
    flags.String("database-url", "GRADHUB_DATABASE_URL", &database_url,
                 "PostgreSQL connection URL (libpq syntax)");
    flags.Duration("migration-lock-timeout", "GRADHUB_MIGRATION_LOCK_TIMEOUT",
                   &migration_lock_timeout,
                   "How long to wait for another migrator holding the migration lock");
    flags.Duration("database-connect-timeout", "GRADHUB_DATABASE_CONNECT_TIMEOUT",
                   &database_connect_timeout, "Timeout for opening a database connection");
  }
};

}  // namespace gradhub::api
