// What the db integration tests share: a fresh database per test on the binary's server.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "services/common/db/connection.h"
#include "services/common/db/migrator.h"
#include "services/common/db/pool.h"
#include "tests/support/postgres_server.h"

namespace gradhub::db {

class DatabaseTest : public ::testing::Test {
 protected:
  void SetUp() override { url_ = testing::PostgresServer::Shared().CreateDatabase(); }

  std::unique_ptr<Connection> Connect() {
    ConnectionOptions options;
    options.url = url_;
    auto connection = Connection::Open(options);
    EXPECT_TRUE(connection.ok()) << connection.status();
    return connection.ok() ? *std::move(connection) : nullptr;
  }

  std::unique_ptr<Pool> MakePool(int max_connections = 4) {
    PoolOptions options;
    options.connection.url = url_;
    options.max_connections = max_connections;
    return std::make_unique<Pool>(options);
  }

  // Applies the shipped migrations.
  void Migrate() {
    auto connection = Connect();
    auto report = Migrator().Apply(*connection);
    ASSERT_TRUE(report.ok()) << report.status();
  }

  std::string url_;
};

}  // namespace gradhub::db
