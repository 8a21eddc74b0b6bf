#include "gpu_worker/models/architectures.h"

namespace gradhub::models {
namespace {

// LeNet-style: each stage is a 5x5 convolution (padded, so tiny images survive) and a 2x2
// max-pool while the image is still at least 2 pixels wide; then one hidden layer.
class CnnImpl : public torch::nn::Module {
 public:
  CnnImpl(ImageShape image, const std::vector<int64_t>& channels, int64_t hidden, int64_t outputs,
          double dropout)
      : image_(image), dropout_(dropout) {
    int64_t in = image.channels, side = image.side;
    for (size_t i = 0; i < channels.size(); ++i) {
      convs_.push_back(register_module(
          "conv" + std::to_string(i),
          torch::nn::Conv2d(torch::nn::Conv2dOptions(in, channels[i], 5).padding(2))));
      pools_.push_back(side >= 2);
      if (side >= 2) side /= 2;
      in = channels[i];
    }
    fc1_ = register_module("fc1", torch::nn::Linear(in * side * side, hidden));
    fc2_ = register_module("fc2", torch::nn::Linear(hidden, outputs));
  }

  at::Tensor forward(at::Tensor x) {
    x = x.reshape({x.size(0), image_.channels, image_.side, image_.side});
    for (size_t i = 0; i < convs_.size(); ++i) {
      x = torch::relu(convs_[i]->forward(x));
      if (pools_[i]) x = torch::max_pool2d(x, 2);
    }
    x = torch::relu(fc1_->forward(x.flatten(1)));
    if (dropout_ > 0) x = torch::dropout(x, dropout_, is_training());
    return fc2_->forward(x);
  }

 private:
  ImageShape image_;
  double dropout_;
  std::vector<torch::nn::Conv2d> convs_;
  std::vector<bool> pools_;
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr};
};

}  // namespace

std::unique_ptr<Model> BuildCnn(const v1::CnnModel& spec, const DataShape& data) {
  const ImageShape image =
      ResolveImageShape("model.cnn", data, spec.in_channels(), spec.image_size());
  const int64_t outputs = ResolveOutputs("model.cnn", data, spec.num_classes());
  std::vector<int64_t> channels(spec.channels().begin(), spec.channels().end());
  if (channels.empty()) channels = {6, 16};
  const int64_t hidden = spec.hidden() > 0 ? spec.hidden() : 120;
  std::string stages;
  for (int64_t c : channels) stages += (stages.empty() ? "" : "-") + std::to_string(c);
  return MakeModel(std::make_shared<CnnImpl>(image, channels, hidden, outputs, spec.dropout()),
                   "cnn " + std::to_string(image.channels) + "x" + std::to_string(image.side) +
                       "x" + std::to_string(image.side) + " conv " + stages + " fc " +
                       std::to_string(hidden) + "-" + std::to_string(outputs));
}

}  // namespace gradhub::models
