#include "gpu_worker/models/layered.h"

namespace gradhub::models {
namespace {

torch::nn::Conv2d Conv3x3(int64_t in, int64_t out, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(false));
}

// Reads the batch as images: conv, BatchNorm, ReLU.
class StemImpl : public Layer {
 public:
  StemImpl(ImageShape image, int64_t width)
      : image_(image),
        conv_(register_module("conv", Conv3x3(image.channels, width, 1))),
        bn_(register_module("bn", torch::nn::BatchNorm2d(width))) {}

  at::Tensor forward(const at::Tensor& x) override {
    at::Tensor images = x.reshape({x.size(0), image_.channels, image_.side, image_.side});
    return torch::relu(bn_->forward(conv_->forward(images)));
  }

 private:
  ImageShape image_;
  torch::nn::Conv2d conv_;
  torch::nn::BatchNorm2d bn_;
};

// He et al.'s basic block; a 1x1 projection on the shortcut where the shape changes.
class BasicBlockImpl : public Layer {
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

  at::Tensor forward(const at::Tensor& x) override {
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

// Global average pool, then the classifier.
class HeadImpl : public Layer {
 public:
  HeadImpl(int64_t in, int64_t outputs)
      : linear_(register_module("linear", torch::nn::Linear(in, outputs))) {}

  at::Tensor forward(const at::Tensor& x) override {
    return linear_->forward(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
  }

 private:
  torch::nn::Linear linear_;
};

struct BlockShape {
  int64_t in = 0, out = 0, stride = 1;
};

// Each stage after the first halves the resolution (its first block's stride) and doubles
// the width.
std::vector<BlockShape> BlockShapes(const std::vector<int64_t>& blocks, int64_t width) {
  std::vector<BlockShape> shapes;
  int64_t in = width;
  for (size_t stage = 0; stage < blocks.size(); ++stage) {
    const int64_t out = width << stage;
    for (int64_t b = 0; b < blocks[stage]; ++b) {
      shapes.push_back({in, out, stage > 0 && b == 0 ? 2 : 1});
      in = out;
    }
  }
  return shapes;
}

}  // namespace

// Layers: the stem, each residual block, the head.
LayerPlan PlanResNet(const v1::ResNetModel& spec, const DataShape& data) {
  const ImageShape image = ResolveImageShape("model.resnet", data, spec.in_channels(), 0);
  const int64_t outputs = ResolveOutputs("model.resnet", data, spec.num_classes());
  const std::vector<int64_t> blocks = ResNetBlocks(spec);
  const int64_t width = spec.base_width() > 0 ? spec.base_width() : 16;
  const std::vector<BlockShape> shapes = BlockShapes(blocks, width);
  const int64_t features = shapes.empty() ? width : shapes.back().out;
  LayerPlan plan;
  plan.count = static_cast<int64_t>(shapes.size()) + 2;
  plan.build = [=, last = plan.count - 1](int64_t i) -> std::shared_ptr<Layer> {
    if (i == 0) return std::make_shared<StemImpl>(image, width);
    if (i == last) return std::make_shared<HeadImpl>(features, outputs);
    const BlockShape& block = shapes[i - 1];
    return std::make_shared<BasicBlockImpl>(block.in, block.out, block.stride);
  };
  int64_t depth = 2;
  for (int64_t b : blocks) depth += 2 * b;
  plan.description = "resnet-" + std::to_string(depth) + " " + std::to_string(image.channels) +
                     "x" + std::to_string(image.side) + "x" + std::to_string(image.side) +
                     " width " + std::to_string(width);
  return plan;
}

}  // namespace gradhub::models
