// Allreduce bus bandwidth of gradhub's GlooProcessGroup against raw Gloo, ranks as processes.
// Implementations: gloo (raw Gloo: ring allreduce over TCP on loopback), tcp (gradhub over the
// same ring, transport and address: shared memory off), shm (gradhub's default on one host:
// its shared-memory allreduce, staging a private tensor through the segment), shm-inplace (the
// same group on a tensor from AllocateCollectiveBuffer, in shared memory every rank maps, as
// the Reducer's gradient buckets are: reduced in place, nothing staged), sealed (gradhub over
// TCP with GlooOptions::encrypt_traffic:
// its own ring, every message AES-256-GCM sealed). Beside them, point to point (pipeline
// stages): p2p and p2p-sealed, where each of two ranks sends MIB to the other and receives
// MIB from it at the same time (Send and Recv in flight together, as a stage's activation
// and gradient are), plain and sealed; a time is one such exchange. And memcpy: one process,
// one thread, copying MIB between two buffers, the reference for shm (the shared-memory
// allreduce moves each byte through memory several times; see shared_memory_allreduce.h).
// Ranks listen on 127.0.0.1; with GRADHUB_BENCH_NETNS and GRADHUB_BENCH_ADDRESSES
// (tests/bench/bench_hosts.h) each rank runs in a network namespace of its own "host" and
// listens on its address instead (tests/bench/network), where shm cannot work.
// Prints one line: <impl> <MiB> <world> <median seconds per allreduce or exchange>.
// Usage: bench_allreduce gloo|tcp|shm|shm-inplace|sealed|p2p|p2p-sealed|memcpy MIB WORLD ITERS
//   (p2p: WORLD 2; memcpy: WORLD 1)
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu_worker/ddp/comm/gloo/gloo_process_group.h"
#include "gpu_worker/ddp/comm/process_group.h"
#include "gpu_worker/ddp/store/file_store.h"
#include "tests/bench/bench_hosts.h"

namespace {

using Clock = std::chrono::steady_clock;

double MedianSeconds(int iterations, const std::function<void()>& allreduce) {
  for (int i = 0; i < 3; ++i) allreduce();  // warm-up: connections, page faults
  std::vector<double> times;
  for (int i = 0; i < iterations; ++i) {
    const auto start = Clock::now();
    allreduce();
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

double RawGloo(int rank, int world, int64_t numel, int iterations, const std::string& dir,
               const std::string& address) {
  gloo::rendezvous::FileStore store(dir);
  gloo::transport::tcp::attr attr;
  attr.hostname = address;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
  context->connectFullMesh(store, device);
  std::vector<float> data(numel, 1.0f);
  return MedianSeconds(iterations, [&] {
    gloo::AllreduceOptions opts(context);
    opts.setOutput(data.data(), data.size());
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    gloo::allreduce(opts);
  });
}

std::shared_ptr<gradhub::ddp::ProcessGroup> Join(int rank, int world, const std::string& dir,
                                                 const std::string& address, bool shared_memory,
                                                 bool encrypt) {
  gradhub::ddp::ProcessGroupOptions options;
  options.backend = gradhub::ddp::Backend::kGloo;
  options.rank = rank;
  options.size = world;
  options.gloo.emplace().hostname = address;
  options.store = std::make_shared<gradhub::ddp::FileStore>(dir);
  options.gloo->shared_memory = shared_memory;
  options.gloo->encrypt_traffic = encrypt;
  auto group = gradhub::ddp::CreateProcessGroup(options);
  if (dynamic_cast<gradhub::ddp::GlooProcessGroup&>(*group).uses_shared_memory() != shared_memory) {
    std::fprintf(stderr, "bench_allreduce: rank %d: shared memory %s, wanted %s\n", rank,
                 shared_memory ? "unavailable" : "used", shared_memory ? "on" : "off");
    std::exit(1);
  }
  return group;
}

double Gradhub(int rank, int world, int64_t numel, int iterations, const std::string& dir,
               const std::string& address, bool shared_memory, bool encrypt, bool in_place) {
  auto group = Join(rank, world, dir, address, shared_memory, encrypt);
  at::Tensor tensor =
      in_place ? group->AllocateCollectiveBuffer(numel, at::kFloat).fill_(1) : at::ones({numel});
  return MedianSeconds(iterations, [&] { group->AllReduce(tensor)->Wait(); });
}

double GradhubExchange(int rank, int64_t numel, int iterations, const std::string& dir,
                       const std::string& address, bool encrypt) {
  auto group = Join(rank, 2, dir, address, /*shared_memory=*/false, encrypt);
  at::Tensor outgoing = at::ones({numel}), incoming = at::empty({numel});
  return MedianSeconds(iterations, [&] {
    auto send = group->Send(outgoing, 1 - rank, 0);
    auto recv = group->Recv(incoming, 1 - rank, 0);
    send->Wait();
    recv->Wait();
  });
}

// One core copying `numel` floats from one buffer to another, both touched beforehand.
double Memcpy(int64_t numel, int iterations) {
  std::vector<float> from(numel, 1.0f), to(numel, 0.0f);
  return MedianSeconds(iterations, [&] {
    std::memcpy(to.data(), from.data(), numel * sizeof(float));
    // Keeps the copy from being optimized away.
    asm volatile("" : : "r"(to.data()) : "memory");
  });
}

}  // namespace

int main(int argc, char** argv) {
  const std::string impl = argc == 5 ? argv[1] : "";
  const bool exchange = impl == "p2p" || impl == "p2p-sealed";
  const int world = argc == 5 ? std::stoi(argv[3]) : 0;
  const bool shm = impl == "shm" || impl == "shm-inplace";
  if ((impl != "gloo" && impl != "tcp" && !shm && impl != "sealed" && !exchange &&
       impl != "memcpy") ||
      (exchange && world != 2) || (impl == "memcpy" && world != 1)) {
    std::fprintf(stderr,
                 "usage: bench_allreduce gloo|tcp|shm|shm-inplace|sealed|p2p|p2p-sealed|memcpy "
                 "MIB WORLD ITERS (p2p: WORLD 2; memcpy: WORLD 1)\n");
    return 2;
  }
  const int64_t numel = std::stoll(argv[2]) * (1 << 20) / sizeof(float);
  const int iterations = std::stoi(argv[4]);
  if (impl == "memcpy") {
    std::printf("%s %s %d %.6f\n", argv[1], argv[2], world, Memcpy(numel, iterations));
    return 0;
  }
  const std::optional<gradhub::bench::BenchHosts> hosts =
      gradhub::bench::BenchHostsFromEnvironment(world);
  if (hosts && shm) {
    std::fprintf(stderr,
                 "bench_allreduce: shm needs every rank on one host (GRADHUB_BENCH_NETNS)\n");
    return 2;
  }
  char pattern[] = "/tmp/gradhub-bench-allreduce-XXXXXX";
  const std::string dir = mkdtemp(pattern);
  auto run = [&](int rank) {
    // Before anything starts a thread: the rank's threads and sockets must all be on its host.
    const std::string address = hosts ? gradhub::bench::JoinBenchHost(*hosts, rank) : "127.0.0.1";
    at::set_num_threads(1);
    if (exchange) {
      return GradhubExchange(rank, numel, iterations, dir, address, impl == "p2p-sealed");
    }
    return impl == "gloo" ? RawGloo(rank, world, numel, iterations, dir, address)
                          : Gradhub(rank, world, numel, iterations, dir, address, shm,
                                    impl == "sealed", impl == "shm-inplace");
  };
  // Children are forked before any thread exists in this process.
  std::vector<pid_t> children;
  for (int rank = 1; rank < world; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      run(rank);
      _exit(0);
    }
    children.push_back(pid);
  }
  const double median = run(0);
  int failures = 0;
  for (pid_t child : children) {
    int status = 0;
    waitpid(child, &status, 0);
    failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::filesystem::remove_all(dir);
  std::printf("%s %s %d %.6f\n", argv[1], argv[2], world, median);
  return failures == 0 ? 0 : 1;
}
