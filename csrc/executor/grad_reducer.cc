#include "executor/grad_reducer.h"

#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include "common/error.h"

namespace hybridplan {

GradReducer::GradReducer(std::vector<torch::Tensor> params, c10::intrusive_ptr<c10d::Backend> group,
                         int64_t bucket_cap_bytes, std::chrono::milliseconds timeout)
    : params_(std::move(params)), group_(std::move(group)), timeout_(timeout) {
  if (!group_ || group_->getSize() == 1) return;
  std::vector<int64_t> bytes;
  std::vector<std::string> keys;
  for (const torch::Tensor& p : params_) {
    bytes.push_back(p.numel() * static_cast<int64_t>(p.element_size()));
    keys.push_back(p.device().str() + "/" + std::string(c10::toString(p.scalar_type())));
  }
  buckets_ = assign_grad_buckets(bytes, bucket_cap_bytes, keys);
  bucket_of_param_.assign(params_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (int32_t i : buckets_[b]) bucket_of_param_[i] = b;
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    HP_INTERNAL_ASSERT(params_[i].requires_grad(), "parameter " << i << " does not require grad");
    // The AccumulateGrad node is held weakly by the tensor; the post-hook lives on the node, and
    // the node lives as long as the parameter, which the module keeps.
    torch::autograd::impl::grad_accumulator(params_[i])
        ->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [self = self_, i](const torch::autograd::variable_list& outputs,
                              const torch::autograd::variable_list& /*inputs*/) {
              if (*self != nullptr) (*self)->on_grad_ready(static_cast<int32_t>(i));
              return outputs;
            }));
  }
}

GradReducer::~GradReducer() {
  std::lock_guard<std::mutex> lock(mutex_);
  *self_ = nullptr;
}

void GradReducer::arm() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = true;
  next_bucket_ = 0;
  pending_in_bucket_.clear();
  for (const auto& bucket : buckets_) pending_in_bucket_.push_back(static_cast<int64_t>(bucket.size()));
  flat_.assign(buckets_.size(), torch::Tensor());
  work_.assign(buckets_.size(), nullptr);
}

void GradReducer::on_grad_ready(int32_t param_index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;  // an earlier micro-batch: gradients still accumulating
  size_t b = bucket_of_param_[param_index];
  HP_INTERNAL_ASSERT(pending_in_bucket_[b] > 0, "gradient of parameter " << param_index
                                                    << " became ready twice in one backward");
  --pending_in_bucket_[b];
  launch_ready_buckets_locked();
}

void GradReducer::launch_ready_buckets_locked() {
  while (next_bucket_ < buckets_.size() && pending_in_bucket_[next_bucket_] == 0) {
    launch_bucket_locked(next_bucket_++);
  }
}

void GradReducer::launch_bucket_locked(size_t b) {
  std::vector<torch::Tensor> grads;
  for (int32_t i : buckets_[b]) {
    torch::Tensor& p = params_[i];
    if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
    grads.push_back(p.grad().reshape({-1}));
  }
  flat_[b] = torch::cat(grads);
  std::vector<torch::Tensor> tensors{flat_[b]};
  work_[b] = group_->allreduce(tensors);  // sum; averaged in finish()
}

void GradReducer::finish() {
  if (buckets_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    HP_INTERNAL_ASSERT(armed_, "GradReducer::finish() without arm()");
    for (size_t b = next_bucket_; b < buckets_.size(); ++b) launch_bucket_locked(b);
    next_bucket_ = buckets_.size();
    armed_ = false;
  }
  const double dp = static_cast<double>(group_->getSize());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!work_[b]->wait(timeout_)) {
      throw std::runtime_error("gradient all-reduce of bucket " + std::to_string(b) +
                               " did not finish within the timeout");
    }
    flat_[b].div_(dp);
    int64_t offset = 0;
    for (int32_t i : buckets_[b]) {
      torch::Tensor grad = params_[i].mutable_grad();
      int64_t n = grad.numel();
      grad.copy_(flat_[b].narrow(0, offset, n).view_as(grad));
      offset += n;
    }
  }
  flat_.clear();
  work_.clear();
}

}  // namespace hybridplan
