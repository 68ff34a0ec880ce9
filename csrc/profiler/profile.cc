#include "profiler/profile.h"

#include <algorithm>
#include <chrono>

#include <stdlib.h>
#include <unistd.h>

#include <optional>

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <sstream>

#include <torch/cuda.h>

#include "common/error.h"
#include "planner/costs/compute_cost.h"
#include "profiler/block_timing.h"

namespace hybridplan {
namespace {

torch::Device parse_device(const std::string& text) {
  std::optional<torch::Device> device;
  try {
    device.emplace(text);
  } catch (const c10::Error&) {
    throw_input_error("profile", "options.device", "must be a torch device such as cpu or cuda:0",
                      "\"" + text + "\"");
  }
  if (device->is_cuda()) {
    const int64_t count = torch::cuda::is_available() ? torch::cuda::device_count() : 0;
    if (device->index() >= count || count == 0) {
      throw_input_error("profile", "options.device",
                        "must name an existing device (" + std::to_string(count) +
                            " CUDA devices here)",
                        "\"" + text + "\"");
    }
  }
  try {
    (void)torch::empty({1}, torch::TensorOptions().device(*device));
  } catch (const c10::Error& e) {
    throw_input_error("profile", "options.device",
                      "must name a device this build of torch can use (" +
                          std::string(e.what_without_backtrace()) + ")",
                      "\"" + text + "\"");
  }
  return *device;
}

std::string shape_of(const std::vector<torch::Tensor>& tensors) {
  std::ostringstream os;
  for (size_t i = 0; i < tensors.size(); ++i) os << (i ? ", " : "") << tensors[i].sizes();
  return os.str();
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// Float32 is "float32", as torch.float32 prints in Python without its "torch." prefix.
std::string dtype_name(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat: return "float32";
    case torch::kDouble: return "float64";
    case torch::kHalf: return "float16";
    case torch::kBFloat16: return "bfloat16";
    default: return c10::toString(type);
  }
}

int64_t bytes_of(const torch::Tensor& t) { return t.numel() * t.element_size(); }

int64_t param_bytes_of(torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const torch::Tensor& p : module.parameters()) bytes += bytes_of(p);
  return bytes;
}

// The tensors an optimizer updates (those that require grad): it pays a fixed cost per tensor
// (planner/costs/optimizer_cost.h; the Python profiler counts the same way).
int64_t param_tensors_of(torch::nn::Module& module) {
  int64_t count = 0;
  for (const torch::Tensor& p : module.parameters()) count += p.requires_grad() ? 1 : 0;
  return count;
}

void check_options(const ProfileOptions& options) {
  if (options.warmup < 0) {
    throw_input_error("profile", "options.warmup", "must be >= 0", std::to_string(options.warmup));
  }
  if (options.repeats < 1) {
    throw_input_error("profile", "options.repeats", "must be >= 1",
                      std::to_string(options.repeats));
  }
  if (options.batch_size < 0) {
    throw_input_error("profile", "options.batch_size", "must be >= 0 (0: from the input)",
                      std::to_string(options.batch_size));
  }
}

void check_inputs(const std::vector<torch::Tensor>& inputs) {
  if (inputs.empty() || inputs.size() > 3) {
    throw_input_error("profile", "inputs", "must hold 1 to 3 tensors",
                      std::to_string(inputs.size()));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) {
      throw_input_error("profile", "inputs[" + std::to_string(i) + "]", "must be defined",
                        "an undefined tensor");
    }
  }
}

// What one run of the chain without autograd saw, per block.
struct Recorded {
  std::vector<int64_t> output_bytes;               // all of block i's results
  std::vector<int64_t> next_bytes;                 // what block i passes to block i + 1
};

Recorded record_chain(const std::vector<Block>& blocks, std::vector<torch::Tensor> x) {
  torch::NoGradGuard no_grad;
  Recorded recorded;
  for (const Block& block : blocks) {
    std::optional<BlockOutput> out;
    try {
      out.emplace(block.forward(x));
    } catch (const InputError&) {
      throw;
    } catch (const c10::Error& e) {
      throw_input_error("profile", "module." + block.name,
                        "failed on its input: " + first_line(e.what_without_backtrace()),
                        "input shape " + shape_of(x));
    } catch (const std::exception& e) {
      throw_input_error("profile", "module." + block.name,
                        "failed on its input: " + first_line(e.what()),
                        "input shape " + shape_of(x));
    }
    int64_t output_bytes = bytes_of(out->next);
    for (const torch::Tensor& t : out->unused) output_bytes += bytes_of(t);
    recorded.output_bytes.push_back(output_bytes);
    recorded.next_bytes.push_back(bytes_of(out->next));
    x = {out->next};
  }
  return recorded;
}

void retain_freed_memory() {
#if defined(__GLIBC__)
  constexpr int kOneGiB = 1 << 30;
  mallopt(M_MMAP_THRESHOLD, kOneGiB);
  mallopt(M_TRIM_THRESHOLD, kOneGiB);
#endif
}

// Wall-clock CPU times with several intra-op threads on a CPU other processes keep busy (1-minute
// load average above half the cores) are unreliable: a kernel waits for its slowest OpenMP
// thread, and one descheduled thread can inflate a 25 us op to milliseconds. Warns through
// TORCH_WARN, as the Python profiler warns through warnings.warn.
void warn_if_busy_cpu(const torch::Device& device, Clock clock) {
  if (!device.is_cpu() || clock != Clock::kWall || torch::get_num_threads() == 1) return;
  double load = 0;
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  if (getloadavg(&load, 1) != 1 || cores < 1 || load <= static_cast<double>(cores) / 2) return;
  TORCH_WARN("profile: the CPU is busy (load average ", load, " on ", cores, " cores) and ",
             torch::get_num_threads(), " intra-op threads time each op; times may be inflated ",
             "by descheduled threads. For repeatable profiles call torch::set_num_threads(1) and ",
             "set ProfileOptions::clock = \"thread\".");
}

// The first `size` rows of every input whose size(0) is the batch.
std::vector<torch::Tensor> slice_batch(const std::vector<torch::Tensor>& x, int64_t batch, int64_t size) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& t : x) out.push_back(t.dim() > 0 && t.size(0) == batch ? t.narrow(0, 0, size) : t);
  return out;
}

std::vector<int64_t> batch_sizes_of(const ProfileOptions& options, int64_t batch) {
  if (options.auto_batch_sizes) return default_profile_batch_sizes(batch);
  std::vector<int64_t> sizes = options.batch_sizes;
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  for (int64_t size : sizes) {
    if (size < 1 || size >= batch) {
      throw_input_error("profile", "options.batch_sizes",
                        "must lie in 1.." + std::to_string(batch - 1) +
                            " (below the example batch, whose inputs are sliced)",
                        std::to_string(size));
    }
  }
  return sizes;
}

// Each node's times at the other batch sizes, smallest first, within the time budget.
void time_other_batches(const std::vector<Block>& blocks, const std::vector<torch::Tensor>& x,
                        int64_t batch, const ProfileOptions& options, const TimingOptions& timing,
                        Graph& graph) {
  const auto started = std::chrono::steady_clock::now();
  for (int64_t size : batch_sizes_of(options, batch)) {
    const double spent_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    if (!graph.nodes.front().batch_times.empty() && spent_s > options.batch_time_budget_s) break;
    const ChainTimes times = time_chain(blocks, slice_batch(x, batch, size), timing);
    for (size_t i = 0; i < blocks.size(); ++i) {
      graph.nodes[i].batch_times.push_back({size, times.forward_s[i], times.backward_s[i]});
    }
  }
}

Clock clock_of(const ProfileOptions& options, const torch::Device& device) {
  if (options.clock == "wall") return Clock::kWall;
  if (options.clock != "thread") {
    throw_input_error("profile", "options.clock", "must be wall or thread",
                      "\"" + options.clock + "\"");
  }
  if (!device.is_cpu() || torch::get_num_threads() != 1) {
    throw_input_error("profile", "options.clock",
                      "thread measures one CPU thread: needs device cpu and "
                      "torch::set_num_threads(1)",
                      device.str() + ", " + std::to_string(torch::get_num_threads()) +
                          " threads");
  }
  return Clock::kThread;
}

}  // namespace

Graph profile(torch::nn::Module& module, const std::vector<torch::Tensor>& inputs,
              const ProfileOptions& options) {
  module.to(parse_device(options.device));
  return profile_blocks(blocks_of(module), inputs, options);
}

Graph profile_blocks(const std::vector<Block>& blocks, const std::vector<torch::Tensor>& inputs,
                     const ProfileOptions& options) {
  check_options(options);
  check_inputs(inputs);
  const torch::Device device = parse_device(options.device);
  if (blocks.empty()) {
    throw_input_error("profile", "module", "must have at least one block", "0 blocks");
  }
  int64_t total_param_bytes = 0;
  std::optional<torch::ScalarType> param_dtype;
  for (const Block& block : blocks) {
    block.module->to(device);
    total_param_bytes += param_bytes_of(*block.module);
    for (const torch::Tensor& p : block.module->parameters()) {
      if (!param_dtype && p.is_floating_point()) param_dtype = p.scalar_type();
    }
  }
  if (total_param_bytes == 0) {
    throw_input_error("profile", "module", "must have parameters to plan for", "0 parameters");
  }

  std::vector<torch::Tensor> x;
  for (const torch::Tensor& input : inputs) x.push_back(input.to(device));
  const Recorded recorded = record_chain(blocks, x);

  Graph graph;
  graph.name = options.name;
  graph.profiled.device = device.str();
  graph.profiled.batch_size = options.batch_size > 0 ? options.batch_size
                              : inputs[0].dim() > 0  ? inputs[0].size(0)
                                                     : 1;
  graph.profiled.dtype = dtype_name(param_dtype.value_or(inputs[0].scalar_type()));
  for (const torch::Tensor& t : inputs) graph.profiled.input_bytes += t.numel() * t.element_size();

  if (options.retain_freed_memory) retain_freed_memory();
  const TimingOptions timing{device, clock_of(options, device), options.warmup, options.repeats};
  warn_if_busy_cpu(device, timing.clock);
  const ChainTimes times = time_chain(blocks, x, timing);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const Block& block = blocks[i];
    Node node;
    node.id = static_cast<NodeId>(i);
    node.name = block.name;
    node.op = block.op.empty() ? op_of(*block.module) : block.op;
    node.forward_s = times.forward_s[i];
    node.backward_s = times.backward_s[i];
    node.param_bytes = param_bytes_of(*block.module);
    node.param_tensors = param_tensors_of(*block.module);
    node.output_bytes = recorded.output_bytes[i];
    graph.nodes.push_back(std::move(node));
    if (i > 0) {
      const auto src = static_cast<NodeIndex>(i - 1);
      graph.edges.push_back({src, static_cast<NodeIndex>(i), recorded.next_bytes[src]});
    }
  }
  const int64_t first_rows = inputs[0].dim() > 0 ? inputs[0].size(0) : 1;
  if (first_rows == graph.profiled.batch_size) {  // slicing needs the batch along dim 0
    time_other_batches(blocks, x, graph.profiled.batch_size, options, timing, graph);
  }
  graph.finalize("profile(" + options.name + ")");
  return graph;
}

}  // namespace hybridplan
