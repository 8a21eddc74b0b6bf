#include "tests/support/control_plane_leader.h"

#include <gtest/gtest.h>

#include <thread>

namespace gradhub::testing {

std::unique_ptr<db::Connection> ConnectToDatabase(const std::string& url) {
  db::ConnectionOptions options;
  options.url = url;
  auto opened = db::Connection::Open(options);
  EXPECT_TRUE(opened.ok()) << opened.status();
  return opened.ok() ? *std::move(opened) : nullptr;
}

std::optional<ApiLeader> CurrentApiLeader(db::Connection& db) {
  auto rows = db.Exec(
      "SELECT term, split_part(holder, ':', 2)::int AS pid FROM control_plane_leader"
      " WHERE expires_at > clock_timestamp()");
  EXPECT_TRUE(rows.ok()) << rows.status();
  if (!rows.ok() || rows->empty()) return std::nullopt;
  return ApiLeader{rows->row(0).Get<int64_t>("term"), rows->row(0).Get<int32_t>("pid")};
}

std::optional<ApiLeader> AwaitApiTermAfter(db::Connection& db, int64_t term,
                                           std::chrono::seconds limit) {
  for (const auto deadline = std::chrono::steady_clock::now() + limit;
       std::chrono::steady_clock::now() < deadline;) {
    if (auto leader = CurrentApiLeader(db); leader && leader->term > term) return leader;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

}  // namespace gradhub::testing
