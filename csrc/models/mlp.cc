#include "models/mlp.h"

#include "common/error.h"

namespace hybridplan::models {

torch::nn::Sequential mlp(const std::vector<int64_t>& widths) {
  if (widths.size() < 2) {
    throw_input_error("models::mlp", "widths", "must hold at least 2 entries (in, out)",
                      std::to_string(widths.size()) + " entries");
  }
  for (size_t i = 0; i < widths.size(); ++i) {
    if (widths[i] <= 0) {
      throw_input_error("models::mlp", "widths[" + std::to_string(i) + "]", "must be > 0",
                        std::to_string(widths[i]));
    }
  }
  torch::nn::Sequential net;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    net->push_back(torch::nn::Linear(widths[i], widths[i + 1]));
    if (i + 2 < widths.size()) net->push_back(torch::nn::ReLU());
  }
  return net;
}

}  // namespace hybridplan::models
