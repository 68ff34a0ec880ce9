// Timing a chain of blocks: the forward and backward seconds that become the graph nodes'
// forward_s and backward_s.
#pragma once
#include <vector>

#include <torch/torch.h>

#include "profiler/block_list.h"

namespace hybridplan {

struct ChainTimes {
  std::vector<double> forward_s;   // per block, median seconds of its share of a step's forward
  std::vector<double> backward_s;  // per block, of the backward; 0 when no gradient reaches it
};

// "wall": steady_clock, synchronized at every mark on CUDA. "thread": the CPU time of the
// calling thread (CLOCK_THREAD_CPUTIME_ID), which on a busy shared CPU leaves out the time other
// processes hold the cores; it sees all the work only with one intra-op thread on CPU (then
// kernels and the CPU autograd engine run on the calling thread), which profile() checks.
enum class Clock { kWall, kThread };

struct TimingOptions {
  torch::Device device = torch::kCPU;
  Clock clock = Clock::kWall;
  int warmup = 3;
  int repeats = 11;
};

// Runs `warmup + repeats` training steps of the chain (block 0 on `inputs`, block i + 1 on block
// i's `next`; backward from the last block's `next` with a ones gradient, the gradient of its
// sum) and splits each step among the blocks the way the Python profiler's StepTimer
// (python/hybridplan/profiler/block_timing.py) splits a step among modules, so that the two
// profilers measure the same thing:
//   - forward: the clock is read when each block returns; the interval since the previous
//     block returned is the block's;
//   - backward: a hook on each block's output (Tensor::register_hook, which the autograd engine
//     runs when that output's gradient is complete, just before the block's own backward
//     starts) reads the clock; the interval from there to the next block's hook is the block's,
//     and the seed's time goes to the last block.
// Gradients are computed with torch::autograd::grad with respect to all parameters and
// returned, never accumulated into .grad, so the module's .grad fields are untouched. Per block
// the result is the median over the `repeats` recorded steps.
ChainTimes time_chain(const std::vector<Block>& blocks, const std::vector<torch::Tensor>& inputs,
                      const TimingOptions& options);

// Median of `samples_s` (mean of the middle two for an even count); requires a non-empty vector.
double median_s(std::vector<double> samples_s);

}  // namespace hybridplan
