#include "gpu_worker/models/layered.h"

namespace gradhub::models {
namespace {

// LeNet-style: each conv unit is a 5x5 convolution (padded, so tiny images survive), a ReLU and
// a 2x2 max-pool while the image is still at least 2 pixels wide; then one hidden layer.
struct ConvUnit {
  int64_t in = 0, out = 0;
  bool pool = false;
};

// One conv unit; the first also reads the batch as images.
class ConvLayerImpl : public Layer {
 public:
  ConvLayerImpl(ConvUnit unit, std::optional<ImageShape> image)
      : unit_(unit),
        image_(image),
        conv_(register_module(
            "conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(unit.in, unit.out, 5).padding(2)))) {
  }

  at::Tensor forward(const at::Tensor& input) override {
    at::Tensor x = input;
    if (image_) x = x.reshape({x.size(0), image_->channels, image_->side, image_->side});
    x = torch::relu(conv_->forward(x));
    return unit_.pool ? torch::max_pool2d(x, 2) : x;
  }

 private:
  ConvUnit unit_;
  std::optional<ImageShape> image_;
  torch::nn::Conv2d conv_;
};

// The conv units' shapes, and the features the last one leaves.
std::vector<ConvUnit> ConvUnits(ImageShape image, const std::vector<int64_t>& channels,
                                int64_t* features) {
  std::vector<ConvUnit> units;
  int64_t in = image.channels, side = image.side;
  for (int64_t out : channels) {
    units.push_back({in, out, side >= 2});
    if (side >= 2) side /= 2;
    in = out;
  }
  *features = in * side * side;
  return units;
}

}  // namespace

// Layers: the conv units, the hidden Linear (ReLU, dropout), the output Linear.
LayerPlan PlanCnn(const v1::CnnModel& spec, const DataShape& data) {
  const ImageShape image =
      ResolveImageShape("model.cnn", data, spec.in_channels(), spec.image_size());
  const int64_t outputs = ResolveOutputs("model.cnn", data, spec.num_classes());
  const std::vector<int64_t> channels = CnnChannels(spec);
  const int64_t hidden = spec.hidden() > 0 ? spec.hidden() : 120;
  int64_t features = 0;
  const std::vector<ConvUnit> units = ConvUnits(image, channels, &features);
  const auto convs = static_cast<int64_t>(units.size());
  LayerPlan plan;
  plan.count = convs + 2;
  plan.build = [=, dropout = double{spec.dropout()}](int64_t i) -> std::shared_ptr<Layer> {
    if (i < convs) {
      return std::make_shared<ConvLayerImpl>(units[i],
                                             i == 0 ? std::optional(image) : std::nullopt);
    }
    if (i == convs) {
      return std::make_shared<DenseLayerImpl>(
          DenseLayerImpl::Options{features, hidden, /*flatten=*/true, v1::MlpModel::RELU, dropout});
    }
    return std::make_shared<DenseLayerImpl>(
        DenseLayerImpl::Options{hidden, outputs, /*flatten=*/false, std::nullopt, 0});
  };
  std::string stages;
  for (int64_t c : channels) stages += (stages.empty() ? "" : "-") + std::to_string(c);
  plan.description = "cnn " + std::to_string(image.channels) + "x" + std::to_string(image.side) +
                     "x" + std::to_string(image.side) + " conv " + stages + " fc " +
                     std::to_string(hidden) + "-" + std::to_string(outputs);
  return plan;
}

}  // namespace gradhub::models
