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
// Construction ignores SIGPIPE when its action is the default (as Python does), so that a
// write to a dead peer's socket becomes an error naming the lost rank, not a silent exit 141.
// Construction (every rank, collectively): validates the plan against the graph, the module and
// WORLD_SIZE; connects to the TCPStore; checks that all ranks run the same torch and hybridplan
// versions and hold the same plan and parameter shapes (rank_agreement.h: a mismatch fails every
// rank, naming two of them); builds the process groups; broadcasts each DP group's first
// member's parameters and buffers (as DDP does).
//
// A lost peer: when a step's collective or send/recv fails, forward_backward() throws
// LostPeerError naming the ranks that did not answer (lost_peer.h, the Python executor's rule).
//
// Checkpoints (checkpoint.h, docs/formats.md "Checkpoint"): save_checkpoint() writes the file the
// Python executor writes, load_checkpoint() resumes from a file either executor wrote, under any
// plan.
#pragma once
#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/torch.h>

#include "executor/dist_env.h"
#include "planner/costs/bucket_policy.h"
#include "planner/documents/graph.h"
#include "planner/documents/plan.h"
#include "profiler/block_list.h"

namespace hybridplan {

class DdpReducer;
class StageChannel;

struct ExecutorOptions {
  // Bound on every wait: TCPStore rendezvous, the rank agreement check, collectives, send/recv.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  BucketCaps bucket_caps;  // DDP's: first bucket 1 MiB, then 25 MiB (planner/costs/bucket_policy.h)
  // kCUDA: NCCL and one CUDA device per stage (LOCAL_RANK) or per placement device; kCPU: Gloo.
  torch::DeviceType device_type =
      torch::cuda::is_available() ? torch::kCUDA : torch::kCPU;
  std::string plan_source = "plan";  // names the plan in error messages (its file path)
};

// A step failed because a peer was lost or timed out; what() names it (lost_peer.h).
class LostPeerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
  // Throws LostPeerError (on every surviving rank, within the timeout plus kLostPeerGraceS) when
  // a peer is lost: "hybridplan: step N failed on rank R: rank K lost or timed out (...)".
  torch::Tensor forward_backward(const torch::Tensor& input, const torch::Tensor& target,
                                 const LossFn& loss_fn);

  // Steps taken: forward_backward() calls that completed (one per optimizer step), a resumed
  // checkpoint's included. The checkpoint's `step`.
  int64_t step_count() const { return steps_; }

  // Writes one consolidated checkpoint to `path` (docs/formats.md "Checkpoint"): the whole model
  // under the module's state keys (checkpoint.h), `optimizer`'s state by parameter name (SGD or
  // Adam, built over parameters()), step_count(), the plan and its graph hash. Collective: every
  // rank calls it; replica 0's ranks contribute their stages through the job's TCPStore, rank 0
  // writes <path>.tmp-<pid>, fsyncs, renames and fsyncs the directory once every part has
  // arrived. All ranks return, or all throw std::runtime_error "<path>: checkpoint not written
  // (rank 0: ...)", and then `path` is unchanged.
  void save_checkpoint(const std::string& path, const torch::optim::Optimizer& optimizer);

  // Resumes from a checkpoint written by either executor under any plan, before the first step:
  // the model state into the module (InputError naming the file and key if it is of another
  // model), the optimizer state of this rank's parameters by name (same class as saved), and
  // step_count(). Every rank calls it with the same file. Returns step_count().
  int64_t load_checkpoint(const std::string& path, torch::optim::Optimizer& optimizer);

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
  torch::Tensor step(const torch::Tensor& input, const torch::Tensor& target, const LossFn& loss_fn);
  // save_checkpoint's parts, over the store keys under `prefix` (executor.cc): a replica-0 rank
  // sends its stages' part; rank 0 gathers the parts of `contributors` ranks and writes `path`,
  // returning "" or what failed; every rank reads rank 0's outcome and returns it.
  void send_checkpoint_part(const std::string& prefix, const torch::optim::Optimizer& optimizer) const;
  std::string write_checkpoint_parts(const std::string& prefix, int64_t contributors,
                                     const std::string& path) const;
  std::string await_checkpoint_status(const std::string& prefix) const;

  Plan plan_;
  DistEnv env_;
  ExecutorOptions options_;
  std::shared_ptr<torch::nn::Module> module_;
  std::vector<Block> all_blocks_;
  std::vector<Block> local_blocks_;
  std::vector<torch::Device> local_block_devices_;
  int64_t replica_ = 0;
  int64_t stage_ = 0;
  std::string tag_;        // store prefix of this executor, the same on every rank
  std::string plan_json_;  // the plan's canonical JSON (checkpoints)
  int64_t steps_ = 0;      // step_count()
  int64_t saves_ = 0;      // save_checkpoint() calls, for fresh store keys
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> dp_group_;    // nullptr when dp == 1
  c10::intrusive_ptr<c10d::ProcessGroup> pipe_group_;  // this replica's stages; nullptr unless pipeline mp > 1
  std::unique_ptr<DdpReducer> reducer_;                // nullptr when dp == 1
  std::unique_ptr<StageChannel> channel_;
};

}  // namespace hybridplan
