#include "gpu_worker/trainer/peer_reachability.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <sstream>

namespace gradhub::trainer {
namespace {

using Clock = std::chrono::steady_clock;

std::string Key(int rank) { return "reach/" + std::to_string(rank); }

// A listening socket at `address` on a free port, and that port; fd -1 when it cannot be made.
std::pair<int, int> ListenAt(const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(address.c_str(), "0", &hints, &found) != 0) return {-1, 0};
  int fd = -1;
  for (addrinfo* ai = found; ai != nullptr && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd >= 0 && (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0)) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return {-1, 0};
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  char port[NI_MAXSERV] = {};
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0 ||
      getnameinfo(reinterpret_cast<sockaddr*>(&bound), length, nullptr, 0, port, sizeof(port),
                  NI_NUMERICSERV) != 0) {
    close(fd);
    return {-1, 0};
  }
  return {fd, std::stoi(port)};
}

// A connect to `address`:`port` in flight: its socket, or -1 once it is judged.
struct Attempt {
  std::string node;
  int fd = -1;
  bool reached = false;
};

// Whether a connect that ended with `error` reached the host: a handshake or a refusal did.
bool Reached(int error) { return error == 0 || error == ECONNREFUSED; }

// Starts a non-blocking connect; judges it at once when it ends at once.
Attempt StartConnect(const std::string& node, const std::string& address, const std::string& port) {
  Attempt attempt{node};
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(address.c_str(), port.c_str(), &hints, &found) != 0) return attempt;
  const int fd = socket(found->ai_family, found->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                        found->ai_protocol);
  if (fd >= 0) {
    const int error = connect(fd, found->ai_addr, found->ai_addrlen) == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      attempt.fd = fd;
    } else {
      attempt.reached = Reached(error);
      close(fd);
    }
  }
  freeaddrinfo(found);
  return attempt;
}

// Waits for every connect in flight until `deadline`; one still in flight then did not reach.
void AwaitConnects(std::vector<Attempt>& attempts, Clock::time_point deadline) {
  for (;;) {
    std::vector<pollfd> pending;
    for (const Attempt& a : attempts) {
      if (a.fd >= 0) pending.push_back({a.fd, POLLOUT, 0});
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (pending.empty() || left.count() <= 0) break;
    if (poll(pending.data(), pending.size(), static_cast<int>(left.count())) <= 0) continue;
    for (Attempt& a : attempts) {
      const auto it = std::find_if(pending.begin(), pending.end(),
                                   [&](const pollfd& p) { return p.fd == a.fd; });
      if (a.fd < 0 || it == pending.end() || it->revents == 0) continue;
      int error = 0;
      socklen_t length = sizeof(error);
      getsockopt(a.fd, SOL_SOCKET, SO_ERROR, &error, &length);
      a.reached = Reached(error);
      close(a.fd);
      a.fd = -1;
    }
  }
  for (Attempt& a : attempts) {
    if (a.fd >= 0) close(a.fd);
    a.fd = -1;
  }
}

}  // namespace

std::unique_ptr<PeerReachability> PeerReachability::Publish(std::shared_ptr<ddp::Store> store,
                                                            int rank, const std::string& node,
                                                            const std::string& listen_address) {
  if (listen_address.empty() || node.empty()) return nullptr;
  const auto [fd, port] = ListenAt(listen_address);
  if (fd < 0) return nullptr;
  store->Set(Key(rank), node + " " + listen_address + " " + std::to_string(port));
  return std::unique_ptr<PeerReachability>(new PeerReachability(std::move(store), rank, node, fd));
}

PeerReachability::~PeerReachability() { close(fd_); }

std::vector<std::string> PeerReachability::UnreachableNodes(
    int world_size, std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  std::vector<Attempt> attempts;
  std::vector<std::string> order;  // nodes in rank order of their first rank
  for (int peer = 0; peer < world_size; ++peer) {
    if (peer == rank_) continue;
    std::string value;
    try {
      const auto left =
          std::max(std::chrono::milliseconds(1),
                   std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
      value = store_->Get(Key(peer), std::min(left, std::chrono::milliseconds(1000)));
    } catch (const std::exception&) {
      continue;  // never published, or the store is gone too: nothing to say about it
    }
    std::istringstream fields(value);
    std::string node, address, port;
    if (!(fields >> node >> address >> port) || node == node_) continue;
    if (std::find(order.begin(), order.end(), node) == order.end()) order.push_back(node);
    attempts.push_back(StartConnect(node, address, port));
  }
  AwaitConnects(attempts, deadline);
  std::map<std::string, bool> reached;
  for (const Attempt& a : attempts) reached[a.node] = reached[a.node] || a.reached;
  std::vector<std::string> unreachable;
  for (const std::string& node : order) {
    if (!reached[node]) unreachable.push_back(node);
  }
  return unreachable;
}

}  // namespace gradhub::trainer
