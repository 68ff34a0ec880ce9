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

// "wall": steady_clock, synchronized around each timed region on CUDA. "thread": the CPU time
// of the calling thread (CLOCK_THREAD_CPUTIME_ID), which on a busy shared CPU leaves out the time
// other processes hold the cores; it sees all the work only with one intra-op thread on CPU
// (then kernels and the CPU autograd engine run on the calling thread), which profile() checks.
enum class Clock { kWall, kThread };

struct TimingOptions {
  torch::Device device = torch::kCPU;
  Clock clock = Clock::kWall;
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
