// The sealed format (sealed_format.h) and the master key (data_keys.h), without a store: sizes
// both ways, the header, what each chunk's tag binds, key derivation, and the master key file's
// rules and wrapping.
#include "services/checkpoint/sealed_format.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "services/checkpoint/data_keys.h"

namespace gradhub::checkpoint {
namespace {

namespace fs = std::filesystem;
using sealed::ChunkSealer;
using sealed::Header;
using sealed::kChunkBytes;
using sealed::SecretKey;

TEST(SealedFormatTest, SizesGoBothWaysAndOnlyRealLayoutsParse) {
  for (const int64_t plain : {int64_t{0}, int64_t{1}, kChunkBytes - 1, kChunkBytes, kChunkBytes + 1,
                              5 * kChunkBytes + 12345}) {
    SCOPED_TRACE(plain);
    EXPECT_EQ(*sealed::PlainSize(sealed::SealedSize(plain)), plain);
  }
  EXPECT_EQ(sealed::SealedSize(0), sealed::kHeaderBytes + 16);
  EXPECT_EQ(sealed::SealedSize(kChunkBytes), sealed::RecordOffset(1) + 16);
  for (const int64_t bad : {int64_t{0}, sealed::kHeaderBytes, sealed::kHeaderBytes + 15,
                            sealed::RecordOffset(1), sealed::RecordOffset(2) + 3}) {
    EXPECT_TRUE(absl::IsDataLoss(sealed::PlainSize(bad).status())) << bad;
  }
}

TEST(SealedFormatTest, TheHeaderRoundTripsAndRefusesWhatItIsNot) {
  const Header header = Header::Fresh(sealed::RandomBytes(sealed::kKeyIdBytes));
  const std::string bytes = header.Encode();
  ASSERT_EQ(static_cast<int64_t>(bytes.size()), sealed::kHeaderBytes);
  const absl::StatusOr<Header> parsed = Header::Parse(bytes);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->Params(), header.Params());
  EXPECT_EQ(Header::FromParams(header.Params())->Params(), header.Params());
  // Two fresh headers never share a salt or a nonce prefix.
  const Header other = Header::Fresh(header.key_id);
  EXPECT_NE(other.salt, header.salt);
  EXPECT_NE(other.nonce_prefix, header.nonce_prefix);

  std::string wrong_version = bytes;
  wrong_version[11] = 2;
  EXPECT_TRUE(absl::IsDataLoss(Header::Parse(wrong_version).status()));
  std::string padded = bytes;
  padded[4000] = 1;
  EXPECT_TRUE(absl::IsDataLoss(Header::Parse(padded).status()));
  EXPECT_TRUE(absl::IsDataLoss(Header::Parse(bytes.substr(0, 100)).status()));
  EXPECT_TRUE(absl::IsDataLoss(Header::Parse(std::string(4096, 'x')).status()));
}

TEST(SealedFormatTest, AChunkOpensOnlyAtItsIndexWithItsFlagUnderItsKeyHeaderAndBinding) {
  const SecretKey key = SecretKey::Random();
  const Header header = Header::Fresh(sealed::RandomBytes(sealed::kKeyIdBytes));
  const std::string binding = sealed::BlobBinding("tenant:1", "job/1-u");
  ChunkSealer sealer(key, header, binding);
  const std::string plain = "the chunk's bytes";
  std::string record = plain + std::string(sealed::kTagBytes, '\0');
  ASSERT_TRUE(sealer.Seal(7, false, record.data(), plain.size()).ok());
  EXPECT_EQ(record.find("chunk"), std::string::npos);

  const auto opens = [&](ChunkSealer& with, uint64_t index, bool final) {
    std::string copy = record;
    return with.Open(index, final, copy.data(), copy.size()).ok() &&
           copy.substr(0, plain.size()) == plain;
  };
  EXPECT_TRUE(opens(sealer, 7, false));
  EXPECT_FALSE(opens(sealer, 8, false));  // moved
  EXPECT_FALSE(opens(sealer, 7, true));   // taken for the last
  ChunkSealer other_key(SecretKey::Random(), header, binding);
  EXPECT_FALSE(opens(other_key, 7, false));
  ChunkSealer other_blob(key, header, sealed::BlobBinding("tenant:1", "job/2-u"));
  EXPECT_FALSE(opens(other_blob, 7, false));
  ChunkSealer other_tenant(key, header, sealed::BlobBinding("tenant:2", "job/1-u"));
  EXPECT_FALSE(opens(other_tenant, 7, false));
  ChunkSealer other_header(key, Header::Fresh(header.key_id), binding);
  EXPECT_FALSE(opens(other_header, 7, false));
  // The same chunk sealed again is the same bytes (a resent chunk reuses no nonce differently).
  std::string again = plain + std::string(sealed::kTagBytes, '\0');
  ASSERT_TRUE(sealer.Seal(7, false, again.data(), plain.size()).ok());
  EXPECT_EQ(again, record);
  EXPECT_TRUE(
      absl::IsInvalidArgument(sealer.Seal(sealed::kMaxChunks, false, again.data(), plain.size())));
}

TEST(SealedFormatTest, DeriveKeyIsHkdfSha256) {
  // The answer of RFC 5869's HKDF-SHA256 for this input, computed apart (Python's hmac module
  // and `openssl kdf ... HKDF` agree).
  std::string ikm;
  for (int i = 0; i < 32; ++i) ikm.push_back(static_cast<char>(i));
  const SecretKey key = *SecretKey::FromBytes(ikm);
  EXPECT_EQ(sealed::ToHex(sealed::DeriveKey(key, "salt", "info").view()),
            "64cc2a23b7a1da4310420350405fdf5d632cb9bda3700d753e96cbcfeb81d449");
  EXPECT_NE(sealed::DeriveKey(key, "salt2", "info").view(),
            sealed::DeriveKey(key, "salt", "info").view());
}

class MasterKeyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "gradhub-master-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(MasterKeyTest, CreatedOnceWithMode0600AndLoadedAgainWithTheSameId) {
  const std::string path = dir_ + "/master.key";
  EXPECT_TRUE(absl::IsNotFound(MasterKey::Load(path).status()));
  const absl::StatusOr<MasterKey> created = MasterKey::Create(path);
  ASSERT_TRUE(created.ok()) << created.status();
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 32);
  EXPECT_TRUE(absl::IsAlreadyExists(MasterKey::Create(path).status()));
  const absl::StatusOr<MasterKey> loaded = MasterKey::Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->id(), created->id());
  EXPECT_EQ(loaded->id().size(), 16u);
}

TEST_F(MasterKeyTest, AFileOthersMayReadOrOfAnotherSizeIsRefusedNamingTheFlag) {
  const std::string path = dir_ + "/master.key";
  std::ofstream(path) << std::string(32, 'k');
  chmod(path.c_str(), 0644);
  absl::Status status = MasterKey::Load(path).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_NE(status.message().find("--master-key-file"), std::string_view::npos);
  chmod(path.c_str(), 0600);
  EXPECT_TRUE(MasterKey::Load(path).ok());
  std::ofstream(path, std::ios::app) << "\n";
  status = MasterKey::Load(path).status();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
}

TEST_F(MasterKeyTest, AWrappedKeyUnwrapsOnlyWithItsMasterIdAndScope) {
  const MasterKey master = MasterKey::FromKey(SecretKey::Random());
  const DataKey key{sealed::RandomBytes(16), KeyScope::Tenant(3),
                    std::make_shared<const SecretKey>(SecretKey::Random())};
  const std::string wrapped = master.Wrap(key);
  EXPECT_EQ(wrapped.size(), 60u);
  const absl::StatusOr<SecretKey> unwrapped = master.Unwrap(wrapped, key.id, key.scope);
  ASSERT_TRUE(unwrapped.ok()) << unwrapped.status();
  EXPECT_EQ(unwrapped->view(), key.key->view());
  EXPECT_TRUE(absl::IsDataLoss(master.Unwrap(wrapped, key.id, KeyScope::Tenant(4)).status()));
  EXPECT_TRUE(
      absl::IsDataLoss(master.Unwrap(wrapped, sealed::RandomBytes(16), key.scope).status()));
  const MasterKey other = MasterKey::FromKey(SecretKey::Random());
  EXPECT_NE(other.id(), master.id());
  EXPECT_TRUE(absl::IsDataLoss(other.Unwrap(wrapped, key.id, key.scope).status()));
}

}  // namespace
}  // namespace gradhub::checkpoint
