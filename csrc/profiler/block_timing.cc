#include "profiler/block_timing.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include <torch/cuda.h>

#include "common/error.h"

namespace hybridplan {
namespace {

class StepClock {
 public:
  explicit StepClock(const TimingOptions& options)
      : device_(options.device), clock_(options.clock) {}

  // Seconds on this clock, after the device has finished the work queued so far.
  double mark() const {
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
    if (clock_ == Clock::kThread) {
      timespec ts{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
      return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

 private:
  torch::Device device_;
  Clock clock_;
};

// One step's split: the same shape as the result, before taking medians.
ChainTimes time_step(const std::vector<Block>& blocks, const std::vector<torch::Tensor>& inputs,
                    const std::vector<torch::Tensor>& params, const StepClock& clock) {
  const size_t n = blocks.size();
  ChainTimes split{std::vector<double>(n, 0.0), std::vector<double>(n, 0.0)};
  // Backward marks: (clock, block the interval ending there is charged to).
  std::vector<std::pair<double, size_t>> backward_marks;
  std::optional<size_t> backward_owner;

  std::vector<torch::Tensor> x;
  for (const torch::Tensor& input : inputs) x.push_back(input.detach());
  double previous_s = clock.mark();
  for (size_t i = 0; i < n; ++i) {
    torch::Tensor y = blocks[i].forward(x).next;
    const double end_s = clock.mark();
    split.forward_s[i] += end_s - previous_s;
    // A block that returns its input unchanged (dropout with p=0, Identity) hands on its
    // producer's autograd node: hooked again, its mark would take the producer's backward,
    // so it is marked once, for the producer (the rule block_timing.py's StepTimer follows).
    const bool passthrough = i > 0 && y.defined() && y.grad_fn() &&
                             y.grad_fn() == x.front().grad_fn() &&
                             y.output_nr() == x.front().output_nr();
    if (y.requires_grad() && !passthrough) {
      y.register_hook([&, i](const torch::Tensor&) {
        backward_marks.emplace_back(clock.mark(), backward_owner.value_or(i));
        backward_owner = i;
      });
    }
    x = {std::move(y)};
    previous_s = clock.mark();  // registering the hook is the profiler's own time
  }
  torch::Tensor output = x.front();
  if (!output.requires_grad() || params.empty()) return split;
  torch::Tensor seed = torch::ones_like(output);
  const double forward_end_s = clock.mark();
  split.forward_s[n - 1] += forward_end_s - previous_s;
  torch::autograd::grad({output}, params, {seed}, /*retain_graph=*/false,
                        /*create_graph=*/false, /*allow_unused=*/true);
  backward_marks.emplace_back(clock.mark(), backward_owner.value_or(n - 1));
  double start_s = forward_end_s;
  for (const auto& [mark_s, owner] : backward_marks) {
    split.backward_s[owner] += mark_s - start_s;
    start_s = mark_s;
  }
  return split;
}

}  // namespace

double median_s(std::vector<double> samples_s) {
  HP_INTERNAL_ASSERT(!samples_s.empty(), "median of no samples");
  const size_t mid = samples_s.size() / 2;
  std::nth_element(samples_s.begin(), samples_s.begin() + mid, samples_s.end());
  if (samples_s.size() % 2 == 1) return samples_s[mid];
  const double upper = samples_s[mid];
  const double lower = *std::max_element(samples_s.begin(), samples_s.begin() + mid);
  return (lower + upper) / 2;
}

ChainTimes time_chain(const std::vector<Block>& blocks, const std::vector<torch::Tensor>& inputs,
                      const TimingOptions& options) {
  std::vector<torch::Tensor> params;  // each once, even where blocks share (tie) one
  for (const Block& block : blocks) {
    for (const torch::Tensor& p : block.module->parameters()) {
      const bool seen = std::any_of(params.begin(), params.end(),
                                    [&](const torch::Tensor& q) { return q.is_same(p); });
      if (p.requires_grad() && !seen) params.push_back(p);
    }
  }
  const StepClock clock(options);
  const size_t n = blocks.size();
  std::vector<std::vector<double>> forward_samples_s(n), backward_samples_s(n);
  for (int run = 0; run < options.warmup + options.repeats; ++run) {
    const ChainTimes split = time_step(blocks, inputs, params, clock);
    if (run < options.warmup) continue;
    for (size_t i = 0; i < n; ++i) {
      forward_samples_s[i].push_back(split.forward_s[i]);
      backward_samples_s[i].push_back(split.backward_s[i]);
    }
  }
  ChainTimes times;
  for (size_t i = 0; i < n; ++i) {
    times.forward_s.push_back(median_s(forward_samples_s[i]));
    times.backward_s.push_back(median_s(backward_samples_s[i]));
  }
  return times;
}

}  // namespace hybridplan
