#include "tests/support/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace gradhub::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string MakeTempDir(const char* prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / prefix).string() + "XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

}  // namespace

Subprocess::Subprocess(std::vector<std::string> argv, std::map<std::string, std::string> env)
    : dir_(MakeTempDir("gradhub-proc-")) {
  const std::string out_path = dir_ + "/stdout", err_path = dir_ + "/stderr";
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    // The child dies with the test, even when the test is killed.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    for (const auto& [key, value] : env) setenv(key.c_str(), value.c_str(), 1);
    std::vector<char*> args;
    for (auto& arg : argv) args.push_back(arg.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
}

Subprocess::~Subprocess() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &status_, 0);
  }
  std::filesystem::remove_all(dir_);
}

int Subprocess::Wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!reaped_) {
    pid_t done = waitpid(pid_, &status_, WNOHANG);
    if (done == pid_) {
      reaped_ = true;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
}

void Subprocess::Kill(int signal) { kill(pid_, signal); }

bool Subprocess::running() { return Wait(std::chrono::milliseconds(0)) == -1; }

std::string Subprocess::out() const { return ReadFile(dir_ + "/stdout"); }
std::string Subprocess::err() const { return ReadFile(dir_ + "/stderr"); }

RunResult Run(std::vector<std::string> argv, std::map<std::string, std::string> env,
              std::chrono::milliseconds timeout) {
  Subprocess process(std::move(argv), std::move(env));
  RunResult result;
  result.exit_code = process.Wait(timeout);
  result.out = process.out();
  result.err = process.err();
  return result;
}

TempDir::TempDir() : path_(MakeTempDir("gradhub-test-")) {}
TempDir::~TempDir() { std::filesystem::remove_all(path_); }

std::string BinaryPath(const std::string& name) {
  const char* build = std::getenv("GRADHUB_BUILD_DIR");
  if (build == nullptr) throw std::runtime_error("GRADHUB_BUILD_DIR is not set (run via ctest)");
  return std::string(build) + "/bin/" + name;
}

}  // namespace gradhub::testing
