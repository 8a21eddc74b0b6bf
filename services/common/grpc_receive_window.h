#pragma once

#include <grpcpp/support/channel_arguments.h>

namespace gradhub {

// The receive window of a channel that streams large blobs to this process (checkpoint
// downloads): a fixed HTTP/2 window instead of gRPC C++'s BDP-tuned one (grpc-java's default
// is a fixed 1 MiB window too).
//
// Why: with BDP probing gRPC C++ grows the window to what the link carries, and on a fast link
// (loopback here) it admits tens of MB more than the reader has taken. The transport reads
// them into 8-200 KB slices from the heap. A trainer resuming a pipeline stage under CPU load
// (pipeline_memory_e2e_test, two busy loops beside it) had 60-105 MB of its heap in use after
// its checkpoint download and restore against 44 MB before them (glibc's malloc_info, 3 runs),
// and trained with up to 70 MB more anonymous memory than the same stage's first attempt: its
// memory cgroup killed it at the limit the first attempt met with room. With this window the
// heap was 48 MB in use after the same restore in 3 runs of 3, and the stage peaked at
// 285-286 MiB against 315-346 MiB.
//
// It is faster too: tests/bench/checkpoint/run.sh's 256 MiB download, CRC-checked, took
// 0.689-0.690 s with it against 0.880-0.891 s with BDP tuning (two alternated runs each, 3
// rounds apiece), and the client spent 0.63-0.64 CPU-s on it against 0.87-0.88 (not profiled
// further).
//
// kBlobReceiveWindowBytes holds two of the store's largest chunks (checkpoint_limits.h: 3 MiB)
// with room, so that the server always has the next chunk's bytes admitted while the reader
// writes the last one away.
inline constexpr int kBlobReceiveWindowBytes = 8 << 20;

inline void BoundReceiveWindow(grpc::ChannelArguments& args) {
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kBlobReceiveWindowBytes);
}

}  // namespace gradhub
