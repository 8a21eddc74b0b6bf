// agent_pdeathsig_helper ARGV...: like gradhub-agent, blocks SIGTERM and SIGINT, then starts
// ARGV as a RankProcess, prints its pid on stdout, then every line the rank prints, and
// sleeps until killed. The tests SIGKILL it to check that the rank dies with it
// (PR_SET_PDEATHSIG), and read the rank's output to check what the rank inherited.
#include <signal.h>
#include <unistd.h>

#include <iostream>
#include <mutex>

#include "gpu_worker/agent/rank_process.h"

int main(int argc, char** argv) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  static std::mutex out_mu;
  gradhub::agent::RankProcessOptions options;
  for (int i = 1; i < argc; ++i) options.argv.push_back(argv[i]);
  options.on_line = [](const gradhub::agent::OutputLine& line) {
    std::lock_guard<std::mutex> lock(out_mu);
    std::cout << line.text << std::endl;
  };
  {
    std::lock_guard<std::mutex> lock(out_mu);  // the pid comes first
    auto process = gradhub::agent::RankProcess::Start(std::move(options));
    if (!process.ok()) {
      std::cerr << process.status() << "\n";
      return 1;
    }
    std::cout << (*process)->pid() << std::endl;
    process->release();  // never stopped: only the helper's death ends it
  }
  for (;;) pause();
}
