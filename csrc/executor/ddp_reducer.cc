#include "executor/ddp_reducer.h"

#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "common/error.h"

namespace hybridplan {

std::vector<std::vector<size_t>> initial_bucket_indices(const std::vector<torch::Tensor>& params,
                                                        BucketCaps caps) {
  std::vector<torch::Tensor> ready_order(params.rbegin(), params.rend());
  std::vector<int64_t> indices(params.size());
  for (size_t i = 0; i < params.size(); ++i) indices[i] = static_cast<int64_t>(params.size() - 1 - i);
  return std::get<0>(c10d::compute_bucket_assignment_by_size(
      ready_order, {static_cast<size_t>(caps.first_bytes), static_cast<size_t>(caps.bytes)},
      std::vector<bool>(params.size(), false), indices));
}

DdpReducer::DdpReducer(std::vector<torch::Tensor> params, std::vector<std::string> names,
                       c10::intrusive_ptr<c10d::ProcessGroup> group, BucketCaps caps) {
  HP_INTERNAL_ASSERT(group && group->getSize() > 1, "DdpReducer needs a group of >= 2 ranks");
  HP_INTERNAL_ASSERT(!params.empty() && names.size() == params.size(),
                     params.size() << " parameters, " << names.size() << " names");
  std::unordered_map<size_t, std::string> param_names;
  for (size_t i = 0; i < names.size(); ++i) param_names.emplace(i, std::move(names[i]));
  std::vector<std::vector<size_t>> buckets = initial_bucket_indices(params, caps);
  const size_t num_params = params.size();
  reducer_ = std::make_unique<c10d::Reducer>(
      std::move(params), std::move(buckets), std::move(group),
      std::vector<bool>(num_params, false),  // expect_sparse_gradients
      caps.bytes, /*find_unused_parameters=*/false, /*gradient_as_bucket_view=*/false,
      std::move(param_names), caps.first_bytes, /*skip_all_reduce_unused_params=*/false,
      /*use_python_reducer=*/false,
      /*bucket_bytes_cap_list=*/std::vector<int64_t>{});  // rebuild with {first_bytes, bytes}
}

DdpReducer::~DdpReducer() = default;

void DdpReducer::prepare_for_forward() { reducer_->rebuild_buckets(); }

void DdpReducer::prepare_for_backward() { reducer_->prepare_for_backward({}); }

int64_t DdpReducer::num_buckets() const {
  return static_cast<int64_t>(reducer_->get_grad_buckets(/*return_zero_tensors=*/true).size());
}

void broadcast_from_first(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                          const std::vector<torch::Tensor>& tensors, int64_t buffer_bytes) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> detached;
  for (const torch::Tensor& t : tensors) detached.push_back(t.detach());
  c10d::broadcast_coalesced(group, detached, static_cast<size_t>(buffer_bytes), /*rank=*/0);
}

}  // namespace hybridplan
