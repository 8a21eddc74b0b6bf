// The trainer frames UploadChunkRequest by hand around its bytes (chunk_upload.h): what it
// sends must parse as the message the server expects.
#include "gpu_worker/checkpoint_client/chunk_upload.h"

#include <gtest/gtest.h>

#include <string>

#include "gradhub/v1/checkpoint.pb.h"
#include "services/common/crc32c.h"

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
  const v1::UploadChunkRequest request = Parse(ChunkHeader("upload-1", 5 << 20, data) + data);
  EXPECT_EQ(request.upload_id(), "upload-1");
  EXPECT_EQ(request.offset(), 5 << 20);
  EXPECT_TRUE(request.data() == data);
  ASSERT_TRUE(request.has_crc32c());
  EXPECT_EQ(request.crc32c(), Crc32c(data));
}

TEST(ChunkUploadTest, LaterChunksLeaveTheUploadIdOutAndOffsetZeroIsImplicit) {
  const v1::UploadChunkRequest request = Parse(ChunkHeader("", 0, "abc") + "abc");
  EXPECT_EQ(request.upload_id(), "");
  EXPECT_EQ(request.offset(), 0);
  EXPECT_EQ(request.data(), "abc");
}

TEST(ChunkUploadTest, AProbeCarriesNoData) {
  const v1::UploadChunkRequest request = Parse(ChunkHeader("u", 0, ""));
  EXPECT_EQ(request.upload_id(), "u");
  EXPECT_TRUE(request.data().empty());
  EXPECT_FALSE(request.has_crc32c());
}

TEST(ChunkUploadTest, TheSameMessageAsProtobufSerializesIt) {
  // The data goes last on the wire (protobuf puts crc32c, field 4, after it): the bytes differ
  // in field order only, and both parse to the same message.
  const std::string data(300, 'z');
  v1::UploadChunkRequest request;
  request.set_upload_id("x");
  request.set_offset(123456789);
  request.set_data(data);
  request.set_crc32c(Crc32c(data));
  EXPECT_EQ(Parse(ChunkHeader("x", 123456789, data) + data).SerializeAsString(),
            request.SerializeAsString());
}

}  // namespace
}  // namespace gradhub::checkpoint_client
