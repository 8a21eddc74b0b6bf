// Ranks as threads, for collective tests over an InMemoryStore (gloo's test/base_test.h).
#pragma once

#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gradhub::ddp::testing {

// Runs fn(rank) for every rank in [0, size) on its own thread, joins them all, then rethrows
// the first exception any of them threw (gtest assertions in fn are recorded as usual: gtest
// is thread-safe on POSIX). Keep the process group timeouts in fn short: a rank that threw
// leaves its peers waiting in a collective until their timeout.
inline void spawnThreads(int size, const std::function<void(int rank)>& fn) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  threads.reserve(size);
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        fn(rank);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace gradhub::ddp::testing
