// The database settings of every gradhub server (flags with environment fallbacks), and the
// connections made from them, so the three servers cannot drift in what they accept.
#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "services/common/db/connection.h"
#include "services/common/db/pool.h"
#include "services/common/flags.h"

namespace gradhub::db {

struct DatabaseSettings {
  std::string url = "postgresql://gradhub@127.0.0.1:5432/gradhub";
  absl::Duration connect_timeout = absl::Seconds(5);
  absl::Duration silence_timeout = absl::Seconds(2);
  absl::Duration migration_lock_timeout = absl::Seconds(60);
  int64_t connections = 8;

  // --database-url, --database-connect-timeout, --database-silence-timeout,
  // --database-connections (its variable, `connections_env`, is per server: they share one
  // database but not one pool size), and --migration-lock-timeout for a server that migrates.
  void Register(Flags& flags, const std::string& connections_env, bool migrates) {
    flags.String("database-url", "GRADHUB_DATABASE_URL", &url,
                 "PostgreSQL connection URL (libpq syntax); the api's database");
    flags.Duration("database-connect-timeout", "GRADHUB_DATABASE_CONNECT_TIMEOUT", &connect_timeout,
                   "Timeout for opening a database connection");
    flags.Duration("database-silence-timeout", "GRADHUB_DATABASE_SILENCE_TIMEOUT", &silence_timeout,
                   "How long an open database connection may go unanswered (TCP data or "
                   "keepalives) before it counts as dead and the database as unreachable");
    flags.Int("database-connections", connections_env, &connections,
              "Most connections the server keeps open to PostgreSQL");
    if (migrates) {
      flags.Duration("migration-lock-timeout", "GRADHUB_MIGRATION_LOCK_TIMEOUT",
                     &migration_lock_timeout,
                     "How long to wait for another migrator holding the migration lock");
    }
  }

  ConnectionOptions Connection(const std::string& application_name) const {
    ConnectionOptions options;
    options.url = url;
    options.connect_timeout = connect_timeout;
    options.silence_timeout = silence_timeout;
    options.application_name = application_name;
    return options;
  }

  PoolOptions Pool(const std::string& application_name) const {
    PoolOptions options;
    options.connection = Connection(application_name);
    options.max_connections = static_cast<int>(connections);
    return options;
  }
};

}  // namespace gradhub::db
