// Memory per device: what one device must hold during a training step.
//
//   memory_bytes = parameter_state_bytes                   parameters, gradients, optimizer state
//                + activation_bytes * in_flight            activations kept for backward
//   parameter_state_bytes, P = the device's parameter bytes (at the graph's dtype), d = dp,
//   k_opt: sgd 0, sgd_momentum 1 (momentum buffer), adam 2 (first and second moments), U = the
//   largest sharded unit's bytes (a node's parameters; a pipeline stage is one unit), and the
//   optimizer's copies per parameter byte (OptimizerState):
//     O  = k_opt                 its state at the parameters' dtype;
//          r * (1 + k_opt)       with a 16-bit precision (Job::precision): an fp32 master
//                                copy and fp32 state, r = 4 / the graph's dtype bytes
//                                (Megatron-LM's fp16 Adam: 2 + 2 + r(1 + 2) * 2 = 16 bytes
//                                per parameter)
//     Os = 1 + k_opt             a shard's parameters and state; with mixed precision
//          r * (1 + k_opt)       the fp32 master shard (FSDP2 keeps the sharded parameter in
//                                fp32 and gathers it in the compute dtype) and fp32 state
//     none (DDP)        2P + O * P                    parameters, gradients, optimizer
//     zero2, placement  P + Os * P/d + U              gathered parameters (all, from forward
//                       until each unit's backward), parameter and optimizer shards, one unit's
//                       unsharded gradient before its reduce-scatter
//     zero3, placement  Os * P/d + w * U              shards, plus the gathered parameters and
//                       unsharded gradient of the unit in backward (w = 2), and the next unit's
//                       prefetched parameters where collectives overlap compute (w = 3)
//     zero2, pipeline   2P + Os * P/d                 the stage's parameters stay gathered and
//                       its gradients unsharded across the micro-batches (torch's pipeline
//                       schedules reduce-scatter once, after the last backward)
//     accumulating (Plan::accumulation_steps > 1): the micro-steps before the last do not
//     reduce-scatter, and FSDP2 keeps each unit's unsharded gradient until the last does
//     (set_requires_gradient_sync(False)): all of them, P, are held together
//       zero2, placement  2P + Os * P/d             (U's gradient is among them)
//       zero3, placement  P + Os * P/d + (w - 1) U  (likewise)
//       zero2, pipeline   unchanged (its gradients stay unsharded already)
//     The gradient shards (P/d) exist only once the backward has freed most activations and
//     gathered parameters, so they do not add to the peak. Without mixed precision (O = k_opt,
//     Os = 1 + k_opt): P * (2 + k_opt), P + (1 + k_opt) * P/d + U, (1 + k_opt) * P/d + w * U and
//     2P + (1 + k_opt) * P/d.
//   activation_bytes: sum of the device's nodes' saved_bytes (what each keeps for backward, as
//                     profiled) or, where not measured, output_bytes, at the (micro-)batch it runs,
//                     plus its batch-independent fixed_saved_bytes (autocast's 16-bit weight
//                     copies: precision_cost.h);
//                     a recomputed node (Plan::recompute) keeps only its inputs instead (its
//                     in-edges' bytes, each producer's value once per device however many
//                     recomputed nodes read it; in a pipeline nothing: a recomputed stage's
//                     inputs are its receive buffers, counted below); a node recomputed
//                     selectively also keeps its selective_saved_bytes (the outputs of its
//                     matrix products, convolutions and attention, measured by the profiler)
//   in_flight: placement 1; pipeline GPipe M (all forwards before any backward), 1F1B
//              min(M, S - s) on stage s (its warm-up depth plus the one in steady state).
//                + transient_bytes                         alive only part of the step:
//   backward workspace: while node v's backward runs, the gradient of its output, the
//                     gradients of its inputs and of its parameters (before they are added into
//                     .grad) and its kernels' scratch are alive together: max over the device's
//                     nodes of backward_workspace_bytes (below: measured by the profiler, or
//                     output_bytes + the bytes of its in-edges where not), at the (micro-)batch
//                     it runs; for the last node, at least the loss's backward peak (Graph
//                     profiled.loss_backward_bytes: cross-entropy holds two logits-sized
//                     gradients at once). A rank of several pipeline stages adds a stage's
//                     workspace to what it holds at that stage's backward passes
//                     (pipeline_schedule.h peak_activation_bytes). A zero-bubble I pass
//                     (split backward) keeps the graph for W, so the nodes after v free
//                     nothing, and holds the gradients it recorded at them
//                     (Node::split_held_bytes): its workspace is the max over the stage's
//                     input-region nodes v of backward_workspace_bytes(v) + the held
//                     gradients of the region's nodes after v (branchy_cnn's ZB-V rank of
//                     stages 1 and 2: 3.8 MiB more than with the plain backward's credit,
//                     measured 23.1 MiB against 19.1 predicted before)
//   recomputed:       while a recomputed node's backward runs, its activations exist again: the
//                     largest recomputed node's on the device (placement checkpoints node by
//                     node), the recomputed stage's sum (pipeline checkpoints the stage); a
//                     selectively recomputed node's activations less what it kept
//   held output:      the model's output, alive until its backward is done: the replica's
//                     whole batch (placement: the caller holds it), or one micro-batch's per
//                     micro-batch in flight on the last stage (pipeline: GPipe M, 1F1B 1), on
//                     the device of the last node
//   receive buffers (pipeline): torch.distributed.pipelining's PipelineStage allocates one
//                     receive buffer per micro-batch for the activations a stage receives (every
//                     stage but the first) and for the gradients it receives (every stage but the
//                     last): M * the boundary's bytes per micro-batch, each way.
//   input batch:      the replica's per-replica batch of model inputs (Graph profiled.input_bytes,
//                     scaled), on the device of the first node in topological order.
// Measured against torch.profiler's memory timeline by `hybridplan validate` (peak memory per
// rank, predicted beside measured). Not modelled: allocator fragmentation, DDP's gradient buckets (another copy of the gradients without
// gradient_as_bucket_view). The search's pipeline partition (pipeline_search.h) checks every
// term per stage, each stage with its own recompute; a rank of several stages is checked stage
// by stage against its share of the memory (evaluate() decides feasibility).
#pragma once
#include <cstdint>
#include <string>

#include "planner/documents/job.h"
#include "planner/documents/plan.h"

namespace hybridplan {

// What node v's backward needs while it runs, above what is held (the backward workspace
// above), at the (micro-)batch of `scale` (compute_cost.h batch_scale):
//   measured (Node::backward_workspace_bytes = w at the profiled batch):
//     min(w, P) + (w - min(w, P)) * scale
//     the parameters' gradients before autograd adds them into .grad (P = param_bytes) do not
//     shrink with the batch; the rest (output and input gradients, kernel scratch) scales
//   not measured: (output_bytes + the bytes of its in-edges) * scale
//   the last node (graph.topo_order's last): at least profiled.loss_backward_bytes * scale
double backward_workspace_bytes(const Graph& graph, NodeIndex v, double scale);

// 0, 1 or 2 copies of the parameters for the optimizer state.
int64_t optimizer_state_copies(Optimizer optimizer);

// What the optimizer keeps per parameter (Job::optimizer, Job::precision).
struct OptimizerState {
  Optimizer optimizer = Optimizer::kSgd;
  // r = 4 / the graph's dtype bytes with mixed precision (2 for fp16 or bf16); 0 without.
  double master_ratio = 0;
  bool mixed_precision() const { return master_ratio > 0; }
  // O above: the optimizer's bytes per parameter byte beside the parameters and gradients.
  double copies() const;
  // Os above: a shard's parameter and optimizer bytes per parameter byte.
  double shard_copies() const;
};

// The job's optimizer state for `graph`. With a 16-bit precision the graph's profiled.dtype must
// be float32 (priced in the precision: precision_cost.h) or a known 16-bit dtype; InputError
// naming `source` and precision otherwise.
OptimizerState optimizer_state(const Job& job, const Graph& graph,
                               const std::string& source = "job");

// Micro-batches whose activations stage `stage` of `num_stages` holds at once.
int64_t in_flight_microbatches(Schedule schedule, int64_t num_microbatches, int64_t num_stages,
                               int64_t stage);

// parameter_state_bytes above.
struct ShardedState {
  Sharding sharding = Sharding::kNone;
  int64_t dp = 1;
  bool pipeline = false;
  bool overlapped = false;     // collectives overlap compute (prefetch): zero3 holds 3 units
  bool accumulating = false;   // accumulation_steps > 1: unsharded gradients held (above)
  double largest_unit_bytes = 0;
};
double parameter_state_bytes(double param_bytes, const OptimizerState& optimizer,
                             const ShardedState& state);

// parameter_state_bytes + activation_bytes * in_flight + transient_bytes (rounded up,
// saturated at 2^62).
int64_t device_memory_bytes(int64_t param_bytes, double activation_bytes, int64_t in_flight,
                            const OptimizerState& optimizer, double transient_bytes = 0.0,
                            const ShardedState& state = {});

// "device 1 (global device 9) needs 18.2 GiB > 16.0 GiB (over by 2.2 GiB)"; pipelines name
// the stage.
std::string memory_infeasible_reason(MpMode mode, int64_t local_device, DeviceIndex global_device,
                                     int64_t need_bytes, int64_t have_bytes);

}  // namespace hybridplan
