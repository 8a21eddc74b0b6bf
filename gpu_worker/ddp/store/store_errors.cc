#include "gpu_worker/ddp/store/store_errors.h"

#include <charconv>

#include "gpu_worker/ddp/store.h"

namespace gradhub::ddp {

std::string DescribeTimeout(const std::vector<std::string>& missing,
                            std::chrono::milliseconds timeout) {
  std::string text =
      "timed out after " + std::to_string(timeout.count()) + " ms waiting for store keys:";
  for (size_t i = 0; i < missing.size(); ++i) text += (i == 0 ? " " : ", ") + missing[i];
  return text;
}

int64_t ParseCounter(const std::string& key, const std::string& text) {
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    throw StoreError("store key " + key + " holds a value, not a counter");
  }
  return value;
}

}  // namespace gradhub::ddp
