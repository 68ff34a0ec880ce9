#include "models/attention_mlp.h"

#include <cmath>

namespace hybridplan::models {

SelfAttentionImpl::SelfAttentionImpl(int64_t dim) {
  in_proj_weight = register_parameter("in_proj_weight", torch::randn({3 * dim, dim}) * 0.1);
  out_proj = register_module("out_proj", torch::nn::Linear(dim, dim));
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x) {
  namespace F = torch::nn::functional;
  const std::vector<torch::Tensor> qkv = F::linear(x, in_proj_weight).chunk(3, -1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(x.size(-1)));
  const torch::Tensor weights = torch::softmax(qkv[0].matmul(qkv[1].transpose(-2, -1)) * scale, -1);
  return F::linear(weights.matmul(qkv[2]), out_proj->weight, out_proj->bias);
}

torch::nn::Sequential attention_mlp(int64_t in_features, int64_t dim, int64_t out_features) {
  return torch::nn::Sequential(torch::nn::Linear(in_features, dim), SelfAttention(dim),
                               torch::nn::ReLU(), torch::nn::Linear(dim, out_features));
}

}  // namespace hybridplan::models
