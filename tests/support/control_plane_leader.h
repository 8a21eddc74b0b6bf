// Who leads the gradhub-api replicas of one database (services/api/leader_lease.h), as the
// control_plane_leader row says, for tests that kill or pause a replica by its role.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "services/common/db/connection.h"

namespace gradhub::testing {

struct ApiLeader {
  int64_t term = 0;
  // From the holder, "host:pid:random": compare with LocalCluster::ApiReplicaPid.
  pid_t pid = 0;
};

// A connection to the database at `url` for the reads below; nullptr and a test failure when
// it does not open.
std::unique_ptr<db::Connection> ConnectToDatabase(const std::string& url);

// The replica that holds an unexpired term, by the database's clock; nullopt if none (and a
// test failure if the read failed).
std::optional<ApiLeader> CurrentApiLeader(db::Connection& db);

// Polls every 20 ms until a term after `term` is held (0: any term); nullopt after `limit`.
std::optional<ApiLeader> AwaitApiTermAfter(db::Connection& db, int64_t term,
                                           std::chrono::seconds limit = std::chrono::seconds(30));

}  // namespace gradhub::testing
