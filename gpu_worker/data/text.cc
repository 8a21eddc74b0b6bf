#include <ATen/ATen.h>

#include <array>

#include "gpu_worker/data/tensor_dataset.h"
#include "services/common/contract/user_error.h"

namespace gradhub::data {

// Characters are bytes (UTF-8 text becomes its bytes), mapped to dense ids in byte order, so
// the vocabulary is the same on every rank and independent of where a byte first appears.
std::unique_ptr<TextWindows> ReadText(const v1::TextDataset& spec, int64_t context_length) {
  const std::string text = ReadFileContents(spec.path(), "dataset.text.path");
  if (static_cast<int64_t>(text.size()) < 2 * (context_length + 1)) {
    throw UserError("dataset.text.path", spec.path() + " has " + std::to_string(text.size()) +
                                             " bytes; a context of " +
                                             std::to_string(context_length) + " needs at least " +
                                             std::to_string(2 * (context_length + 1)));
  }
  std::array<int64_t, 256> id;
  id.fill(-1);
  for (unsigned char c : text) id[c] = 0;
  int64_t vocab = 0;
  for (int64_t& slot : id) {
    if (slot == 0) slot = vocab++;
  }
  std::vector<int64_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = id[static_cast<unsigned char>(text[i])];
  return std::make_unique<TextWindows>(at::tensor(tokens, at::kLong), context_length, vocab);
}

}  // namespace gradhub::data
