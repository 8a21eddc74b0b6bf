// A real PostgreSQL server for integration tests: one per test binary, started on first use and
// shared by all its test cases; each case asks for its own fresh database, so cases stay
// independent without paying for a server start each.
#pragma once

#include <sys/types.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace gradhub::testing {

// Thread-compatible: Shared() may be called from any thread, the other methods need external
// synchronization. One instance per process; a forked child that calls Shared() gets its own
// server.
//
// The server is killed (SIGQUIT, immediate shutdown) when the thread that started it exits, so
// that a crashed or SIGKILLed binary leaves no server behind (PR_SET_PDEATHSIG follows the
// thread, not the process). Call Shared(), Start() and Restart() from the main thread, as gtest
// does, or from a thread that outlives the server.
class PostgresServer {
 public:
  // The binary's server, started on first call. When GRADHUB_TEST_DATABASE_URL is set (a libpq
  // URL of a database on a server we may create databases on), that server is used instead and
  // Restart()/Stop()/Start() are unavailable: external() == true. Throws std::runtime_error with
  // the command, its exit status and the tail of the server log when the server cannot start;
  // later calls rethrow the same error instead of trying again.
  static PostgresServer& Shared();

  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;
  // Stops the server and removes its directory (for an external server: drops the databases made
  // by CreateDatabase(), best effort).
  ~PostgresServer();

  // Creates an empty database with a unique name and returns a libpq URL for it
  // (postgresql://postgres:PASSWORD@127.0.0.1:PORT/NAME for our own server).
  std::string CreateDatabase();

  // Stops the server (fast shutdown) and starts it again on the same port and data directory,
  // returning when it accepts connections again. Used to test reconnects.
  void Restart();
  // Stop only / Start only, for tests that need the server down for a while. Both are no-ops
  // when the server already is in that state.
  void Stop();
  void Start();

  bool external() const { return external_; }
  int port() const { return port_; }
  // The postmaster's pid; 0 while stopped and for an external server.
  pid_t pid() const { return pid_; }

 private:
  // initdb and postgres refuse to run as root; as root we run them as this user instead.
  struct RunAs {
    bool drop = false;
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;
  };

  PostgresServer();
  bool Launch();
  void Kill();
  void Shutdown();
  void RunToCompletion(const std::vector<std::string>& command);
  pid_t Spawn(const std::vector<std::string>& command) const;
  std::runtime_error Failure(const std::vector<std::string>& command,
                             const std::string& what) const;
  std::string AdminUrl() const;

  pid_t owner_pid_;  // The process whose server this is; forked copies must not touch it.
  bool external_ = false;
  std::string external_url_;
  std::vector<std::string> external_databases_;  // To drop at exit.
  std::string bin_dir_;
  std::string dir_;  // Temp dir: data/, server.log and the Unix socket.
  std::string log_path_;
  // The superuser's password: the server takes scram-sha-256 only (no trust), as a deployment
  // must, because ranks of tenant code run on the same host and could reach its port.
  std::string password_;
  int log_fd_ = -1;
  RunAs run_as_;
  int port_ = 0;
  pid_t pid_ = 0;
  int databases_ = 0;
};

}  // namespace gradhub::testing
