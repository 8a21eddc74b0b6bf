#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gradhub {

// What a model is trained to do; chooses the loss and the evaluation metrics.
enum class Task { kClassification, kRegression, kLanguageModel };

// What a dataset yields, as much as a model needs to know to size its layers: datasets
// describe themselves with it and models check it against their own spec.
struct DataShape {
  Task task = Task::kClassification;
  // One sample's input shape, without the batch dimension: {64} for a feature vector,
  // {1, 28, 28} for an image, {context_length} for a text window (token ids).
  std::vector<int64_t> sample_shape;
  int64_t num_classes = 0;  // kClassification
  int64_t vocab_size = 0;   // kLanguageModel
};

// "[1, 28, 28]", for error messages.
inline std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace gradhub
