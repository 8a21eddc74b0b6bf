#include "services/common/background_sha256.h"

#include <string_view>
#include <utility>

namespace gradhub {

void BackgroundSha256::Update(std::shared_ptr<const std::string> chunk, size_t from) {
  if (chunk == nullptr || from >= chunk->size()) return;
  const size_t bytes = chunk->size() - from;
  worker_.Submit(bytes, [this, chunk = std::move(chunk), from] {
    sha_.Update(std::string_view(*chunk).substr(from));
  });
}

std::string BackgroundSha256::Hex() {
  worker_.Drain();
  return sha_.Hex();
}

}  // namespace gradhub
