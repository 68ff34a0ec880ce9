// A multilayer perceptron as a torch::nn::Sequential, the simplest model the profiler and the
// executor handle: children "0", "1", ... alternate Linear and ReLU (no ReLU after the last).
#pragma once
#include <cstdint>
#include <vector>

#include <torch/torch.h>

namespace hybridplan::models {

// widths = {in_features, hidden..., out_features}, at least two entries, all > 0:
// Linear(w0, w1), ReLU, Linear(w1, w2), ReLU, ..., Linear(w[n-2], w[n-1]).
// Python twin: torch.nn.Sequential of the same layers (same names, shapes and bytes).
torch::nn::Sequential mlp(const std::vector<int64_t>& widths);

}  // namespace hybridplan::models
