#pragma once

namespace gradhub {

// For programs that stream large messages through gRPC (gradhub-checkpoint, trainers, the CLI's
// downloads): keeps the heap's freed top for the next message instead of handing it back to
// the kernel after each one.
//
// Why: gRPC receives a message into slices it mallocs and frees once the message is parsed.
// glibc gives the free top of the heap back (brk) as soon as it passes the trim threshold,
// 128 KiB until the process happens to free a large block. So each 1 MiB chunk of a download
// was returned and then faulted back in, page by page, for the next: 28% of the client's CPU
// in a perf profile (the brk in free, the page faults in the kernel's copy to the new pages),
// and 0.6 CPU-s per 256 MiB download where the check and the copy need under 0.1
// (tests/bench/checkpoint/run.sh).
//
// The settings are where glibc's own adjustment of both ends up in a long-running program
// once it has freed a mapped block of 32 MiB (blocks under 32 MiB come from the heap, and twice
// that of free top is kept), fixed from the start: a program behaves the same from its first
// message on, and a trainer's large tensors are served from the heap as they would be after
// its first steps (a lower fixed limit would map and fault in each one anew). The cost is
// memory freed after a peak that stays resident, at most 64 MiB per malloc arena. Downloads
// alone ran about 20% faster with a lower setting (blocks to 4 MiB from the heap, 16 MiB kept:
// 0.21-0.22 s per 256 MiB against 0.25 s, same session, through GLIBC_TUNABLES); programs
// without large tensors (the store, the CLI) could take that one, which this does not yet offer.
// Programs call this first thing in main(), beside TurnOffMutexDeadlockDetection().
void KeepFreedHeapForTheNextMessage();

}  // namespace gradhub
