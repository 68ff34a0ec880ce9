#include "models/biglstm.h"

#include "common/error.h"

namespace hybridplan::models {
namespace {

namespace nn = torch::nn;

nn::LSTMOptions projected_lstm(const BigLstmOptions& o) {
  return nn::LSTMOptions(o.embed_size, o.hidden_size).proj_size(o.embed_size).batch_first(true);
}

// The block for one LSTM: its output sequence feeds the next layer; the final (h, c) are
// results nobody reads, counted in output_bytes as the Python profiler counts them.
BlockOutput run_lstm(nn::LSTM& lstm, const torch::Tensor& x) {
  auto [output, state] = lstm(x);
  return {output, {std::get<0>(state), std::get<1>(state)}};
}

}  // namespace

BigLstmImpl::BigLstmImpl(const BigLstmOptions& options) : options_(options) {
  const std::pair<const char*, int64_t> sizes[] = {{"vocab_size", options.vocab_size},
                                                    {"embed_size", options.embed_size},
                                                    {"hidden_size", options.hidden_size},
                                                    {"seq_len", options.seq_len}};
  for (const auto& [field, value] : sizes) {
    if (value <= 0) {
      throw_input_error("models::biglstm", std::string("options.") + field, "must be > 0",
                        std::to_string(value));
    }
  }
  embed = register_module("embed", nn::Embedding(options.vocab_size, options.embed_size));
  lstm0 = register_module("lstm0", nn::LSTM(projected_lstm(options)));
  lstm1 = register_module("lstm1", nn::LSTM(projected_lstm(options)));
  softmax = register_module("softmax", nn::Linear(options.embed_size, options.vocab_size));
}

torch::Tensor BigLstmImpl::forward(const torch::Tensor& tokens) {
  torch::Tensor x = std::get<0>(lstm0(embed(tokens)));
  x = std::get<0>(lstm1(x));
  return softmax(x);
}

std::vector<Block> BigLstmImpl::blocks() {
  return {
      {"embed", "", embed.ptr(), [this](const auto& x) { return BlockOutput(embed(x[0])); }},
      {"lstm0", "", lstm0.ptr(), [this](const auto& x) { return run_lstm(lstm0, x[0]); }},
      {"lstm1", "", lstm1.ptr(), [this](const auto& x) { return run_lstm(lstm1, x[0]); }},
      {"softmax", "", softmax.ptr(), [this](const auto& x) { return BlockOutput(softmax(x[0])); }},
  };
}

torch::Tensor BigLstmImpl::example_inputs(int64_t batch_size) const {
  return torch::randint(options_.vocab_size, {batch_size, options_.seq_len});
}

}  // namespace hybridplan::models
