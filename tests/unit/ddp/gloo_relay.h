// A man in the middle of one gloo TCP connection, for tests of what goes on the wire: it
// records every byte both ways and can flip one byte of a payload, as an attacker on the
// network between two hosts could.
//
// How rank 0's connection to rank 1 of a group (channel 0, a world of two) goes through it:
//  1. Both ranks listen on 127.0.0.2 (GlooOptions::hostname). gloo (2022) makes each rank
//     publish its pair's listening address in the store under "<group>/channel-0/<rank>"
//     (a struct sockaddr_storage first), and the side whose address compares higher
//     connects.
//  2. RelayingStore rewrites rank 1's published address to the relay's, 127.0.0.1:<port>, so
//     rank 0 (127.0.0.2 > 127.0.0.1) connects to the relay, and rank 0's to 127.0.0.3, so
//     that rank 1 (127.0.0.2 < 127.0.0.3) waits for the connection instead of making one.
//  3. The relay accepts rank 0, connects to rank 1's real address and copies both ways frame
//     by frame: gloo's 48-byte preamble (six size_t: nbytes, opcode, slot, offset, length,
//     roffset), then nbytes - 48 bytes of payload.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "gpu_worker/ddp/store.h"

namespace gradhub::ddp::testing {

class GlooRelay {
 public:
  static constexpr size_t kPreambleBytes = 6 * sizeof(size_t);

  explicit GlooRelay(const sockaddr_in& upstream) : upstream_(upstream) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address = Loopback("127.0.0.1", 0);
    if (listener_ < 0 || bind(listener_, Raw(address), sizeof(address)) != 0 ||
        listen(listener_, 1) != 0) {
      throw std::runtime_error("GlooRelay: cannot listen on 127.0.0.1");
    }
    socklen_t length = sizeof(address);
    getsockname(listener_, Raw(address), &length);
    port_ = ntohs(address.sin_port);
    server_ = std::thread([this] { Serve(); });
  }

  ~GlooRelay() {
    stopping_ = true;
    shutdown(listener_, SHUT_RDWR);
    for (int fd : {downstream_fd_.load(), upstream_fd_.load()}) {
      if (fd >= 0) shutdown(fd, SHUT_RDWR);
    }
    server_.join();
    for (int fd : {listener_, downstream_fd_.load(), upstream_fd_.load()}) {
      if (fd >= 0) close(fd);
    }
  }

  static sockaddr_in Loopback(const char* ip, uint16_t port) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    inet_pton(AF_INET, ip, &address.sin_addr);
    return address;
  }

  uint16_t port() const { return port_; }

  // From now on, flip a byte in the middle of the payload of the next frame of at least
  // `min_bytes` bytes that rank 0 sends (one frame only).
  void TamperWithNextPayload(size_t min_bytes) { tamper_min_bytes_ = min_bytes; }

  // Every byte that passed so far: rank 0 -> rank 1, and back.
  std::string SentByRank0() const { return Captured(0); }
  std::string SentByRank1() const { return Captured(1); }

 private:
  static sockaddr* Raw(sockaddr_in& address) { return reinterpret_cast<sockaddr*>(&address); }

  std::string Captured(int direction) const {
    std::lock_guard<std::mutex> lock(mu_);
    return captured_[direction];
  }

  void Serve() {
    const int client = accept(listener_, nullptr, nullptr);
    if (client < 0) return;
    downstream_fd_ = client;
    const int server = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in upstream = upstream_;
    if (connect(server, Raw(upstream), sizeof(upstream)) != 0) {
      close(server);
      return;
    }
    upstream_fd_ = server;
    int on = 1;
    setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    setsockopt(server, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    std::thread back([&] { Pump(server, client, 1); });
    Pump(client, server, 0);
    back.join();
  }

  // Copies frames from `from` to `to` until either end closes; direction 0 is rank 0's.
  void Pump(int from, int to, int direction) {
    std::string frame;
    while (!stopping_) {
      frame.assign(kPreambleBytes, '\0');
      if (!ReadFull(from, frame.data(), kPreambleBytes)) break;
      size_t nbytes = 0;
      std::memcpy(&nbytes, frame.data(), sizeof(nbytes));
      const size_t payload = nbytes > kPreambleBytes ? nbytes - kPreambleBytes : 0;
      frame.resize(kPreambleBytes + payload);
      if (!ReadFull(from, frame.data() + kPreambleBytes, payload)) break;
      const size_t threshold = tamper_min_bytes_.load();
      if (direction == 0 && threshold > 0 && payload >= threshold) {
        frame[kPreambleBytes + payload / 2] ^= 0x01;
        tamper_min_bytes_ = 0;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        captured_[direction] += frame;
      }
      if (!WriteFull(to, frame.data(), frame.size())) break;
    }
    shutdown(to, SHUT_WR);
  }

  static bool ReadFull(int fd, char* data, size_t bytes) {
    for (size_t done = 0; done < bytes;) {
      const ssize_t got = read(fd, data + done, bytes - done);
      if (got <= 0) return false;
      done += static_cast<size_t>(got);
    }
    return true;
  }

  static bool WriteFull(int fd, const char* data, size_t bytes) {
    for (size_t done = 0; done < bytes;) {
      const ssize_t put = send(fd, data + done, bytes - done, MSG_NOSIGNAL);
      if (put <= 0) return false;
      done += static_cast<size_t>(put);
    }
    return true;
  }

  const sockaddr_in upstream_;
  int listener_ = -1;
  std::atomic<int> downstream_fd_{-1}, upstream_fd_{-1};
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> tamper_min_bytes_{0};
  mutable std::mutex mu_;
  std::string captured_[2];
  std::thread server_;
};

// A store that puts a GlooRelay between ranks 0 and 1 of group `group` (channel 0, a world
// of two whose ranks listen on 127.0.0.2): steps 1 and 2 of the header. relay() is set once
// rank 1 published its address.
class RelayingStore : public Store {
 public:
  RelayingStore(std::shared_ptr<Store> inner, std::string group)
      : inner_(std::move(inner)), prefix_(std::move(group) + "/channel-0/") {}

  GlooRelay* relay() {
    std::lock_guard<std::mutex> lock(mu_);
    return relay_.get();
  }

  void Set(const std::string& key, const std::string& value) override {
    if (key == prefix_ + "1") return inner_->Set(key, ThroughRelay(value));
    if (key == prefix_ + "0") return inner_->Set(key, Redirected(value, "127.0.0.3"));
    inner_->Set(key, value);
  }
  std::string Get(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_->Get(key, timeout);
  }
  int64_t Add(const std::string& key, int64_t delta) override { return inner_->Add(key, delta); }
  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    inner_->Wait(keys, timeout);
  }
  bool Check(const std::vector<std::string>& keys) override { return inner_->Check(keys); }
  int64_t DeletePrefix(const std::string& prefix) override { return inner_->DeletePrefix(prefix); }

 private:
  // gloo's published address of a pair starts with its sockaddr_storage.
  static sockaddr_in AddressIn(const std::string& value) {
    sockaddr_in address{};
    if (value.size() < sizeof(sockaddr_storage)) throw std::runtime_error("not a gloo address");
    std::memcpy(&address, value.data(), sizeof(address));
    if (address.sin_family != AF_INET) throw std::runtime_error("not an IPv4 gloo address");
    return address;
  }

  static std::string Redirected(std::string value, const char* ip, int port = -1) {
    sockaddr_in address = AddressIn(value);
    inet_pton(AF_INET, ip, &address.sin_addr);
    if (port >= 0) address.sin_port = htons(static_cast<uint16_t>(port));
    std::memcpy(value.data(), &address, sizeof(address));
    return value;
  }

  std::string ThroughRelay(const std::string& value) {
    std::lock_guard<std::mutex> lock(mu_);
    relay_ = std::make_unique<GlooRelay>(AddressIn(value));
    return Redirected(value, "127.0.0.1", relay_->port());
  }

  const std::shared_ptr<Store> inner_;
  const std::string prefix_;
  std::mutex mu_;
  std::unique_ptr<GlooRelay> relay_;
};

}  // namespace gradhub::ddp::testing
