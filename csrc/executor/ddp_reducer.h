// DdpReducer: DistributedDataParallel's gradient engine, c10d::Reducer (exported by
// libtorch_cpu), over one data-parallel group, driven from C++ the way
// torch/nn/parallel/distributed.py drives it:
//   - construction: the Reducer hooks every parameter's AccumulateGrad node; buckets follow
//     planner/costs/bucket_policy.h (initial_bucket_indices below);
//   - before each forward: rebuild_buckets() (DDP's _pre_forward). After the first armed backward
//     the Reducer re-packs the buckets once, in the order the gradients actually became ready
//     (rank 0's order, broadcast), with the same caps;
//   - before the backward that ends the step: prepare_for_backward() arms the hooks (DDP's
//     _post_forward). Each bucket is all-reduced as soon as its last gradient is ready, while
//     backward goes on with earlier layers; at the end of that backward the Reducer waits for
//     every bucket and leaves grad = sum over replicas of grad / dp (DDP's default comm hook:
//     the division happens as a gradient is copied into its bucket).
// A backward that is not armed only accumulates .grad, as under DDP's no_sync(): a pipeline stage
// arms only its last micro-batch's backward, as torch.distributed.pipelining's stage does for a
// DDP-wrapped stage (stage.py, backward_maybe_with_nosync), so the reduction overlaps that
// backward, as the cost model assumes.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include "planner/costs/bucket_policy.h"

namespace c10d {
class Reducer;
}

namespace hybridplan {

// The buckets the Reducer starts with, in reduction order: the parameters packed from last to
// first (the order a chain's backward produces their gradients) under `caps`, i.e. the buckets
// DDP's rebuild arrives at after its first iteration. DDP itself starts with one bucket of every
// parameter (before a backward it cannot trust registration order); the blocks here run in
// registration order, so the policy can apply from the first step.
std::vector<std::vector<size_t>> initial_bucket_indices(const std::vector<torch::Tensor>& params,
                                                        BucketCaps caps);

class DdpReducer {
 public:
  // `params`: the leaf tensors this rank trains (requires_grad), in registration order, each
  // with its name for the Reducer's messages. `group`: the DP group (size >= 2). Keep the
  // reducer alive as long as the parameters are trained; its destructor removes its hooks.
  DdpReducer(std::vector<torch::Tensor> params, std::vector<std::string> names,
             c10::intrusive_ptr<c10d::ProcessGroup> group, BucketCaps caps);
  ~DdpReducer();
  DdpReducer(const DdpReducer&) = delete;
  DdpReducer& operator=(const DdpReducer&) = delete;

  void prepare_for_forward();   // DDP's _pre_forward: the one-time bucket rebuild
  void prepare_for_backward();  // the next backward ends the step: reduce during it
  int64_t num_buckets() const;  // the current buckets (they change once, at the rebuild)

 private:
  std::unique_ptr<c10d::Reducer> reducer_;
};

inline constexpr int64_t kBroadcastBucketBytes = 250 * kBytesPerMiB;  // DDP's broadcast_bucket_size

// DDP's initial _sync_module_states: every member of `group` gets the tensors (parameters and
// buffers) of its group rank 0, coalesced into buffers of at most `buffer_bytes`.
void broadcast_from_first(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                          const std::vector<torch::Tensor>& tensors,
                          int64_t buffer_bytes = kBroadcastBucketBytes);

}  // namespace hybridplan
