#include "profiler/block_timing.h"

#include <time.h>

#include <algorithm>
#include <chrono>

#include <torch/cuda.h>

#include "common/error.h"

namespace hybridplan {
namespace {

void synchronize(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

double now_s(Clock clock) {
  if (clock == Clock::kThread) {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
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

BlockTimes time_block(const Block& block, const std::vector<torch::Tensor>& inputs,
                      bool input_requires_grad, const TimingOptions& options) {
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : block.module->parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  std::vector<double> forward_samples_s, backward_samples_s;
  for (int run = 0; run < options.warmup + options.repeats; ++run) {
    std::vector<torch::Tensor> x, wrt = params;
    for (const torch::Tensor& input : inputs) {
      x.push_back(input.detach());
      if (input_requires_grad && input.is_floating_point()) {
        x.back().requires_grad_(true);
        wrt.push_back(x.back());
      }
    }
    synchronize(options.device);
    const double forward_start_s = now_s(options.clock);
    torch::Tensor y = block.forward(x).next;
    synchronize(options.device);
    const double forward_s = now_s(options.clock) - forward_start_s;

    double backward_s = 0;
    if (y.requires_grad() && !wrt.empty()) {
      torch::Tensor grad_output = torch::ones_like(y);
      synchronize(options.device);
      const double backward_start_s = now_s(options.clock);
      torch::autograd::grad({y}, wrt, {grad_output}, /*retain_graph=*/false,
                            /*create_graph=*/false, /*allow_unused=*/true);
      synchronize(options.device);
      backward_s = now_s(options.clock) - backward_start_s;
    }
    if (run >= options.warmup) {
      forward_samples_s.push_back(forward_s);
      backward_samples_s.push_back(backward_s);
    }
  }
  return {median_s(forward_samples_s), median_s(backward_samples_s)};
}

}  // namespace hybridplan
