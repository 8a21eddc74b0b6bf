#include "services/common/background_sha256.h"

#include <utility>

namespace gradhub {

void BackgroundSha256::Update(std::string piece) {
  if (piece.empty()) return;
  const size_t bytes = piece.size();
  worker_.Submit(bytes, [this, piece = std::move(piece)] { sha_.Update(piece); });
}

std::string BackgroundSha256::Hex() {
  worker_.Drain();
  return sha_.Hex();
}

}  // namespace gradhub
