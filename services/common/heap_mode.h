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
// Two settings, as what a program allocates in large blocks differs:
struct HeapKeep {
  int largest_heap_block_bytes;  // larger blocks get mappings of their own (M_MMAP_THRESHOLD)
  int free_top_kept_bytes;       // the heap's free top kept up to this (M_TRIM_THRESHOLD)
};
// Programs whose large blocks are messages (gradhub-checkpoint, the CLI): a chunk with its
// framing fits under 4 MiB, and twice the 8 MiB a download holds in flight
// (grpc_receive_window.h) is kept. A 256 MiB download took 0.21-0.22 s with it against
// 0.25 s with kForTensors (same session, alternating, through GLIBC_TUNABLES).
inline constexpr HeapKeep kForMessages{4 << 20, 16 << 20};
// Trainers, whose tensors of up to 32 MiB are allocated every step: where glibc's own
// adjustment of both ends up once a program has freed a mapped block of 32 MiB (twice that of
// free top is kept), fixed from the start. A lower limit would map and fault in each such
// tensor anew.
inline constexpr HeapKeep kForTensors{32 << 20, 64 << 20};
// Fixed values also turn off glibc's adjustment, so a program behaves the same from its first
// message on. The cost is memory freed after a peak that stays resident, at most
// `free_top_kept_bytes` per malloc arena.
// Programs call this first thing in main(), beside TurnOffMutexDeadlockDetection().
void KeepFreedHeapForTheNextMessage(HeapKeep keep);

}  // namespace gradhub
