// The trainer frames UploadChunkRequest by hand around its bytes (chunk_upload.h): what it
// sends must parse as the message the server expects.
#include "gpu_worker/checkpoint_client/chunk_upload.h"

#include <gtest/gtest.h>

#include <string>

#include "gradhub/v1/checkpoint.pb.h"

namespace gradhub::checkpoint_client {
namespace {

v1::UploadChunkRequest Parse(const std::string& wire) {
  v1::UploadChunkRequest request;
  EXPECT_TRUE(request.ParseFromString(wire));
  return request;
}

TEST(ChunkUploadTest, HeaderAndBytesAreTheMessageTheServerParses) {
  std::string data(1 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + 3);
  const v1::UploadChunkRequest request =
      Parse(ChunkHeader("upload-1", 5 << 20, data.size()) + data);
  EXPECT_EQ(request.upload_id(), "upload-1");
  EXPECT_EQ(request.offset(), 5 << 20);
  EXPECT_TRUE(request.data() == data);
}

TEST(ChunkUploadTest, LaterChunksLeaveTheUploadIdOutAndOffsetZeroIsImplicit) {
  const v1::UploadChunkRequest request = Parse(ChunkHeader("", 0, 3) + "abc");
  EXPECT_EQ(request.upload_id(), "");
  EXPECT_EQ(request.offset(), 0);
  EXPECT_EQ(request.data(), "abc");
}

TEST(ChunkUploadTest, AProbeCarriesNoData) {
  const v1::UploadChunkRequest request = Parse(ChunkHeader("u", 0, 0));
  EXPECT_EQ(request.upload_id(), "u");
  EXPECT_TRUE(request.data().empty());
}

TEST(ChunkUploadTest, TheSameBytesAsProtobufSerializesThem) {
  // Field order is the declaration order, data last: byte-identical to protobuf's own output.
  v1::UploadChunkRequest request;
  request.set_upload_id("x");
  request.set_offset(123456789);
  request.set_data(std::string(300, 'z'));
  EXPECT_EQ(ChunkHeader("x", 123456789, 300) + std::string(300, 'z'), request.SerializeAsString());
}

}  // namespace
}  // namespace gradhub::checkpoint_client
