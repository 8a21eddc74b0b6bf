#include "tests/support/postgres_server.h"

#include "tests/support/ports.h"

#include <fcntl.h>
#include <grp.h>
#include <libpq-fe.h>
#include <pwd.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace gradhub::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr auto kStartTimeout = std::chrono::seconds(30);
constexpr auto kStopTimeout = std::chrono::seconds(30);
constexpr auto kInitdbTimeout = std::chrono::seconds(120);
constexpr auto kPollInterval = std::chrono::milliseconds(20);
constexpr int kPortAttempts = 5;
constexpr char kDirPrefix[] = "gradhub-pg-";
constexpr int kLogTailLines = 30;

std::runtime_error Error(const std::string& what) {
  return std::runtime_error("PostgresServer: " + what);
}

std::runtime_error ErrnoError(const std::string& what) {
  return Error(what + ": " + strerror(errno));
}

std::string TempRoot() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

std::string Join(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& word : words) out += (out.empty() ? "" : " ") + word;
  return out;
}

std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "was killed by signal " + std::to_string(WTERMSIG(status));
  return "ended with wait status " + std::to_string(status);
}

// The last lines of `path` from byte `from` on.
std::string Tail(const std::string& path, std::streamoff from = 0) {
  std::ifstream in(path);
  in.seekg(from);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::string out;
  for (size_t i = lines.size() > kLogTailLines ? lines.size() - kLogTailLines : 0; i < lines.size();
       ++i)
    out += lines[i] + "\n";
  return out;
}

// Waits for our child `pid` until `deadline`; returns its wait status, or nullopt on timeout.
std::optional<int> WaitFor(pid_t pid, Clock::time_point deadline) {
  for (;;) {
    int status = 0;
    const pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) return status;
    if (done < 0 && errno != EINTR) return 0;  // Not (or no longer) our child: nothing to wait for.
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(kPollInterval);
  }
}

bool HasPostgres(const std::string& dir) { return access((dir + "/postgres").c_str(), X_OK) == 0; }

// The server programs are usually not on PATH (Debian keeps them in /usr/lib/postgresql/N/bin):
// $GRADHUB_PG_BINDIR, else `pg_config --bindir`, else the newest Debian server package.
std::string FindBinDir() {
  if (const char* env = std::getenv("GRADHUB_PG_BINDIR"); env != nullptr && *env != '\0')
    return env;
  int out[2];
  if (pipe2(out, O_CLOEXEC) == 0) {
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(out[1], STDOUT_FILENO);
      execlp("pg_config", "pg_config", "--bindir", static_cast<char*>(nullptr));
      _exit(127);
    }
    close(out[1]);
    std::string dir;
    char buf[512];
    for (ssize_t n; (n = read(out[0], buf, sizeof(buf))) > 0;) dir.append(buf, n);
    close(out[0]);
    if (pid > 0) waitpid(pid, nullptr, 0);
    while (!dir.empty() && isspace(static_cast<unsigned char>(dir.back()))) dir.pop_back();
    if (HasPostgres(dir)) return dir;
  }
  std::string best;
  int best_major = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    const int major = std::atoi(entry.path().filename().c_str());
    const std::string dir = entry.path() / "bin";
    if (major > best_major && HasPostgres(dir)) {
      best = dir;
      best_major = major;
    }
  }
  if (best.empty()) throw Error("no PostgreSQL server programs (set GRADHUB_PG_BINDIR)");
  return best;
}

// A binary that crashed or was SIGKILLed never ran its cleanup; its server died with it
// (PR_SET_PDEATHSIG) but its directory remains. Remove those whose owner is gone.
void RemoveStaleDirectories(const std::string& root) {
  std::vector<fs::path> stale;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename();
    if (name.rfind(kDirPrefix, 0) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(name.c_str() + strlen(kDirPrefix), &end, 10);
    if (pid <= 0 || *end != '-') continue;
    if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) stale.push_back(entry.path());
  }
  for (const auto& path : stale) fs::remove_all(path, ec);  // Best effort.
}

// The same server and credentials as `url`, another database. In a URL the database is the path.
std::string WithDatabase(const std::string& url, const std::string& database) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return url + " dbname=" + database;  // key=value: last wins.
  const size_t authority_end = url.find_first_of("/?", scheme + 3);
  if (authority_end == std::string::npos) return url + "/" + database;
  const size_t query = url.find('?', authority_end);
  return url.substr(0, authority_end) + "/" + database +
         (query == std::string::npos ? "" : url.substr(query));
}

using Connection = std::unique_ptr<PGconn, decltype(&PQfinish)>;

// `bytes` random bytes as lowercase hex, from the kernel's generator.
std::string RandomHex(int bytes) {
  std::random_device device;
  std::string text;
  for (int i = 0; i < bytes; ++i) {
    char digits[3];
    snprintf(digits, sizeof(digits), "%02x", static_cast<unsigned>(device() & 0xff));
    text += digits;
  }
  return text;
}

Connection Connect(const std::string& url) {
  Connection connection(PQconnectdb(url.c_str()), &PQfinish);
  if (PQstatus(connection.get()) != CONNECTION_OK)
    throw Error(std::string("cannot connect: ") + PQerrorMessage(connection.get()));
  return connection;
}

// Database names are ours, not user data; quoting them as identifiers is all they need.
std::string QuoteIdentifier(PGconn* connection, const std::string& name) {
  char* quoted = PQescapeIdentifier(connection, name.c_str(), name.size());
  std::string out = quoted != nullptr ? quoted : "\"" + name + "\"";
  PQfreemem(quoted);
  return out;
}

}  // namespace

PostgresServer& PostgresServer::Shared() {
  static std::mutex mu;
  static std::unique_ptr<PostgresServer> server;  // Its destructor stops the server at exit.
  static std::string failure;
  std::lock_guard<std::mutex> lock(mu);
  // A forked child inherits the parent's object but not its server (nor may it stop it): leak the
  // copy and start the child's own.
  if (server != nullptr && server->owner_pid_ != getpid()) server.release();
  if (server == nullptr) {
    // Starting takes seconds and fails the same way each time: do not retry it in every test.
    if (!failure.empty()) throw std::runtime_error(failure);
    try {
      server.reset(new PostgresServer());
    } catch (const std::exception& e) {
      failure = e.what();
      throw;
    }
  }
  return *server;
}

PostgresServer::PostgresServer() : owner_pid_(getpid()) {
  if (const char* url = std::getenv("GRADHUB_TEST_DATABASE_URL"); url != nullptr && *url != '\0') {
    external_ = true;
    external_url_ = url;
    return;
  }
  try {
    const std::string root = TempRoot();
    RemoveStaleDirectories(root);
    bin_dir_ = FindBinDir();
    std::string dir = root + "/" + kDirPrefix + std::to_string(getpid()) + "-XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) throw ErrnoError("mkdtemp " + dir);
    dir_ = dir;
    if (geteuid() == 0) {
      const passwd* user = getpwnam("postgres");
      if (user == nullptr)
        throw Error(
            "running as root, which initdb and postgres refuse, and there is no `postgres` "
            "user to run them as (the postgresql package creates one)");
      run_as_ = {true, user->pw_uid, user->pw_gid, std::vector<gid_t>(64)};
      int count = static_cast<int>(run_as_.groups.size());
      if (getgrouplist(user->pw_name, user->pw_gid, run_as_.groups.data(), &count) < 0) {
        run_as_.groups.resize(count);
        getgrouplist(user->pw_name, user->pw_gid, run_as_.groups.data(), &count);
      }
      run_as_.groups.resize(count);
      if (chown(dir_.c_str(), run_as_.uid, run_as_.gid) != 0) throw ErrnoError("chown " + dir_);
    }
    log_path_ = dir_ + "/server.log";
    log_fd_ = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd_ < 0) throw ErrnoError("open " + log_path_);
    password_ = RandomHex(16);
    const std::string password_file = dir_ + "/password";
    {
      std::ofstream out(password_file);
      out << password_ << "\n";
    }
    if (run_as_.drop && chown(password_file.c_str(), run_as_.uid, run_as_.gid) != 0)
      throw ErrnoError("chown " + password_file);
    chmod(password_file.c_str(), 0600);
    RunToCompletion({bin_dir_ + "/initdb", "-D", dir_ + "/data", "-A", "scram-sha-256",
                     "--pwfile=" + password_file, "-U", "postgres", "--no-sync", "-E", "UTF8",
                     "--locale=C"});
    fs::remove(password_file);
    for (int attempt = 1;; ++attempt) {
      port_ = FreeLoopbackPort();
      if (Launch()) break;
      if (attempt == kPortAttempts)
        throw Error("every port we picked was taken; log:\n" + Tail(log_path_));
    }
  } catch (...) {
    Shutdown();
    throw;
  }
}

PostgresServer::~PostgresServer() { Shutdown(); }

void PostgresServer::Shutdown() {
  if (getpid() != owner_pid_) return;
  if (external_) {
    if (external_databases_.empty()) return;
    try {  // Best effort: the server may be gone, and a destructor must not throw.
      Connection connection = Connect(external_url_);
      for (const auto& name : external_databases_) {
        const std::string sql =
            "DROP DATABASE IF EXISTS " + QuoteIdentifier(connection.get(), name) + " WITH (FORCE)";
        PQclear(PQexec(connection.get(), sql.c_str()));
      }
    } catch (const std::exception&) {
    }
    external_databases_.clear();
    return;
  }
  Stop();
  if (log_fd_ >= 0) close(log_fd_);
  log_fd_ = -1;
  std::error_code ec;
  if (!dir_.empty()) fs::remove_all(dir_, ec);
  dir_.clear();
}

std::string PostgresServer::AdminUrl() const {
  return external_ ? external_url_
                   : "postgresql://postgres:" + password_ + "@127.0.0.1:" + std::to_string(port_) +
                         "/postgres";
}

std::string PostgresServer::CreateDatabase() {
  static std::mt19937_64 random{std::random_device{}()};
  char suffix[17];
  snprintf(suffix, sizeof(suffix), "%016llx", static_cast<unsigned long long>(random()));
  const std::string name = "t_" + std::to_string(++databases_) + "_" + suffix;
  Connection connection = Connect(AdminUrl());
  const std::string sql = "CREATE DATABASE " + QuoteIdentifier(connection.get(), name);
  std::unique_ptr<PGresult, decltype(&PQclear)> result(PQexec(connection.get(), sql.c_str()),
                                                       &PQclear);
  if (PQresultStatus(result.get()) != PGRES_COMMAND_OK)
    throw Error(sql + ": " + PQerrorMessage(connection.get()));
  if (external_) external_databases_.push_back(name);
  return WithDatabase(AdminUrl(), name);
}

void PostgresServer::Restart() {
  Stop();
  Start();
}

void PostgresServer::Start() {
  if (external_) throw std::logic_error("PostgresServer::Start: the server is external");
  if (pid_ == 0 && !Launch())
    throw Error("port " + std::to_string(port_) + " was taken while the server was down; log:\n" +
                Tail(log_path_));
}

void PostgresServer::Stop() {
  if (external_) throw std::logic_error("PostgresServer::Stop: the server is external");
  if (pid_ == 0) return;
  kill(pid_, SIGINT);  // Fast shutdown: ends sessions, checkpoints, exits.
  if (!WaitFor(pid_, Clock::now() + kStopTimeout)) Kill();
  pid_ = 0;
}

void PostgresServer::Kill() {
  kill(pid_, SIGKILL);
  WaitFor(pid_, Clock::now() + kStopTimeout);
  pid_ = 0;
}

// Starts postgres on port_ and waits until it accepts connections. Returns false when it exited
// because the port was taken; throws on any other failure.
bool PostgresServer::Launch() {
  std::vector<std::string> command = {
      bin_dir_ + "/postgres", "-D", dir_ + "/data", "-p", std::to_string(port_), "-k", dir_};
  // A throwaway server: durability buys nothing here, and fsync would dominate the test time.
  // Also on 127.0.0.2, so that a test can cut one client off (a packet filter on that address,
  // tests/support/packet_filter.h) and not the others.
  for (const char* setting :
       {"listen_addresses=127.0.0.1,127.0.0.2", "fsync=off", "synchronous_commit=off",
        "full_page_writes=off", "max_connections=200"})
    command.insert(command.end(), {"-c", setting});
  std::error_code ec;
  const auto log_start = static_cast<std::streamoff>(fs::file_size(log_path_, ec));
  pid_ = Spawn(command);
  // Readiness is asked over the Unix socket in our own directory: on 127.0.0.1:port_ another
  // server that took the port first could answer. postgres binds TCP before the Unix socket.
  const std::string port = std::to_string(port_);
  const char* keys[] = {"host", "port", "user", "dbname", "connect_timeout", nullptr};
  const char* values[] = {dir_.c_str(), port.c_str(), "postgres", "postgres", "5", nullptr};
  const auto deadline = Clock::now() + kStartTimeout;
  for (;;) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = 0;
      if (Tail(log_path_, log_start).find("Address already in use") != std::string::npos)
        return false;
      throw Failure(command, DescribeStatus(status));
    }
    if (PQpingParams(keys, values, 0) == PQPING_OK) return true;
    if (Clock::now() >= deadline) {
      Kill();
      throw Failure(command, "did not accept connections within " +
                                 std::to_string(kStartTimeout.count()) + " s");
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

void PostgresServer::RunToCompletion(const std::vector<std::string>& command) {
  const pid_t pid = Spawn(command);
  const std::optional<int> status = WaitFor(pid, Clock::now() + kInitdbTimeout);
  if (!status) {
    kill(pid, SIGKILL);
    WaitFor(pid, Clock::now() + kStopTimeout);
    throw Failure(command, "timed out");
  }
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0)
    throw Failure(command, DescribeStatus(*status));
}

std::runtime_error PostgresServer::Failure(const std::vector<std::string>& command,
                                           const std::string& what) const {
  return Error("`" + Join(command) + "` " + what + "; last lines of its log:\n" + Tail(log_path_));
}

// fork + execv, no shell. Everything the child needs is prepared before fork: between fork and
// exec only async-signal-safe calls are safe (the test binary may have threads), which is why the
// groups come from getgrouplist() here and setgroups() there rather than initgroups() there.
pid_t PostgresServer::Spawn(const std::vector<std::string>& command) const {
  std::vector<char*> argv;
  for (const auto& word : command) argv.push_back(const_cast<char*>(word.c_str()));
  argv.push_back(nullptr);
  const RunAs& as = run_as_;
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw ErrnoError("fork");
  if (pid > 0) return pid;

  const auto die = [](const char* what) {
    const char* reason = strerror(errno);
    (void)!write(STDERR_FILENO, what, strlen(what));
    (void)!write(STDERR_FILENO, reason, strlen(reason));
    (void)!write(STDERR_FILENO, "\n", 1);
    _exit(127);
  };
  const int null = open("/dev/null", O_RDONLY);
  if (null < 0 || dup2(null, STDIN_FILENO) < 0 || dup2(log_fd_, STDOUT_FILENO) < 0 ||
      dup2(log_fd_, STDERR_FILENO) < 0)
    _exit(127);
  close_range(3, ~0U, 0);  // The test's pipes and sockets must not live on in the server.
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (as.drop && (setgroups(as.groups.size(), as.groups.data()) != 0 || setgid(as.gid) != 0 ||
                  setuid(as.uid) != 0))
    die("cannot become the postgres user: ");
  // Die with the test binary even if it crashes or is SIGKILLed: SIGQUIT is postgres's immediate
  // shutdown. Set after setuid, which clears it; then check that the parent did not die already.
  if (prctl(PR_SET_PDEATHSIG, SIGQUIT) != 0) die("prctl: ");
  if (getppid() != parent) _exit(1);
  if (chdir(dir_.c_str()) != 0) die("chdir: ");  // The caller's cwd may be closed to postgres.
  execv(argv[0], argv.data());
  die("execv: ");
  return -1;
}

}  // namespace gradhub::testing
