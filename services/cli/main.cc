// gradhub: the command-line client. Everything is in gradhub_cli; see cli.h.
#include <unistd.h>

#include <iostream>

#include "services/cli/cli.h"
#include "services/common/abseil_mode.h"
#include "services/common/heap_mode.h"

int main(int argc, char** argv) {
  gradhub::TurnOffMutexDeadlockDetection();
  gradhub::KeepFreedHeapForTheNextMessage(gradhub::kForMessages);
  gradhub::cli::Io io{
      .out = &std::cout, .err = &std::cerr, .out_is_terminal = isatty(STDOUT_FILENO) == 1};
  const int code = gradhub::cli::RunCli(argc, argv, io);
  std::cout.flush();
  return code;
}
