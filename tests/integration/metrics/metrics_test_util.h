// What the metrics integration tests share: a database with the api's schema, jobs written into
// it as the api would leave them, and gradhub-metrics as a real process (so that it can be
// SIGKILLed and restarted on its port).
#pragma once

#include <gtest/gtest.h>
#include <httplib.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "services/common/auth/authenticator.h"
#include "tests/integration/db/db_test_util.h"
#include "tests/support/subprocess.h"

namespace gradhub::metrics {

constexpr char kAdminToken[] = "metrics-test-admin";

// Waits for `pattern` in the process's stdout; returns its first group ("" after `limit`).
inline std::string AwaitLine(testing::Subprocess& process, const std::string& pattern,
                             std::chrono::seconds limit = std::chrono::seconds(30)) {
  const std::regex re(pattern);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline && process.running()) {
    std::smatch match;
    const std::string out = process.out();
    if (std::regex_search(out, match, re)) return match[1].str();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return "";
}

// The value of the sample whose line starts with `series` exactly (name and labels as
// exposed), NaN when there is none.
inline double SampleOf(const std::string& exposition, const std::string& series) {
  size_t at = 0;
  while ((at = exposition.find(series + " ", at)) != std::string::npos) {
    if (at == 0 || exposition[at - 1] == '\n') {
      return std::stod(exposition.substr(at + series.size() + 1));
    }
    at += series.size();
  }
  return std::nan("");
}

// gradhub-metrics on 127.0.0.1; the first Start picks free ports, a restart keeps them.
class MetricsProcess {
 public:
  MetricsProcess(std::string database_url, std::vector<std::string> flags = {})
      : url_(std::move(database_url)), flags_(std::move(flags)) {}

  bool Start() {
    std::vector<std::string> argv = {testing::BinaryPath("gradhub-metrics"),
                                     "--database-url",
                                     url_,
                                     "--host",
                                     "127.0.0.1",
                                     "--grpc-port",
                                     std::to_string(grpc_port_),
                                     "--http-port",
                                     std::to_string(http_port_),
                                     "--admin-token",
                                     kAdminToken};
    argv.insert(argv.end(), flags_.begin(), flags_.end());
    process_ = std::make_unique<testing::Subprocess>(argv);
    const std::string grpc = AwaitLine(*process_, "serving gRPC on port ([0-9]+)");
    const std::string http = AwaitLine(*process_, "serving HTTP on port ([0-9]+)");
    if (grpc.empty() || http.empty()) {
      ADD_FAILURE() << "gradhub-metrics did not start:\n" << process_->out() << process_->err();
      return false;
    }
    grpc_port_ = std::stoi(grpc);
    http_port_ = std::stoi(http);
    return true;
  }

  void Kill(int signal) { process_->Kill(signal); }
  int Wait(std::chrono::milliseconds limit) { return process_->Wait(limit); }

  std::string address() const { return "127.0.0.1:" + std::to_string(grpc_port_); }
  int http_port() const { return http_port_; }
  testing::Subprocess& process() { return *process_; }

  // GET `path` on the HTTP port: (status, body); status 0 when nothing answered.
  std::pair<int, std::string> Get(const std::string& path) const {
    httplib::Client client("127.0.0.1", http_port_);
    auto response = client.Get(path.c_str());
    if (!response) return {0, ""};
    return {response->status, response->body};
  }
  std::string Scrape() const { return Get("/metrics").second; }

 private:
  std::string url_;
  std::vector<std::string> flags_;
  int grpc_port_ = 0, http_port_ = 0;
  std::unique_ptr<testing::Subprocess> process_;
};

// A database with the schema, a tenant and a node token (which telemetry refuses).
class MetricsDatabaseTest : public db::DatabaseTest {
 protected:
  void SetUp() override {
    db::DatabaseTest::SetUp();
    Migrate();
    pool_ = MakePool(2);
    auto tenant = pool_->Exec("INSERT INTO tenants (name) VALUES ('team') RETURNING id");
    ASSERT_TRUE(tenant.ok()) << tenant.status();
    tenant_ = tenant->row(0).Get<int64_t>("id");
    api::Authenticator auth(pool_.get(), "");
    auto node = auth.CreateNodeToken("metrics test");
    ASSERT_TRUE(node.ok()) << node.status();
    node_token_ = node->secret;
  }

  // A job as the api leaves it once its attempt runs; returns "jobs/<id>".
  std::string InsertJob(int world_size, int attempt = 1) {
    auto row = pool_->Exec(
        "INSERT INTO jobs (tenant_id, spec, world_size, current_attempt, state)"
        " VALUES ($1, '{}', $2, $3, 'RUNNING') RETURNING id::text AS id",
        {tenant_, world_size, attempt});
    EXPECT_TRUE(row.ok()) << row.status();
    return row.ok() ? "jobs/" + row->row(0).Get<std::string>("id") : "";
  }

  // A rank's job token (IssueRankCredential's): its job "jobs/<id>", attempt and rank only.
  std::string JobToken(const std::string& job, int attempt, int rank) {
    api::Authenticator auth(pool_.get(), "");
    auto token = auth.CreateJobToken(job.substr(5), attempt, rank);
    EXPECT_TRUE(token.ok()) << token.status();
    return token.ok() ? token->secret : "";
  }

  void SetJob(const std::string& name, const std::string& state, int attempt) {
    auto done = pool_->Exec("UPDATE jobs SET state = $2, current_attempt = $3 WHERE id = $1::uuid",
                            {name.substr(5), state, attempt});
    ASSERT_TRUE(done.ok()) << done.status();
  }

  std::unique_ptr<db::Pool> pool_;
  int64_t tenant_ = 0;
  std::string node_token_;
};

}  // namespace gradhub::metrics
