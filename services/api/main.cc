// gradhub-api: the job API. Subcommands:
//   migrate   bring the database schema up to date and exit
#include <cstdio>
#include <iostream>

#include "absl/strings/str_join.h"
#include "services/api/config.h"
#include "services/common/db/connection.h"
#include "services/common/db/migrator.h"

namespace {

constexpr char kSummary[] =
    "gradhub-api: the gradhub job API.\n\n"
    "Usage: gradhub-api [flags] COMMAND\n\n"
    "Commands:\n"
    "  migrate   apply the schema migrations compiled into this binary, then exit";

int Migrate(const gradhub::api::ApiConfig& config) {
  gradhub::db::ConnectionOptions options;
  options.url = config.database_url;
  options.connect_timeout = config.database_connect_timeout;
  options.application_name = "gradhub-api migrate";
  options.statement_timeout = absl::ZeroDuration();  // a migration may rewrite large tables
  auto connection = gradhub::db::Connection::Open(options);
  if (!connection.ok()) {
    std::cerr << "gradhub-api migrate: " << connection.status().message() << "\n";
    return 1;
  }
  gradhub::db::Migrator migrator(gradhub::db::BuiltinMigrations(), config.migration_lock_timeout);
  auto report = migrator.Apply(**connection);
  if (!report.ok()) {
    std::cerr << "gradhub-api migrate: " << report.status().message() << "\n";
    return 1;
  }
  if (report->applied.empty()) {
    std::cout << "schema up to date at version " << report->current_version << "\n";
  } else {
    std::cout << "applied migrations " << absl::StrJoin(report->applied, ", ")
              << "; schema at version " << report->current_version << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gradhub::api::ApiConfig config;
  gradhub::Flags flags("gradhub-api", kSummary);
  config.Register(flags);
  auto parsed = flags.Parse(argc, argv);
  if (!parsed.ok()) {
    std::cerr << "gradhub-api: " << parsed.status().message() << "\n";
    return 2;
  }
  if (parsed->help) {
    std::cout << flags.Usage();
    return 0;
  }
  if (parsed->positional.size() == 1 && parsed->positional[0] == "migrate") {
    return Migrate(config);
  }
  std::cerr << flags.Usage();
  return 2;
}
