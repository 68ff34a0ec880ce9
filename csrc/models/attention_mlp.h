// A small model whose attention holds a parameter itself and reads its child's weight without
// calling the child, the shape of torch::nn::MultiheadAttention (in_proj_weight, out_proj): by
// the node rule (profiler/block_list.h) such a module is one graph node with everything inside
// it. Python twin: tests/python/test_node_rule.py AttentionMlp (same names and shapes); the
// parity test there checks that both profilers give the same nodes.
//   0 Linear(in_features, dim)   1 SelfAttention(dim)   2 ReLU   3 Linear(dim, out_features)
// Input: [batch, seq_len, in_features] floats.
#pragma once
#include <cstdint>

#include <torch/torch.h>

namespace hybridplan::models {

// Single-head self-attention: q, k, v = x in_proj_weight^T (chunked in 3), softmax(q k^T /
// sqrt(dim)) v, then out_proj's weight and bias applied with torch::nn::functional::linear.
class SelfAttentionImpl : public torch::nn::Module {
 public:
  explicit SelfAttentionImpl(int64_t dim);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor in_proj_weight;
  torch::nn::Linear out_proj{nullptr};
};
TORCH_MODULE(SelfAttention);

torch::nn::Sequential attention_mlp(int64_t in_features = 8, int64_t dim = 16,
                                    int64_t out_features = 4);

}  // namespace hybridplan::models
