// hybridplan::Executor: applies a Plan to a LibTorch module inside a torchrun job, with the
// semantics of the Python executor (docs/design.md "Executor semantics"):
//   - placement: one process per replica; each graph node's block runs on the replica-local
//     device the plan assigns (inputs follow); gradients are averaged over all replicas.
//   - pipeline: one process per device, rank = replica * mp + stage; this rank runs only its
//     stage's contiguous blocks, exchanging activations and gradients with its neighbours and
//     running the plan's GPipe or 1F1B schedule over num_microbatches micro-batches; each
//     stage's gradients are averaged over that stage's DP group {r * mp + stage}.
// Gradients are averaged by DDP's own engine, c10d::Reducer (ddp_reducer.h), overlapped with the
// backward (pipeline: the last micro-batch's backward).
// Either way, after forward_backward() every trained parameter's .grad is the gradient of the
// mean loss over the global batch, as single-device training on the same batch would compute
// (up to float reassociation), so any optimizer built over parameters() then trains identically.
//
// The module's blocks are what the C++ profiler measures (profiler/block_list.h): the children of
// a torch::nn::Sequential or a hybridplan::BlockList's blocks(). Their names must be the graph's
// node names in order, so the plan maps onto the module.
//
// Construction (every rank, collectively): validates the plan against the graph, the module and
// WORLD_SIZE; connects to the TCPStore; checks that all ranks hold the same plan and parameter
// shapes (rank_agreement.h: a mismatch fails every rank, naming two of them); builds the process
// groups; broadcasts each DP group's first member's parameters and buffers (as DDP does).
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/torch.h>

#include "executor/dist_env.h"
#include "planner/bucket_policy.h"
#include "planner/graph.h"
#include "planner/plan.h"
#include "profiler/block_list.h"

namespace hybridplan {

class DdpReducer;
class StageChannel;

struct ExecutorOptions {
  // Bound on every wait: TCPStore rendezvous, the rank agreement check, collectives, send/recv.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  BucketCaps bucket_caps;  // DDP's: first bucket 1 MiB, then 25 MiB (planner/bucket_policy.h)
  // kCUDA: NCCL and one CUDA device per stage (LOCAL_RANK) or per placement device; kCPU: Gloo.
  torch::DeviceType device_type =
      torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  std::string plan_source = "plan";  // names the plan in error messages (its file path)
};

// loss_fn(output, target) must return the MEAN loss over the samples it is given; the executor
// weights micro-batch losses by their share of the replica's batch.
using LossFn = std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;

class Executor {
 public:
  // `plan` must already be validated against `graph` and its cluster (load_plan(path, graph,
  // cluster)); `module` must be built identically (same seed) on every rank.
  Executor(const Plan& plan, const Graph& graph, std::shared_ptr<torch::nn::Module> module,
           const DistEnv& env, ExecutorOptions options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // The parameters this rank trains (its stage's in pipeline mode, all in placement mode), in
  // registration order: build the optimizer over these.
  std::vector<torch::Tensor> parameters() const;

  // One step's forward and backward. `input` and `target` hold either the whole global batch
  // (plan.global_batch rows; this replica takes rows [replica * b, (replica + 1) * b)) or just this
  // replica's b = plan.per_replica_batch rows. Stages other than the first ignore `input`, other
  // than the last ignore `target`. Returns this replica's mean loss (detached) on the last stage
  // and an undefined tensor elsewhere. Leaves averaged gradients in parameters()' .grad.
  torch::Tensor forward_backward(const torch::Tensor& input, const torch::Tensor& target,
                                 const LossFn& loss_fn);

  int64_t replica() const { return replica_; }
  int64_t stage() const { return stage_; }  // 0 in placement mode
  bool is_first_stage() const { return stage_ == 0; }
  bool is_last_stage() const { return plan_.mode == MpMode::kPlacement || stage_ == plan_.mp - 1; }
  const std::vector<Block>& local_blocks() const { return local_blocks_; }
  // Gradient buckets of this rank's DP group; 0 when dp == 1 (nothing to reduce).
  int64_t num_grad_buckets() const;

 private:
  void check_module_matches_graph(const Graph& graph) const;
  torch::Tensor replica_rows(const torch::Tensor& t, const char* what) const;
  torch::Tensor step_placement(const torch::Tensor& input, const torch::Tensor& target,
                               const LossFn& loss_fn);
  torch::Tensor step_pipeline(const torch::Tensor& input, const torch::Tensor& target,
                              const LossFn& loss_fn);
  torch::Tensor run_local_blocks(torch::Tensor x) const;
  // This rank's trained parameters as (block name "." parameter name, tensor), registration order.
  std::vector<std::pair<std::string, torch::Tensor>> local_named_parameters() const;
  std::vector<torch::Tensor> local_states() const;  // parameters, then buffers (DDP's broadcast)

  Plan plan_;
  DistEnv env_;
  ExecutorOptions options_;
  std::shared_ptr<torch::nn::Module> module_;
  std::vector<Block> all_blocks_;
  std::vector<Block> local_blocks_;
  std::vector<torch::Device> local_block_devices_;
  int64_t replica_ = 0;
  int64_t stage_ = 0;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> dp_group_;    // nullptr when dp == 1
  c10::intrusive_ptr<c10d::ProcessGroup> pipe_group_;  // this replica's stages; nullptr unless pipeline mp > 1
  std::unique_ptr<DdpReducer> reducer_;                // nullptr when dp == 1
  std::unique_ptr<StageChannel> channel_;
};

}  // namespace hybridplan
