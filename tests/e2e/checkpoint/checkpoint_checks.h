// What the checkpoint e2e tests read back from a LocalCluster: the job's checkpoints as the
// service lists them (and the newest committed one), and the loss rank 0 reported at the end.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/local_cluster.h"

namespace gradhub::testing {

// Every checkpoint of `job` (`jobs/{id}`), as ListCheckpoints answers the job's tenant.
inline std::vector<v1::Checkpoint> ListedCheckpoints(LocalCluster& cluster,
                                                     const std::string& job) {
  v1::ListCheckpointsRequest request;
  request.set_parent(job);
  v1::ListCheckpointsResponse response;
  auto context = cluster.TenantContext();
  const grpc::Status status =
      cluster.checkpoints().ListCheckpoints(context.get(), request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return {response.checkpoints().begin(), response.checkpoints().end()};
}

// The committed checkpoint of `job` with the highest step, if there is one.
inline std::optional<v1::Checkpoint> NewestCommitted(LocalCluster& cluster,
                                                     const std::string& job) {
  std::optional<v1::Checkpoint> newest;
  for (const v1::Checkpoint& checkpoint : ListedCheckpoints(cluster, job)) {
    if (checkpoint.state() == v1::Checkpoint::COMMITTED &&
        (!newest || checkpoint.step() > newest->step())) {
      newest = checkpoint;
    }
  }
  return newest;
}

// Its step, 0 when there is none.
inline int64_t NewestCommittedStep(LocalCluster& cluster, const std::string& job) {
  const std::optional<v1::Checkpoint> newest = NewestCommitted(cluster, job);
  return newest ? newest->step() : 0;
}

// The parametersSha256 of rank 0's "done" line in the job's last attempt ("" when none came in
// 15 s: agents ship the logs after the exit).
// The whole blob of checkpoint `name` as the service streams it ("" on an error).
inline std::string DownloadCheckpoint(LocalCluster& cluster, const std::string& name) {
  v1::DownloadCheckpointRequest request;
  request.set_name(name);
  auto context = cluster.TenantContext();
  auto reader = cluster.checkpoints().DownloadCheckpoint(context.get(), request);
  std::string bytes;
  v1::DownloadCheckpointResponse chunk;
  while (reader->Read(&chunk)) bytes += chunk.data();
  const grpc::Status status = reader->Finish();
  EXPECT_TRUE(status.ok()) << name << ": " << status.error_message();
  return status.ok() ? bytes : "";
}

inline std::string FinalParameters(LocalCluster& cluster, const std::string& name) {
  static const std::regex kDone("\"parametersSha256\":\"([0-9a-f]{64})\"");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (std::chrono::steady_clock::now() < deadline) {
    for (const std::string& line : cluster.Logs(name, 0, 0)) {
      std::smatch match;
      if (std::regex_search(line, match, kDone)) return match[1].str();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return "";
}

// The loss in rank 0's "done" line of the job's last attempt (-1 if there is none). The tests
// check it stays above a floor: a run whose loss reached 0 no longer moves its parameters, and
// a bit-for-bit comparison of its end says nothing about how it resumed.
inline double FinalLoss(LocalCluster& cluster, const std::string& name) {
  static const std::regex kDone("\"event\":\"done\".*\"loss\":([0-9.e+-]+)");
  for (const std::string& line : cluster.Logs(name, 0, 0)) {
    std::smatch match;
    if (std::regex_search(line, match, kDone)) return std::stod(match[1].str());
  }
  return -1;
}

}  // namespace gradhub::testing
