// Timing one block alone: the forward and backward seconds that become a graph node's
// forward_s and backward_s.
#pragma once
#include <vector>

#include <torch/torch.h>

#include "profiler/block_list.h"

namespace hybridplan {

struct BlockTimes {
  double forward_s = 0;   // median forward seconds, autograd recording
  double backward_s = 0;  // median seconds of torch::autograd::grad on the output; 0 when
                          // nothing upstream of the output requires a gradient
};

struct TimingOptions {
  torch::Device device = torch::kCPU;  // synchronized around each timed region when CUDA
  int warmup = 3;
  int repeats = 11;
};

// Per repeat: detach `inputs` (floating ones get requires_grad when `input_requires_grad`), time
// block.forward, then time torch::autograd::grad(output, {grad inputs, block parameters},
// grad_output = ones). Gradients are returned, never accumulated into .grad, so repeats are
// independent and the module's .grad fields are untouched.
BlockTimes time_block(const Block& block, const std::vector<torch::Tensor>& inputs,
                      bool input_requires_grad, const TimingOptions& options);

// Median of `samples_s` (mean of the middle two for an even count); requires a non-empty vector.
double median_s(std::vector<double> samples_s);

}  // namespace hybridplan
