// GradReducer: DDP-style gradient averaging over a data-parallel group, overlapped with backward.
// LibTorch has no C++ DistributedDataParallel, so this does what DDP's Reducer does
// (https://pytorch.org/docs/stable/notes/ddp.html#internal-design), minus unused-parameter
// detection and gradient views:
//   - parameters are grouped into buckets (grad_buckets.h: reverse registration order, 25 MB);
//   - a post-hook on each parameter's AccumulateGrad node marks its gradient ready once the
//     last backward of the step has accumulated it;
//   - when every gradient of a bucket is ready, the bucket is flattened and its all-reduce
//     (sum) launched asynchronously, buckets strictly in bucket order on every rank so Gloo/NCCL
//     match them up, while backward continues with earlier layers;
//   - finish() launches what is left (parameters that got no gradient count as zero), waits for
//     every bucket with the group's timeout and writes grad = sum / dp back.
// With dp == 1 (no group) it does nothing: the local gradients are already the answer.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/torch.h>

#include "executor/grad_buckets.h"

namespace hybridplan {

class GradReducer {
 public:
  // `params`: the leaf tensors this rank trains, in registration order. `group`: the DP group
  // (nullptr when dp == 1). Registers one post-hook per parameter; keep the reducer alive as long
  // as the parameters are trained.
  GradReducer(std::vector<torch::Tensor> params, c10::intrusive_ptr<c10d::Backend> group,
              int64_t bucket_cap_bytes, std::chrono::milliseconds timeout);
  ~GradReducer();  // detaches the hooks' back-pointer: a later backward on the model is harmless
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // The next backward pass is the step's last one for these parameters (the only one in
  // placement mode, the last micro-batch's in pipeline mode): launch buckets as they fill.
  void arm();
  // Launches the remaining buckets, waits for all and averages. Call after the last backward.
  void finish();

  const std::vector<std::vector<int32_t>>& buckets() const { return buckets_; }

 private:
  void on_grad_ready(int32_t param_index);  // autograd thread
  void launch_ready_buckets_locked();
  void launch_bucket_locked(size_t bucket);

  // What the hooks call through; reset by the destructor (hooks cannot be removed from a node).
  std::shared_ptr<GradReducer*> self_ = std::make_shared<GradReducer*>(this);
  std::vector<torch::Tensor> params_;
  c10::intrusive_ptr<c10d::Backend> group_;
  std::chrono::milliseconds timeout_;
  std::vector<std::vector<int32_t>> buckets_;
  std::vector<size_t> bucket_of_param_;

  std::mutex mutex_;  // guards everything below (hooks run on autograd threads)
  bool armed_ = false;
  std::vector<int64_t> pending_in_bucket_;  // gradients not yet ready, per bucket
  size_t next_bucket_ = 0;                  // buckets launch strictly in order
  std::vector<torch::Tensor> flat_;         // per launched bucket: the flattened gradients
  std::vector<c10::intrusive_ptr<c10d::Work>> work_;
};

}  // namespace hybridplan
