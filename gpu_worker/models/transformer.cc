#include <algorithm>
#include <cmath>

#include "gpu_worker/models/layered.h"
#include "services/common/contract/user_error.h"

namespace gradhub::models {
namespace {

struct TransformerShape {
  int64_t vocab, context, width, layers, heads, mlp_width;
  double dropout;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const TransformerShape& s)
      : heads_(s.heads),
        dropout_(s.dropout),
        qkv_(register_module("qkv", torch::nn::Linear(s.width, 3 * s.width))),
        projection_(register_module("projection", torch::nn::Linear(s.width, s.width))) {}

  at::Tensor forward(const at::Tensor& x) {
    const int64_t batch = x.size(0), time = x.size(1), width = x.size(2);
    const int64_t head_width = width / heads_;
    // [batch, time, 3, heads, head_width] -> three [batch, heads, time, head_width]
    std::vector<at::Tensor> qkv = qkv_->forward(x)
                                      .view({batch, time, 3, heads_, head_width})
                                      .permute({2, 0, 3, 1, 4})
                                      .unbind(0);
    at::Tensor scores = torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) /
                        std::sqrt(static_cast<double>(head_width));
    const at::Tensor future =
        torch::ones({time, time}, torch::TensorOptions().dtype(torch::kBool).device(x.device()))
            .triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    at::Tensor attention = torch::softmax(scores, -1);
    if (dropout_ > 0) attention = torch::dropout(attention, dropout_, is_training());
    at::Tensor y = torch::matmul(attention, qkv[2]).transpose(1, 2).reshape({batch, time, width});
    return projection_->forward(y);
  }

 private:
  int64_t heads_;
  double dropout_;
  torch::nn::Linear qkv_, projection_;
};
TORCH_MODULE(CausalSelfAttention);

// Pre-LayerNorm block (GPT-2): residual stream, attention, then a GELU feed-forward.
class BlockImpl : public Layer {
 public:
  explicit BlockImpl(const TransformerShape& s)
      : dropout_(s.dropout),
        norm1_(
            register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})))),
        attention_(register_module("attention", CausalSelfAttention(s))),
        norm2_(
            register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})))),
        fc1_(register_module("fc1", torch::nn::Linear(s.width, s.mlp_width))),
        fc2_(register_module("fc2", torch::nn::Linear(s.mlp_width, s.width))) {}

  at::Tensor forward(const at::Tensor& input) override {
    at::Tensor x = input + Dropout(attention_->forward(norm1_->forward(input)));
    return x + Dropout(fc2_->forward(torch::gelu(fc1_->forward(norm2_->forward(x)))));
  }

 private:
  at::Tensor Dropout(const at::Tensor& x) {
    return dropout_ > 0 ? torch::dropout(x, dropout_, is_training()) : x;
  }

  double dropout_;
  torch::nn::LayerNorm norm1_;
  CausalSelfAttention attention_;
  torch::nn::LayerNorm norm2_;
  torch::nn::Linear fc1_, fc2_;
};

// Tokens to vectors: a token embedding plus a learned position embedding (GPT-2's scale of
// 0.02 for both; unit-variance embeddings train slower).
class EmbeddingImpl : public Layer {
 public:
  explicit EmbeddingImpl(const TransformerShape& s)
      : context_(s.context),
        dropout_(s.dropout),
        tokens_(register_module("tokens", torch::nn::Embedding(s.vocab, s.width))),
        positions_(register_parameter("positions", torch::randn({s.context, s.width}) * 0.02)) {
    torch::NoGradGuard no_grad;
    tokens_->weight.normal_(0, 0.02);
  }

  at::Tensor forward(const at::Tensor& x) override {
    const int64_t time = x.size(1);
    TORCH_CHECK(time <= context_, "sequence of ", time, " tokens exceeds the context of ",
                context_);
    at::Tensor h = tokens_->forward(x) + positions_.narrow(0, 0, time);
    return dropout_ > 0 ? torch::dropout(h, dropout_, is_training()) : h;
  }

 private:
  int64_t context_;
  double dropout_;
  torch::nn::Embedding tokens_;
  at::Tensor positions_;
};

// The final LayerNorm and the next-token logits.
class OutputImpl : public Layer {
 public:
  explicit OutputImpl(const TransformerShape& s)
      : norm_(
            register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({s.width})))),
        head_(register_module("head", torch::nn::Linear(s.width, s.vocab))) {}

  at::Tensor forward(const at::Tensor& x) override { return head_->forward(norm_->forward(x)); }

 private:
  torch::nn::LayerNorm norm_;
  torch::nn::Linear head_;
};

}  // namespace

// Layers: the embedding, each block, the output.
LayerPlan PlanTransformer(const v1::TransformerModel& spec, const DataShape& data) {
  if (data.task != Task::kLanguageModel) {
    throw UserError("model.transformer",
                    "is a character language model and needs a text "
                    "dataset; this one has samples of shape " +
                        ShapeString(data.sample_shape));
  }
  if (spec.heads() <= 0 || spec.d_model() % spec.heads() != 0) {
    throw UserError(
        "model.transformer.heads",
        std::to_string(spec.heads()) + " does not divide dModel " + std::to_string(spec.d_model()));
  }
  if (spec.vocab_size() > 0 && spec.vocab_size() < data.vocab_size) {
    throw UserError("model.transformer.vocabSize",
                    std::to_string(spec.vocab_size()) + " but the text has " +
                        std::to_string(data.vocab_size) + " distinct characters");
  }
  TransformerShape s;
  s.vocab = spec.vocab_size() > 0 ? spec.vocab_size() : data.vocab_size;
  s.context = spec.context_length();
  s.width = spec.d_model();
  s.layers = spec.layers();
  s.heads = spec.heads();
  s.mlp_width = (spec.mlp_ratio() > 0 ? spec.mlp_ratio() : 4) * s.width;
  s.dropout = spec.dropout();
  LayerPlan plan;
  plan.count = std::max<int64_t>(s.layers, 0) + 2;
  plan.build = [s, last = plan.count - 1](int64_t i) -> std::shared_ptr<Layer> {
    if (i == 0) return std::make_shared<EmbeddingImpl>(s);
    if (i == last) return std::make_shared<OutputImpl>(s);
    return std::make_shared<BlockImpl>(s);
  };
  plan.description = "transformer " + std::to_string(s.layers) + " layers, width " +
                     std::to_string(s.width) + ", " + std::to_string(s.heads) + " heads, context " +
                     std::to_string(s.context) + ", vocabulary " + std::to_string(s.vocab);
  return plan;
}

}  // namespace gradhub::models
