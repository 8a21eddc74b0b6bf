#include "tests/support/postgres_server.h"

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

namespace gradhub::testing {
namespace {

namespace fs = std::filesystem;
using Connection = std::unique_ptr<PGconn, decltype(&PQfinish)>;

Connection Connect(const std::string& url) {
  Connection connection(PQconnectdb(url.c_str()), &PQfinish);
  EXPECT_EQ(PQstatus(connection.get()), CONNECTION_OK) << PQerrorMessage(connection.get());
  return connection;
}

// Runs `sql` and returns the first cell of its result ("" when there is none); an error fails the
// test and returns "<error>".
std::string Query(PGconn* connection, const std::string& sql) {
  std::unique_ptr<PGresult, decltype(&PQclear)> result(PQexec(connection, sql.c_str()), &PQclear);
  const ExecStatusType status = PQresultStatus(result.get());
  if (status != PGRES_TUPLES_OK && status != PGRES_COMMAND_OK) {
    ADD_FAILURE() << sql << ": " << PQerrorMessage(connection);
    return "<error>";
  }
  return PQntuples(result.get()) > 0 ? PQgetvalue(result.get(), 0, 0) : "";
}

std::string UrlForPort(int port) {
  return "postgresql://postgres@127.0.0.1:" + std::to_string(port) + "/postgres";
}

// Alive and not a zombie: a postmaster orphaned by its test binary is reparented to a process
// that may never reap it.
bool ProcessAlive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm, state;
  if (!(stat >> pid_field >> comm >> state)) return false;
  return state != "Z" && state != "X";
}

std::string TempRoot() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

// The directories a server of process `pid` lives in.
int DirectoriesOf(pid_t pid) {
  const std::string prefix = "gradhub-pg-" + std::to_string(pid) + "-";
  int count = 0;
  for (const auto& entry : fs::directory_iterator(TempRoot()))
    count += entry.path().filename().string().rfind(prefix, 0) == 0;
  return count;
}

struct ChildServer {
  pid_t child = 0;
  pid_t postmaster = 0;
  int port = 0;
};

// Forks a child that starts its own server through Shared() and reports it, then either waits to
// be killed (`exit_normally` false) or exits through exit(), running the static destructors.
// The child is reaped before this returns.
ChildServer RunServerInChild(bool exit_normally) {
  int pipe_fds[2];
  EXPECT_EQ(pipe(pipe_fds), 0);
  fflush(nullptr);  // Or the child's exit() writes our buffered output a second time.
  ChildServer server;
  server.child = fork();
  if (server.child == 0) {
    close(pipe_fds[0]);
    ChildServer report;
    try {
      PostgresServer& shared = PostgresServer::Shared();
      report = {getpid(), shared.pid(), shared.port()};
    } catch (const std::exception& e) {
      fprintf(stderr, "child: %s\n", e.what());
    }
    (void)!write(pipe_fds[1], &report, sizeof(report));
    if (exit_normally) exit(0);
    for (;;) pause();
  }
  close(pipe_fds[1]);
  ChildServer report;
  // EOF (the child died before reporting) leaves the report empty; the postgres servers do not
  // hold the pipe open, they close every inherited descriptor.
  EXPECT_EQ(read(pipe_fds[0], &report, sizeof(report)), static_cast<ssize_t>(sizeof(report)));
  close(pipe_fds[0]);
  if (!exit_normally) kill(server.child, SIGKILL);
  int status = 0;
  waitpid(server.child, &status, 0);
  server.postmaster = report.postmaster;
  server.port = report.port;
  return server;
}

TEST(PostgresServerTest, DatabasesAreSeparate) {
  PostgresServer& server = PostgresServer::Shared();
  const std::string first = server.CreateDatabase();
  const std::string second = server.CreateDatabase();
  EXPECT_NE(first, second);
  Connection a = Connect(first);
  Connection b = Connect(second);
  EXPECT_NE(Query(a.get(), "SELECT current_database()"),
            Query(b.get(), "SELECT current_database()"));
  Query(a.get(), "CREATE TABLE only_in_first (x int)");
  const std::string count = "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_first'";
  EXPECT_EQ(Query(a.get(), count), "1");
  EXPECT_EQ(Query(b.get(), count), "0");
}

TEST(PostgresServerTest, RestartKeepsTheData) {
  PostgresServer& server = PostgresServer::Shared();
  if (server.external()) GTEST_SKIP() << "external server";
  const std::string url = server.CreateDatabase();
  Connection before = Connect(url);
  Query(before.get(), "CREATE TABLE kept (x int)");
  Query(before.get(), "INSERT INTO kept VALUES (42)");
  const pid_t old_pid = server.pid();
  const int old_port = server.port();

  server.Restart();

  EXPECT_NE(server.pid(), old_pid);
  EXPECT_EQ(server.port(), old_port);
  // The old session died with the old server...
  PQclear(PQexec(before.get(), "SELECT 1"));
  EXPECT_EQ(PQstatus(before.get()), CONNECTION_BAD);
  // ...and a new one finds the data.
  Connection after = Connect(url);
  EXPECT_EQ(Query(after.get(), "SELECT x FROM kept"), "42");
}

TEST(PostgresServerTest, StopAndStart) {
  PostgresServer& server = PostgresServer::Shared();
  if (server.external()) GTEST_SKIP() << "external server";
  const std::string url = server.CreateDatabase();

  server.Stop();
  EXPECT_EQ(server.pid(), 0);
  EXPECT_EQ(PQping(url.c_str()), PQPING_NO_RESPONSE);
  server.Stop();  // Already down: nothing to do.

  server.Start();
  EXPECT_EQ(PQping(url.c_str()), PQPING_OK);
  Connection connection = Connect(url);
  EXPECT_EQ(Query(connection.get(), "SELECT 1"), "1");
}

TEST(PostgresServerTest, ServerDiesWithAKilledBinary) {
  if (PostgresServer::Shared().external()) GTEST_SKIP() << "external server";
  // The orphaned postmaster is reparented to us instead of to init: we can reap it, which proves
  // it exited, and leave no zombie where init does not reap (containers).
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  const ChildServer server = RunServerInChild(/*exit_normally=*/false);
  ASSERT_GT(server.postmaster, 0) << "the child could not start its server";
  ASSERT_NE(server.port, PostgresServer::Shared().port());

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool gone = false;
  while (!gone && std::chrono::steady_clock::now() < deadline) {
    const bool exited = waitpid(server.postmaster, nullptr, WNOHANG) == server.postmaster ||
                        !ProcessAlive(server.postmaster);
    gone = exited && PQping(UrlForPort(server.port).c_str()) == PQPING_NO_RESPONSE;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  prctl(PR_SET_CHILD_SUBREAPER, 0);
  EXPECT_TRUE(gone) << "postmaster " << server.postmaster << " on port " << server.port
                    << " outlived its SIGKILLed binary";
}

TEST(PostgresServerTest, NormalExitAndNextStartCleanUp) {
  if (PostgresServer::Shared().external()) GTEST_SKIP() << "external server";
  // What a crashed binary leaves: a directory named after a pid that no longer runs.
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  waitpid(dead, nullptr, 0);
  const fs::path stale = TempRoot() + "/gradhub-pg-" + std::to_string(dead) + "-leftover";
  fs::create_directories(stale / "data");
  // Ours is alive, so its directory stays.
  ASSERT_EQ(DirectoriesOf(getpid()), 1);

  const ChildServer server = RunServerInChild(/*exit_normally=*/true);
  ASSERT_GT(server.postmaster, 0) << "the child could not start its server";

  EXPECT_FALSE(fs::exists(stale)) << "the child's startup should remove " << stale;
  EXPECT_EQ(DirectoriesOf(getpid()), 1);
  // exit() ran the destructor: server stopped (and reaped) and its directory removed.
  EXPECT_FALSE(ProcessAlive(server.postmaster));
  EXPECT_EQ(PQping(UrlForPort(server.port).c_str()), PQPING_NO_RESPONSE);
  EXPECT_EQ(DirectoriesOf(server.child), 0);
}

}  // namespace
}  // namespace gradhub::testing
