// The sealing layer of encrypted collectives (gpu_worker/ddp/comm/gloo/traffic_sealing.h) as
// pure functions: a message opens only where, when and from whom it was sealed, and a
// flipped bit anywhere is refused.
#include "gpu_worker/ddp/comm/gloo/traffic_sealing.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace gradhub::ddp {
namespace {

using ::testing::HasSubstr;

const TrafficDirection kDirection{"default", 0, 0, 1};
const MessageLabel kLabel{41, 3};

std::vector<uint8_t> Pattern(size_t bytes) {
  std::vector<uint8_t> plain(bytes);
  for (size_t i = 0; i < bytes; ++i) plain[i] = static_cast<uint8_t>(i * 31 + 7);
  return plain;
}

std::vector<uint8_t> Sealed(const TrafficKey& key, const TrafficDirection& direction,
                            const MessageLabel& label, const std::vector<uint8_t>& plain) {
  DirectionCipher sender(key, direction);
  std::vector<uint8_t> sealed(plain.size() + kSealTagBytes);
  sender.Seal(label, plain.data(), plain.size(), sealed.data());
  return sealed;
}

// Whether `sealed` opens under (key, direction, label) to exactly `plain`.
bool Opens(const TrafficKey& key, const TrafficDirection& direction, const MessageLabel& label,
           const std::vector<uint8_t>& sealed, const std::vector<uint8_t>& plain) {
  DirectionCipher receiver(key, direction);
  std::vector<uint8_t> opened(plain.size());
  const bool ok = receiver.Open(label, sealed.data(), plain.size(), opened.data());
  return ok && opened == plain;
}

TEST(TrafficSealingTest, RoundTripOfEverySizeFromEmptyToSeveralBlocks) {
  const TrafficKey key = DrawTrafficKey();
  for (size_t bytes : {0, 1, 15, 16, 17, 1000, 256 * 1024 + 3}) {
    const std::vector<uint8_t> plain = Pattern(bytes);
    const std::vector<uint8_t> sealed = Sealed(key, kDirection, kLabel, plain);
    EXPECT_EQ(sealed.size(), bytes + kSealTagBytes);
    EXPECT_TRUE(Opens(key, kDirection, kLabel, sealed, plain)) << bytes << " bytes";
  }
}

TEST(TrafficSealingTest, CiphertextIsNotThePlaintext) {
  const TrafficKey key = DrawTrafficKey();
  const std::string text(4096, 'A');
  const std::vector<uint8_t> plain(text.begin(), text.end());
  const std::vector<uint8_t> sealed = Sealed(key, kDirection, kLabel, plain);
  const std::string wire(sealed.begin(), sealed.end());
  EXPECT_EQ(wire.find("AAAAAAAA"), std::string::npos);
}

TEST(TrafficSealingTest, AFlippedBitAnywhereIsRefused) {
  const TrafficKey key = DrawTrafficKey();
  const std::vector<uint8_t> plain = Pattern(100);
  const std::vector<uint8_t> sealed = Sealed(key, kDirection, kLabel, plain);
  // Every byte of the ciphertext and of the tag, one bit at a time in turn.
  for (size_t i = 0; i < sealed.size(); ++i) {
    std::vector<uint8_t> tampered = sealed;
    tampered[i] ^= static_cast<uint8_t>(1u << (i % 8));
    EXPECT_FALSE(Opens(key, kDirection, kLabel, tampered, plain)) << "byte " << i;
  }
}

TEST(TrafficSealingTest, AMessageOpensOnlyInItsOwnGroupChannelAndDirection) {
  const TrafficKey key = DrawTrafficKey();
  const std::vector<uint8_t> plain = Pattern(64);
  const std::vector<uint8_t> sealed = Sealed(key, kDirection, kLabel, plain);
  const std::vector<TrafficDirection> others = {
      {"default/sub-0-1", 0, 0, 1},  // another group
      {"default", 1, 0, 1},          // another channel
      {"default", 0, 1, 0},          // the reverse direction: reflected back to its sender
      {"default", 0, 0, 2},          // another receiver
      {"default", 0, 2, 1},          // another sender
  };
  for (const TrafficDirection& other : others) {
    EXPECT_FALSE(Opens(key, other, kLabel, sealed, plain))
        << other.group << " channel " << other.channel << " " << other.sender << "->"
        << other.receiver;
  }
  EXPECT_FALSE(Opens(DrawTrafficKey(), kDirection, kLabel, sealed, plain)) << "another group key";
}

TEST(TrafficSealingTest, ReplayedOrReorderedMessagesAreRefused) {
  const TrafficKey key = DrawTrafficKey();
  const std::vector<uint8_t> plain = Pattern(64);
  const std::vector<uint8_t> sealed = Sealed(key, kDirection, kLabel, plain);
  // The receiver opens with the label it expects next: a message of an earlier collective
  // replayed, or one of this collective out of its place, does not open.
  EXPECT_FALSE(Opens(key, kDirection, {kLabel.collective + 1, kLabel.message}, sealed, plain));
  EXPECT_FALSE(Opens(key, kDirection, {kLabel.collective, kLabel.message + 1}, sealed, plain));
  EXPECT_FALSE(Opens(key, kDirection, {kLabel.collective, kLabel.message - 1}, sealed, plain));
  // The nonce's halves cannot stand in for each other.
  EXPECT_FALSE(Opens(key, kDirection, {kLabel.message, static_cast<uint32_t>(kLabel.collective)},
                     sealed, plain));
}

TEST(TrafficSealingTest, TruncatedOrSplicedMessagesAreRefused) {
  const TrafficKey key = DrawTrafficKey();
  const std::vector<uint8_t> plain = Pattern(64);
  const std::vector<uint8_t> sealed = Sealed(key, kDirection, kLabel, plain);
  // Shorter: the last plaintext byte dropped, the tag kept.
  std::vector<uint8_t> shorter(sealed.begin(), sealed.begin() + 63);
  shorter.insert(shorter.end(), sealed.end() - kSealTagBytes, sealed.end());
  EXPECT_FALSE(Opens(key, kDirection, kLabel, shorter, Pattern(63)));
  // Two messages' halves spliced together.
  const std::vector<uint8_t> other = Sealed(key, kDirection, {kLabel.collective, 4}, plain);
  std::vector<uint8_t> spliced(sealed.begin(), sealed.begin() + 32);
  spliced.insert(spliced.end(), other.begin() + 32, other.end());
  EXPECT_FALSE(Opens(key, kDirection, kLabel, spliced, plain));
}

TEST(TrafficSealingTest, EveryDirectionHasItsOwnKey) {
  const TrafficKey key = DrawTrafficKey();
  std::set<std::array<uint8_t, 32>> keys;
  // Point to point's "channel" too: its keys are none of the collectives'.
  for (int channel : {0, 1, kPointToPointChannel}) {
    for (int sender = 0; sender < 3; ++sender) {
      for (int receiver = 0; receiver < 3; ++receiver) {
        keys.insert(DeriveDirectionKey(key, {"g", channel, sender, receiver}));
      }
    }
  }
  EXPECT_EQ(keys.size(), 3u * 3 * 3);
  // The same inputs give the same key (both ends derive it on their own) ...
  EXPECT_EQ(DeriveDirectionKey(key, {"g", 0, 0, 1}), DeriveDirectionKey(key, {"g", 0, 0, 1}));
  // ... and the encoding is injective: names that run into the numbers stay apart.
  EXPECT_NE(DeriveDirectionKey(key, {"g", 1, 0, 1}), DeriveDirectionKey(key, {"g\x01", 0, 0, 1}));
}

TEST(TrafficSealingTest, GroupKeysAreRandom) { EXPECT_NE(DrawTrafficKey(), DrawTrafficKey()); }

TEST(TrafficSealingTest, TheAuthenticationErrorNamesTheSender) {
  EXPECT_THAT(TrafficAuthenticationError(2).what(),
              HasSubstr("collective traffic failed authentication from rank 2 (tampered or "
                        "corrupted)"));
}

}  // namespace
}  // namespace gradhub::ddp
