#include "services/common/blob_check.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "services/common/crc32c.h"
#include "services/common/sha256.h"

namespace gradhub {

BlobCheck::BlobCheck(std::string sha256, std::optional<uint32_t> crc32c)
    : sha256_(std::move(sha256)), crc32c_(crc32c) {
  if (!crc32c_.has_value()) sha_ = std::make_unique<BackgroundSha256>();
}

void BlobCheck::Update(std::string* piece) {
  if (crc32c_.has_value()) {
    crc32c_so_far_ = Crc32cExtend(crc32c_so_far_, *piece);
  } else {
    sha_->Update(std::move(*piece));
  }
}

bool BlobCheck::Matches() {
  return crc32c_.has_value() ? crc32c_so_far_ == *crc32c_ : sha_->Hex() == sha256_;
}

std::string BlobCheck::Expected() const {
  return crc32c_.has_value() ? absl::StrFormat("crc32c %08x", *crc32c_) : "sha256 " + sha256_;
}

void BlobDigester::Update(std::string_view data) {
  if (sha256_) sha_.Update(data);
  crc32c_ = Crc32cExtend(crc32c_, data);
}

BlobDigests BlobDigester::Digests() const { return {crc32c_, sha256_ ? sha_.Hex() : ""}; }

bool BlobMatches(std::string_view bytes, const std::string& sha256,
                 std::optional<uint32_t> crc32c) {
  return crc32c.has_value() ? Crc32c(bytes) == *crc32c : Sha256Hex(bytes) == sha256;
}

}  // namespace gradhub
