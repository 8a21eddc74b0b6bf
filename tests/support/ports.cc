#include "tests/support/ports.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <stdexcept>

namespace gradhub::testing {
namespace {

// Binds a socket to 127.0.0.1:`port` (0: the kernel's pick) and closes it again. The port it
// got, or -1 when the bind failed.
int ProbeLoopbackPort(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                     getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  close(fd);
  return bound ? ntohs(address.sin_port) : -1;
}

}  // namespace

int FreeLoopbackPort() {
  const int port = ProbeLoopbackPort(0);
  if (port < 0) throw std::runtime_error("no free loopback port");
  return port;
}

int PortBelowEphemeralRange() {
  int ephemeral_low = 32768;  // Linux's default
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> ephemeral_low;
  std::uniform_int_distribution<int> draw(std::max(1024, ephemeral_low - 12000), ephemeral_low - 1);
  static std::mt19937 random{std::random_device{}()};
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = draw(random);
    if (ProbeLoopbackPort(port) == port) return port;
  }
  return 0;
}

}  // namespace gradhub::testing
