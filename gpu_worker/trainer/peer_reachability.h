// Which peers' nodes a rank can still reach, so that a collective that failed names both ends
// of the broken link (contract/unreachable_nodes.h) instead of only "timed out".
//
// Protocol (keys under the attempt's store prefix):
//  1. Publish: the rank listens on a TCP socket at its listen address (port 0) that it never
//     accepts on: the kernel completes a peer's handshake from the backlog, which is all a
//     probe needs. It sets "reach/<rank>" to "<node> <address> <port>".
//  2. Probe, once a collective failed: every peer's key (each waited for briefly: a peer that
//     never published is skipped), then a connect to every peer at once, non-blocking, for
//     up to `timeout`. A handshake, or a refusal (the peer's process is gone but its host
//     answered), means its node is reachable; silence until the timeout, or no route, means
//     unreachable.
//  3. A node is unreachable when no rank of it could be reached; the rank's own node never is.
// The probe costs at most `timeout` on a rank that is failing anyway. Without a listen address
// (a trainer run by hand on one machine) nothing is published and nothing is probed.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gpu_worker/ddp/store.h"

namespace gradhub::trainer {

class PeerReachability {
 public:
  // Step 1; nullptr (said on `log`-less stderr by the caller) when the socket cannot be made.
  static std::unique_ptr<PeerReachability> Publish(std::shared_ptr<ddp::Store> store, int rank,
                                                   const std::string& node,
                                                   const std::string& listen_address);
  ~PeerReachability();
  PeerReachability(const PeerReachability&) = delete;
  PeerReachability& operator=(const PeerReachability&) = delete;

  // Steps 2 and 3 for a world of `world_size` ranks: the unreachable nodes, in rank order of
  // their first rank.
  std::vector<std::string> UnreachableNodes(int world_size,
                                            std::chrono::milliseconds timeout) const;
  const std::string& node() const { return node_; }

 private:
  PeerReachability(std::shared_ptr<ddp::Store> store, int rank, std::string node, int fd)
      : store_(std::move(store)), rank_(rank), node_(std::move(node)), fd_(fd) {}

  std::shared_ptr<ddp::Store> store_;
  int rank_;
  std::string node_;
  int fd_;
};

}  // namespace gradhub::trainer
