// Sizes the checkpoint store's server and its clients agree on (header only, no dependencies).
#pragma once

namespace gradhub::checkpoint {

// The largest chunk a server may announce (--chunk-bytes): well under gRPC's default 4 MiB
// message limit, as checkpoint.proto promises, so default clients can receive downloads.
inline constexpr int kMaxChunkBytes = 3 << 20;
inline constexpr int kMinChunkBytes = 4 << 10;
// Room in a gRPC message for the fields around a chunk's data.
inline constexpr int kMessageOverheadBytes = 64 << 10;

}  // namespace gradhub::checkpoint
