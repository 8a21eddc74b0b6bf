// SIGTERM and SIGINT for every gradhub server: taken by sigwait on the main thread instead of a
// handler, so the shutdown (stop accepting, let calls finish, join) runs as ordinary code.
#pragma once

#include <pthread.h>
#include <signal.h>

namespace gradhub {

class ShutdownSignals {
 public:
  // Blocks both in the calling thread. Construct it before starting any thread: threads
  // inherit the mask, so none of them is picked to run a default handler that would kill the
  // process before Wait() sees the signal.
  ShutdownSignals() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGTERM);
    sigaddset(&signals_, SIGINT);
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
  }

  // Until one of them arrives; returns it.
  int Wait() const {
    int received = 0;
    sigwait(&signals_, &received);
    return received;
  }

 private:
  sigset_t signals_;
};

}  // namespace gradhub
