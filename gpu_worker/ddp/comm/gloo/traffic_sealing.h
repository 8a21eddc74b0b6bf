// Sealing of collective traffic with AES-256-GCM (OpenSSL EVP): the pure layer under the
// encrypted Gloo collectives (sealed_channel.h). No sockets and no store here, so every rule
// is tested as a function (tests/unit/ddp/traffic_sealing_test.cc).
//
// Keys and nonces:
//  1. Each process group has one random 32-byte group key (DrawTrafficKey, by its rank 0;
//     sealed_channel.h says how the other ranks get it).
//  2. Each direction of each channel -- messages from `sender` to `receiver` on channel c of
//     group g -- has its own AES key: HKDF-SHA256(group key, info = Encode(g, c, sender,
//     receiver)). Encode is injective (fixed-width numbers, a length before the name).
//  3. A message's 96-bit nonce is its collective's 64-bit sequence number in the group, then
//     the message's 32-bit index among that collective's messages in that direction.
//  4. Its additional authenticated data (AAD) is Encode(g, c, sender, receiver) followed by
//     the same sequence number and index: group, channel, collective, step of the ring,
//     sender and receiver.
//
// Why no (key, nonce) pair repeats: a key belongs to one direction of one channel of one
// group instance (a new group, a restarted attempt included, draws a new group key), and in
// that direction a nonce names one message of one collective. Sequence numbers grow by one
// per collective issued and never wrap (2^64); a collective sends at most 2^32 - 1 messages in
// a direction (checked before it starts).
//
// Point-to-point messages (Send and Recv, gloo/point_to_point.h) have a nonce space of their
// own: their direction key is derived as in step 2 with channel = kPointToPointChannel (-1,
// encoded 0xffffffff, which no channel index reaches), so no p2p key equals a collective's.
// Under that key a message's label is {collective: 2 k + part, message: tag}, where k counts
// the messages of that tag in that direction (0, 1, ...) and part is 0 for a transfer's header
// and 1 for its payload: each (tag, k, part) is one message, so again no (key, nonce) repeats.
// The AAD is built the same way, so a p2p message opened under another tag, index or part
// fails.
//
// What a receiver refuses: a flipped bit anywhere (ciphertext or tag), a message sealed for
// another group, channel, direction, collective or position (the receiver opens with the
// label it expects next, so a replayed or reordered message fails), and a truncated one.
//
// Thread-safety: DirectionCipher is not thread-safe (one channel thread uses it); the free
// functions are.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

namespace gradhub::ddp {

inline constexpr size_t kTrafficKeyBytes = 32;
// What sealing adds to a message: the GCM tag, after the ciphertext.
inline constexpr size_t kSealTagBytes = 16;

using TrafficKey = std::array<uint8_t, kTrafficKeyBytes>;

// A received message failed authentication. The message is the one a CommError carries:
// "collective traffic failed authentication from rank R (tampered or corrupted)".
class TrafficAuthenticationError : public std::runtime_error {
 public:
  explicit TrafficAuthenticationError(int sender);
};

// 32 bytes from OpenSSL's CSPRNG (RAND_bytes). Throws std::runtime_error if it fails.
TrafficKey DrawTrafficKey();

// The channel of point-to-point traffic in a TrafficDirection (see above).
inline constexpr int kPointToPointChannel = -1;

// One direction of one channel of a group (key and nonce steps 2 and 4).
struct TrafficDirection {
  std::string group;
  int channel = 0;
  int sender = 0;
  int receiver = 0;
};

// Where a message sits in its direction (nonce step 3).
struct MessageLabel {
  uint64_t collective = 0;  // the collective's sequence number in the group
  uint32_t message = 0;     // its index among the collective's messages in this direction
};

// Step 2: the AES-256 key of `direction` under `group_key`.
std::array<uint8_t, 32> DeriveDirectionKey(const TrafficKey& group_key,
                                           const TrafficDirection& direction);

// Seals messages of one direction (on its sender) or opens them (on its receiver); the same
// object may do both, as the tests do.
class DirectionCipher {
 public:
  DirectionCipher(const TrafficKey& group_key, TrafficDirection direction);
  ~DirectionCipher();
  DirectionCipher(const DirectionCipher&) = delete;
  DirectionCipher& operator=(const DirectionCipher&) = delete;

  const TrafficDirection& direction() const { return direction_; }

  // Writes the ciphertext of `bytes` plaintext bytes, then the tag, to `sealed` (bytes +
  // kSealTagBytes; must not overlap `plain`).
  void Seal(const MessageLabel& label, const void* plain, size_t bytes, uint8_t* sealed);
  // Decrypts `sealed` (bytes + kSealTagBytes) into `plain` and checks its tag. False when it
  // does not authenticate; `plain` then holds unspecified bytes that must not be used.
  [[nodiscard]] bool Open(const MessageLabel& label, const uint8_t* sealed, size_t bytes,
                          void* plain);

 private:
  struct Contexts;
  // Sets the nonce and feeds the AAD of `label` into `ctx` (an EVP_CIPHER_CTX).
  void Begin(void* ctx, bool encrypt, const MessageLabel& label);

  const TrafficDirection direction_;
  const std::string direction_aad_;  // Encode(group, channel, sender, receiver)
  std::unique_ptr<Contexts> contexts_;
};

}  // namespace gradhub::ddp
