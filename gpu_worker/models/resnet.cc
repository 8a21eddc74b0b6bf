#include "gpu_worker/models/architectures.h"

namespace gradhub::models {
namespace {

torch::nn::Conv2d Conv3x3(int64_t in, int64_t out, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

// He et al.'s basic block; a 1x1 projection on the shortcut where the shape changes.
class BasicBlockImpl : public torch::nn::Module {
 public:
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1_(register_module("conv1", Conv3x3(in, out, stride))),
        bn1_(register_module("bn1", torch::nn::BatchNorm2d(out))),
        conv2_(register_module("conv2", Conv3x3(out, out, 1))),
        bn2_(register_module("bn2", torch::nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      shortcut_ = register_module(
          "shortcut",
          torch::nn::Sequential(
              torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
              torch::nn::BatchNorm2d(out)));
    }
  }

  at::Tensor forward(const at::Tensor& x) {
    at::Tensor y = torch::relu(bn1_->forward(conv1_->forward(x)));
    y = bn2_->forward(conv2_->forward(y));
    return torch::relu(y + (shortcut_ ? shortcut_->forward(x) : x));
  }

 private:
  torch::nn::Conv2d conv1_;
  torch::nn::BatchNorm2d bn1_;
  torch::nn::Conv2d conv2_;
  torch::nn::BatchNorm2d bn2_;
  torch::nn::Sequential shortcut_{nullptr};
};
TORCH_MODULE(BasicBlock);

class ResNetImpl : public torch::nn::Module {
 public:
  ResNetImpl(ImageShape image, const std::vector<int64_t>& blocks, int64_t width, int64_t outputs)
      : image_(image),
        stem_(register_module("stem", Conv3x3(image.channels, width, 1))),
        stem_bn_(register_module("stem_bn", torch::nn::BatchNorm2d(width))),
        stages_(register_module("stages", torch::nn::Sequential())) {
    int64_t in = width;
    for (size_t stage = 0; stage < blocks.size(); ++stage) {
      const int64_t out = width << stage;
      for (int64_t b = 0; b < blocks[stage]; ++b) {
        stages_->push_back(BasicBlock(in, out, stage > 0 && b == 0 ? 2 : 1));
        in = out;
      }
    }
    head_ = register_module("head", torch::nn::Linear(in, outputs));
  }

  at::Tensor forward(at::Tensor x) {
    x = x.reshape({x.size(0), image_.channels, image_.side, image_.side});
    x = torch::relu(stem_bn_->forward(stem_->forward(x)));
    x = stages_->forward(x);
    return head_->forward(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
  }

 private:
  ImageShape image_;
  torch::nn::Conv2d stem_;
  torch::nn::BatchNorm2d stem_bn_;
  torch::nn::Sequential stages_;
  torch::nn::Linear head_{nullptr};
};

}  // namespace

std::unique_ptr<Model> BuildResNet(const v1::ResNetModel& spec, const DataShape& data) {
  const ImageShape image = ResolveImageShape("model.resnet", data, spec.in_channels(), 0);
  const int64_t outputs = ResolveOutputs("model.resnet", data, spec.num_classes());
  std::vector<int64_t> blocks(spec.blocks_per_stage().begin(), spec.blocks_per_stage().end());
  if (blocks.empty()) blocks = {3, 3, 3};
  const int64_t width = spec.base_width() > 0 ? spec.base_width() : 16;
  int64_t depth = 2;
  for (int64_t b : blocks) depth += 2 * b;
  return MakeModel(std::make_shared<ResNetImpl>(image, blocks, width, outputs),
                   "resnet-" + std::to_string(depth) + " " + std::to_string(image.channels) + "x" +
                       std::to_string(image.side) + "x" + std::to_string(image.side) + " width " +
                       std::to_string(width));
}

}  // namespace gradhub::models
