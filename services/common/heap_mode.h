#pragma once

namespace gradhub {

// For programs that stream large messages through gRPC (gradhub-checkpoint, the CLI's
// downloads): keeps the heap's freed top for the next message instead of handing it back to
// the kernel after each one.
//
// Why: gRPC receives a message into slices it mallocs and frees once the message is parsed.
// glibc gives the free top of the heap back (brk) as soon as it passes the trim threshold,
// 128 KiB until the process happens to free a large block. So each 1 MiB chunk of a download
// was returned and then faulted back in, page by page, for the next: 28% of the client's CPU
// in a perf profile (the brk in free, the page faults in the kernel's copy to the new pages),
// and 0.6 CPU-s per 256 MiB download where the check and the copy need 0.07
// (tests/bench/checkpoint/run.sh).
//
// The settings: blocks up to 4 MiB come from the heap (a chunk with its framing, never a
// mapping of its own that each free unmaps), and up to 16 MiB of free top is kept: twice
// the 8 MiB a download holds in flight (grpc_receive_window.h). Fixed values also turn off
// glibc's adjustment of both, so a program behaves the same from its first message on. The
// cost is at most 16 MiB of memory per malloc arena, left resident after a peak.
// Programs call this first thing in main(), beside TurnOffMutexDeadlockDetection().
void KeepFreedHeapForTheNextMessage();

}  // namespace gradhub
