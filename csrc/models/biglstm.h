// BigLSTM-style language model, the C++ twin of python/hybridplan/models.py BigLstm: the same
// layers, registered names, shapes and defaults, so the C++ and Python profiles have the same
// nodes ("embed", "lstm0", "lstm1", "softmax"), edges and bytes, and a plan made from either
// applies to both.
//   embed    Embedding(vocab_size, embed_size)
//   lstm0    LSTM(embed_size, hidden_size, proj_size = embed_size, batch_first)
//   lstm1    LSTM(embed_size, hidden_size, proj_size = embed_size, batch_first)
//   softmax  Linear(embed_size, vocab_size)
// Input: token ids [batch, seq_len] (int64); output: next-token logits [batch, seq_len, vocab].
#pragma once
#include <cstdint>

#include <torch/torch.h>

#include "profiler/block_list.h"

namespace hybridplan::models {

struct BigLstmOptions {
  int64_t vocab_size = 4096;
  int64_t embed_size = 64;
  int64_t hidden_size = 128;
  int64_t seq_len = 16;
};

// A BlockList because an LSTM returns (output, (h, c)), which a Sequential cannot chain.
class BigLstmImpl : public torch::nn::Module, public BlockList {
 public:
  explicit BigLstmImpl(const BigLstmOptions& options = {});
  torch::Tensor forward(const torch::Tensor& tokens);
  std::vector<Block> blocks() override;
  // Uniform random token ids [batch_size, seq_len] from the global torch generator.
  torch::Tensor example_inputs(int64_t batch_size) const;

  torch::nn::Embedding embed{nullptr};
  torch::nn::LSTM lstm0{nullptr}, lstm1{nullptr};
  torch::nn::Linear softmax{nullptr};

 private:
  BigLstmOptions options_;
};
TORCH_MODULE(BigLstm);

}  // namespace hybridplan::models
