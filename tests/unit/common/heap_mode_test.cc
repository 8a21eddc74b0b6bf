// KeepFreedHeapForTheNextMessage (services/common/heap_mode.h), in a process of its own: in a
// shared test binary, blocks freed by earlier tests would already have raised glibc's
// thresholds, and these tests would pass without the call.
#include "services/common/heap_mode.h"

#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace gradhub {
namespace {

constexpr size_t kSliceBytes = 256 << 10;
constexpr size_t kMessageBytes = 8 << 20;  // a download's window of slices

// What receiving one message does to the heap: its slices allocated and written, then freed
// once it is parsed.
void ReceiveAndFreeOneMessage() {
  std::vector<void*> slices;
  for (size_t held = 0; held < kMessageBytes; held += kSliceBytes) {
    slices.push_back(std::malloc(kSliceBytes));
    std::memset(slices.back(), 1, kSliceBytes);
  }
  for (void* slice : slices) std::free(slice);
}

// The cases run in this order, each under the setting it names; the first runs in a fresh
// process, and the second's block is larger than the first's setting lets the heap serve.
TEST(HeapModeTest, ForMessagesAFreedMessageStaysInTheHeapForTheNext) {
  KeepFreedHeapForTheNextMessage(kForMessages);
  for (int message = 0; message < 3; ++message) {
    ReceiveAndFreeOneMessage();
    // fordblks: the free bytes the heap kept. By default glibc gives back its free top past
    // 128 KiB (or twice the last freed mapped block) on the free.
    EXPECT_GE(mallinfo2().fordblks, kMessageBytes) << "after message " << message;
  }
}

TEST(HeapModeTest, ForTensorsBlocksUnder32MiBComeFromTheHeapNotMappingsOfTheirOwn) {
  KeepFreedHeapForTheNextMessage(kForTensors);
  // hblkhd: the bytes in blocks mapped on their own, each unmapped again by its free. By
  // default a block from 128 KiB up is one until a larger one has been freed; under
  // kForMessages, one from 4 MiB up.
  const size_t mapped_before = mallinfo2().hblkhd;
  void* block = std::malloc((32 << 20) - 4096);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(mallinfo2().hblkhd, mapped_before);
  std::free(block);
}

}  // namespace
}  // namespace gradhub
