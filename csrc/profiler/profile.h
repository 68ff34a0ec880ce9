// profile(): measures a LibTorch module into a hybridplan::Graph, one node per block.
//
// Route (the C++ frontend has no forward hooks, and Module::forward is not virtual):
//   1. Split the module into named blocks (block_list.h): the leaves of nested
//      Sequential/ModuleList/ModuleDict containers, or a BlockList's own blocks. Node names are
//      the blocks' qualified names ("0", "features.3"), the names the Python profiler gives the
//      same leaves, so a plan made from either profile applies to either twin.
//   2. Run the blocks one by one under NoGradGuard, feeding each its predecessor's output, to
//      check them and record output bytes. A block that throws (wrong input shape, say) becomes
//      an InputError naming the block and the shape it got.
//   3. Time whole training steps of the chain and split each among the blocks
//      (block_timing.h): the forward at the points where each block returns, the backward at
//      hooks on each block's output (Tensor::register_hook: the autograd engine runs them, so
//      they need no forward hook), as the Python profiler splits a step among modules. So each
//      block is timed as training runs it, in place (its weights not left warm in the cache by
//      a previous repeat, the previous block's backward just done), and the first blocks
//      compute no input gradient. forward_s and backward_s are the medians over `repeats`
//      steps after `warmup` unrecorded ones.
//   4. The same timing at smaller batch sizes (ProfileOptions::batch_sizes) gives each node its
//      batch_times, as the Python profiler does.
//   5. On glibc, while profiling, freed memory stays in the process (retain_freed_memory) so
//      that the times are the ops' and not the kernel's page faults; see ProfileOptions.
//
// Edges are block i -> i+1 carrying the bytes of the tensor block i passes on: dataflow is taken
// to be sequential, so a branchy module is profiled as one node per top-level block (put each
// branch structure in one block). param_bytes counts the block's parameters (not buffers);
// output_bytes is numel * element size summed over all its results (BlockOutput: `next` and
// `unused`), as the Python profiler counts a module's whole output. The module is moved to `options.device` and left there;
// its train/eval mode is left as the caller set it.
#pragma once
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/profile_defaults.h"
#include "planner/documents/graph.h"
#include "profiler/block_list.h"

namespace hybridplan {

struct ProfileOptions {
  std::string name = "model";  // the graph's name
  std::string device = "cpu";  // any torch device string: "cpu", "cuda:0", ...
  int64_t batch_size = 0;      // profiled.batch_size; 0: size(0) of the first input
  int warmup = kDefaultProfileWarmup;    // unrecorded runs per block before timing
  int repeats = kDefaultProfileRepeats;  // recorded runs per block; times are their median
  std::string clock = "wall";  // "wall" or "thread" (block_timing.h; thread: CPU, 1 thread)
  // glibc's malloc returns big freed blocks (from 128 KiB, a threshold it then adapts) to the
  // kernel, and the next allocation of that size page-faults on every page: up to several ms
  // per step on a tensor of a few MiB, charged to whichever op allocated, and differing from
  // process to process with the allocation history. A caching allocator (CUDA's, or
  // jemalloc/tcmalloc on CPU) never does this. true: raise glibc's mmap and trim thresholds
  // (mallopt) to 1 GiB before timing, so freed memory is reused without faults; this setting is
  // process-wide and stays after profile() returns (a process may then hold up to 1 GiB of
  // freed memory). No effect on other C libraries.
  bool retain_freed_memory = true;
  // The other batch sizes each block is also measured at (the graph's batch_times, from which
  // the planner takes a block's time at any micro-batch): the first inputs' rows sliced to each
  // size. auto_batch_sizes: default_profile_batch_sizes(batch) (planner/costs/compute_cost.h), smallest
  // first, until batch_time_budget_s of measuring them is spent; else `batch_sizes` (each in
  // 1..batch-1), which may be empty.
  bool auto_batch_sizes = true;
  std::vector<int64_t> batch_sizes;
  double batch_time_budget_s = 60;
};

// Profiles `module` (see the file comment) on `inputs` (the model's example inputs, 1 to 3
// tensors). Throws InputError for a module with no blocks or no parameters, a block that fails
// on its input, a device that does not exist, or bad options (a "thread" clock needs the CPU
// and torch::get_num_threads() == 1).
Graph profile(torch::nn::Module& module, const std::vector<torch::Tensor>& inputs,
              const ProfileOptions& options = {});

// Same for a holder such as torch::nn::Sequential.
template <typename Impl>
Graph profile(torch::nn::ModuleHolder<Impl>& module, const std::vector<torch::Tensor>& inputs,
              const ProfileOptions& options = {}) {
  return profile(*module, inputs, options);
}

// Profiles an explicit list of blocks (their modules are moved to options.device).
Graph profile_blocks(const std::vector<Block>& blocks, const std::vector<torch::Tensor>& inputs,
                     const ProfileOptions& options = {});

}  // namespace hybridplan
