#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "gpu_worker/data/tensor_dataset.h"

namespace gradhub::data {

// Classification: Gaussian blobs around seeded class centers. Regression: a seeded linear
// function of Gaussian inputs. The generator is private, so every rank draws the same data.
std::unique_ptr<TensorDataset> MakeSynthetic(const v1::SyntheticDataset& spec, uint64_t seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t n = spec.num_samples();
  const int64_t features = spec.num_features();
  DataShape shape;
  shape.sample_shape = {features};
  at::Tensor inputs, targets;
  if (spec.task() == v1::SyntheticDataset::CLASSIFICATION) {
    const int64_t classes = spec.num_classes();
    const at::Tensor centers = at::randn({classes, features}, generator, at::kFloat) * 2.0;
    targets = at::randint(classes, {n}, generator, at::kLong);
    inputs = centers.index_select(0, targets) +
             spec.noise() * at::randn({n, features}, generator, at::kFloat);
    shape.task = Task::kClassification;
    shape.num_classes = classes;
  } else {
    const at::Tensor weights = at::randn({features}, generator, at::kFloat);
    inputs = at::randn({n, features}, generator, at::kFloat);
    targets = inputs.matmul(weights) + spec.noise() * at::randn({n}, generator, at::kFloat);
    shape.task = Task::kRegression;
  }
  return std::make_unique<TensorDataset>(std::move(inputs), std::move(targets), std::move(shape));
}

}  // namespace gradhub::data
