// evaluate(problem, plan): the full cost breakdown of any plan (from search, by hand, or from
// another tool). It never searches; search() ranks candidates by exactly this function.
//
//   step_s          = compute_s + allreduce_s + sharding_s + optimizer_s + overhead_s
//   compute_s       = placement: forward + backward makespan (placement_simulation.h); on "cpu"
//                                devices the replica's devices are one process, which runs every
//                                node one after another without transfers
//                     pipeline:  GPipe / 1F1B schedule length (pipeline_schedule.h), each action
//                                paying Cluster runtime.action_s; a stage boundary's transfer
//                                on the link between the two stages' devices (a pipeline
//                                spanning nodes: the inter-node link where consecutive stages
//                                are on two nodes; with tp > 1 tensor_parallel_cost.h
//                                tp_stage_link)
//                     node times at the (micro-)batch from compute_cost.h, multiplied by
//                     runtime.slowdown(processes of the plan on the busiest node); a pipeline's
//                     passes then by the mean of slowdown(processes computing at once) over
//                     each pass in the simulated schedule (rescale_for_waiting_ranks below:
//                     a rank computing while the others wait runs at slowdown(1))
//   allreduce_s     = max over DP groups of the all-reduce time left after backward ends
//                     (allreduce_cost.h: the library's ring, DDP's buckets, overlapped with the
//                     backward pass); pipelines with tied parameters (graph.h TiedParams) add
//                     the sum of the copies' gradients between the stages holding them, after
//                     the schedule: the ring over those stages' devices, per tied parameter
//   sharding_s      = a sharded plan (Plan::sharding; docs/sharding.md) replaces the all-reduce
//                     with all-gathers and reduce-scatters (allreduce_cost.h
//                     group_shard_collective), exposed as follows:
//                     placement (mp = 1), a unit per node with parameters:
//                       "cpu" devices: one thread runs compute and waits for each collective
//                       where it is issued: sum over units of gathers (zero2 1, zero3 2 per
//                       unit) and reduce-scatters;
//                       others: one communication stream beside compute; a unit's all-gather
//                       is issued when the previous unit's forward starts (FSDP2's implicit
//                       prefetch) and its forward waits for it; zero3 gathers again in
//                       backward, the next unit's issued when a unit's backward starts
//                       (FSDP2's backward prefetch); a unit's reduce-scatter is issued when
//                       its backward ends; the exposed part is the step's end with these,
//                       less forward + backward without them
//                       both: plus runtime.sharded_compute_slowdown x compute_s (the ranks
//                       meet at every unit: each waits for the slower one's compute since
//                       the last unit, and the collectives' threads share the cores)
//                     pipeline (zero2), a unit per stage: every stage gathers at its first
//                       forward, on the fill path (sum over stages), and reduce-scatters after
//                       its last backward (torch's schedules): the part past the schedule's end
//                     allreduce_s is then the tied copies' only; the optimizer updates 1/dp of
//                     the bytes, every tensor at runtime.sharded_optimizer_tensor_s
//   tied copies     = in a pipeline, every stage holding a node of a tied parameter other than
//                     the first holds a copy: its bytes join that stage's parameters (memory,
//                     its DP group's all-reduce, its optimizer step)
//   optimizer_s     = optimizer_cost.h: pipeline, the slowest stage's; placement, the
//                     replica's process: the per-tensor cost of all its devices' tensors, the
//                     bytes of its fullest device (all of them when one device runs the replica)
//   overhead_s      = Cluster runtime.step_s where dp > 1, else 0 (Runtime::step_overhead_s)
//   recompute       = a node the plan recomputes (Plan::recompute) runs its forward again
//                     just before its backward: its backward time is backward_s + forward_s
//                     at the same batch (placement, pipeline stages alike), or under selective
//                     recompute backward_s + selective_recompute_fraction * forward_s (the
//                     profiler's measured share of the forward that is not a saved op);
//                     memory_cost.h gives what it saves
//   tensor parallel = a plan with tp > 1 (Plan::tp; docs/tensor_parallel.md): each local device
//                     or stage is a TP group of tp devices of one node. tensor_parallel_cost.h
//                     gives its terms: a split node's forward and backward at ratio_f(t),
//                     ratio_b(t) of its time plus its forward / backward collective on the TP
//                     group (on the critical path, so inside compute_s; tp_comm_s reports
//                     them: placement, the replica's sum; pipeline, the busiest stage's sum
//                     times the micro-batches); per rank its parameters param_bytes -
//                     split_param_bytes * (1 - 1/t), which its gradients, optimizer state,
//                     optimizer step and DP all-reduce (or shards) follow, and its activations
//                     / t where activation_split; each TP rank all-reduces its own gradients
//                     with its replicas, so t such rings run at once and the G of a group
//                     spanning nodes (allreduce_cost.h) is multiplied by t; the process count
//                     per node (compute slowdown) counts every TP rank; a stage boundary
//                     between nodes carries tp copies of the tensor on the node's link
//   sequence par.   = a plan with sequence_parallel (tp > 1): tensor_parallel_cost.h
//                     "Sequence parallelism": per_token nodes at sp_ratio(t) of their time and
//                     1/t of their kept activations, gather nodes' kept activations times
//                     their measured saved_share (inputs gathered apart are kept apart),
//                     every sequence_parallel node's listed
//                     collectives on the TP group on the critical path (in tp_comm_s too),
//                     replacing the TP collectives of its colwise / rowwise nodes
//   memory_bytes[k] = memory_cost.h, per local device / stage; any > device memory: infeasible
//                     (with a 16-bit Job::precision, an fp32 master copy and fp32 optimizer state:
//                     memory_cost.h OptimizerState, which optimizer_s streams too)
//   accumulation    = a plan with accumulation_steps = K > 1 (Plan::accumulation_steps): the
//                     step runs K micro-steps of per_replica_batch samples per replica, and
//                     compute_s (with transfer_s, bubble_s, tp_comm_s) is K times one
//                     micro-step's; allreduce_s is the one synchronisation's, exposed past the
//                     last micro-step's backward; sharding_s the last micro-step's plus K - 1
//                     times a micro-step's without reduce-scatters (their gathers; FSDP2's
//                     set_requires_gradient_sync(False)); optimizer_s and overhead_s once;
//                     memory one micro-step's activations, the step's whole input batch and,
//                     sharded, the unsharded gradients held between micro-steps (memory_cost.h)
//   samples_per_s   = global_batch / step_s
//   epochs          = epochs_to_target(global_batch)                     (convergence.h)
//   time_to_train_s = epochs * ceil(samples_per_epoch / global_batch) * step_s
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

#include "planner/costs/allreduce_cost.h"
#include "planner/costs/compute_cost.h"
#include "planner/costs/memory_cost.h"
#include "planner/documents/plan.h"
#include "planner/documents/problem.h"
#include "planner/simulations/pipeline_schedule.h"
#include "planner/simulations/placement_simulation.h"

namespace hybridplan {

// Evaluates many plans of one Problem quickly: per-batch data (node times, priority orders) is
// computed once per batch size and buffers are reused, so evaluate() allocates almost nothing.
// Holds a reference to `problem`, which must outlive it. Not safe for concurrent evaluate()
// calls on one object (use one Evaluator per thread).
// Whether a plan's graph blocks run eager although the job compiles them: the schedules that
// split each stage's backward into input and weight passes (schedule_splits_backward). A
// compiled block's backward is one autograd node computing both, which the weight pass would
// run a second time, so the executor runs them eager (python/hybridplan/executor/compiling.py
// eager_reason; test_compile_blocks holds the two rules together). Blocks recomputed
// selectively run eager under every schedule (Evaluator::with_recompute).
bool blocks_run_eager(const Plan& plan);
// A node that runs eager under a compiled job at tensor-parallel degree `degree`
// (tp_node_degrees): a vocabulary-split embedding (vocab_rowwise) split over degree >= 2, whose
// masked partial output torch 2.13 cannot carry out of a compiled region (compiling.py
// node_eager_reason; test_compile_blocks holds the two rules together).
bool node_runs_eager(const Node& node, int64_t degree);

class Evaluator {
 public:
  // Throws InputError when the job's optimizer state does not fit the graph (memory_cost.h
  // optimizer_state: mixed precision on a 32-bit graph).
  explicit Evaluator(const Problem& problem);

  // The breakdown of `plan`, which must fit the problem (validate it at the boundary:
  // Plan::validate); shapes are checked here (InputError) but not the graph hash.
  Prediction evaluate(const Plan& plan) const;
  const Problem& problem() const { return problem_; }
  BucketCaps bucket_caps;  // bucket_policy.h: DDP's

  // Node times at `batch` samples, multiplied by `slowdown`, under tensor-parallel degree `tp`
  // and sequence parallelism on or off (tensor_parallel_cost.h apply_tensor_parallel; cached
  // per tuple). Pass a plan's tp and sequence_parallel together. Under a job's compile each
  // node is at its measured compile speed-up, unless `eager` (blocks_run_eager: the plan's
  // blocks run eager all the same).
  const NodeTimes& node_times(double batch, double slowdown = 1.0, int64_t tp = 1,
                              bool sequence_parallel = false, bool eager = false) const;
  // The degree each node runs at under tensor-parallel degree `tp` (tensor_parallel_cost.h
  // tp_node_degrees: tp where it splits, else 1; cached per tp).
  const std::vector<int64_t>& node_degrees(int64_t tp) const;
  // The factor on each node's kept activations under (tp, sequence_parallel)
  // (tensor_parallel_cost.h tp_activation_shares; cached).
  const std::vector<double>& activation_shares(int64_t tp, bool sequence_parallel) const;
  // `times` with the plan's recomputed forwards added to their nodes' backward (the same
  // object when the plan recomputes nothing; else valid until the next call).
  const NodeTimes& with_recompute(const Plan& plan, const NodeTimes& times) const;
  // The placement priority order for those times (cached with them).
  const PlacementOrder& placement_order(double batch, double slowdown = 1.0, int64_t tp = 1,
                                        bool sequence_parallel = false) const;
  // The compute multiplier of the plan's process layout: Cluster runtime.slowdown of the number
  // of the plan's processes on its busiest node.
  double compute_slowdown(const Plan& plan) const;
  // The simulated schedule of a pipeline plan: per rank (= stage for one stage per rank), its
  // passes with start and end times from the step's start (what pipeline_compute() simulated).
  struct TimedPass {
    PipelinePass pass;
    double start_s = 0;
    double end_s = 0;
  };
  std::vector<std::vector<TimedPass>> pipeline_timeline(const Plan& plan) const;
  // True when a replica's devices are one process that runs them one after another ("cpu").
  bool serial_replica_devices() const { return problem_.cluster.device.type == "cpu"; }
  const ComputeModel& compute_model() const { return compute_; }
  // What the optimizer keeps per parameter (memory_cost.h): the job's optimizer and precision.
  const OptimizerState& optimizer_state() const { return optimizer_state_; }

 private:
  struct BatchCosts {
    NodeTimes times;
    std::optional<PlacementOrder> order;
  };
  BatchCosts& batch_costs(double batch, double slowdown, int64_t tp, bool sequence_parallel,
                          bool eager = false) const;
  void check_shape(const Plan& plan) const;
  double placement_compute(const Plan& plan, double slowdown, Prediction& out) const;
  double pipeline_compute(const Plan& plan, double slowdown, Prediction& out) const;
  // The timeline pipeline_compute() last simulated, per rank (pipeline_timeline's).
  void simulated_timeline(const Plan& plan, std::vector<std::vector<TimedPass>>& out) const;
  // Shared cores (runtime.shared_host_slowdown; slowdown(1) is 1 below the table): the node
  // times pipeline_compute() passes are at slowdown(P), P the plan's processes on the busiest
  // node, as if all of them computed all the time. A pipeline's ranks do not: through fill and
  // drain, and through all of a step of few micro-batches, one rank computes while the others
  // wait for its output, and a process computing while the others wait runs at slowdown(1)
  // (calibrate's "alone" rounds measure it). So each stage's F, B (or I) and W are scaled, their
  // compute part (less the schedule's action cost), by the mean over the simulated passes of
  //     (1 / (end - start)) * integral over the pass of slowdown(c(t)) / slowdown(P) dt,
  // c(t) = the processes computing on the busiest node at t (a pipeline rank counts its
  // replicas there times tp: replicas run the same schedule at once); ranks with no process
  // there keep slowdown(P). Returns true when it changed a time (the caller simulates again:
  // one refinement, since shortened passes move the others' overlap only a little).
  bool rescale_for_waiting_ranks(const Plan& plan, double slowdown, double action_s) const;
  double exposed_allreduce_s(const Plan& plan, double compute_s, Prediction& out) const;
  double optimizer_s(const Plan& plan) const;
  // Per local device / stage: parameter bytes including tied copies (param_bytes_).
  void fill_param_bytes(const Plan& plan) const;
  double tied_allreduce_s(const Plan& plan) const;
  // sharding_s above (after placement_compute / pipeline_compute filled gradient_ready_s_).
  // `reduce` false: a micro-step before an accumulation's last (gathers only, no reduction).
  double exposed_sharding_s(const Plan& plan, double compute_s, double slowdown, bool reduce) const;
  // groups_on_node_: per node, the DP groups with bytes (group_bytes_) that span nodes and
  // have a member there.
  void count_groups_on_nodes(const Plan& plan) const;
  // group_ready_s_[k] = when the last gradient of local device / stage k is ready (the latest
  // gradient_ready_s_ of its nodes).
  void fill_group_ready_s(const Plan& plan) const;
  // groups_on_node_ for hybrid sharding: per node, the HSDP shard groups (shard_groups) or
  // replicate groups that span nodes and have a member there.
  void count_hybrid_groups_on_nodes(const Plan& plan, bool shard_groups) const;
  // group_devices_ = device k of replicas first, first + stride, ... (count of them; -1: all
  // dp, the DP group k in rank order; an HSDP shard group: stride 1, dp_shard of them; a
  // replicate group: stride dp_shard); returns its G, the groups counted in groups_on_node_
  // sharing its busiest node.
  int64_t fill_group_devices(const Plan& plan, int64_t k, int64_t first = 0, int64_t stride = 1,
                             int64_t count = -1) const;
  void memory(const Plan& plan, Prediction& out) const;
  // memory()'s steps at `scale` (batch_scale of the batch a pass runs): per device or stage,
  // the activations kept for the backward, the parameters (fill_param_bytes) and what
  // recomputing rebuilds; the transient bytes (backward workspace, recomputed activations, the
  // input batch, the held output, receive buffers); a multi-stage rank's stages folded into
  // the rank (activations by its pass order, held buffers summed).
  void memory_kept(const Plan& plan, double scale) const;
  void memory_transient(const Plan& plan, double scale) const;
  void memory_fold_ranks(const Plan& plan, double scale) const;

  // The problem in the job's precision where it converts the graph (precision_cost.h), which
  // problem_ then refers to; null otherwise (problem_ is the caller's).
  std::shared_ptr<const Problem> converted_;
  const Problem& problem_;
  // The problem as FSDP2's plans keep their activations (precision_cost.h PrecisionPolicy:
  // halved), where it differs from problem_'s (autocast's, as recorded); null otherwise.
  // memory_graph picks the graph a plan's memory terms read.
  std::shared_ptr<const Problem> fsdp_;
  const Graph& memory_graph(const Plan& plan) const;
  ComputeModel compute_;
  OptimizerState optimizer_state_;
  double reduce_ratio_ = 1;  // gradient_reduce_ratio (precision_cost.h)
  std::vector<NodeIndex> reverse_topo_;
  std::string memory_models_[2];  // Prediction memory_model under autocast, under FSDP2's policy
  mutable std::map<std::tuple<double, double, int64_t, bool, bool>, std::unique_ptr<BatchCosts>>
      batch_costs_;
  mutable std::map<int64_t, std::vector<int64_t>> node_degrees_;  // per tp
  mutable std::map<std::pair<int64_t, bool>, std::vector<double>> activation_shares_;

  // Reused between calls.
  mutable LocalLinks links_;
  mutable PlacementScratch placement_;
  mutable std::vector<int32_t> serial_assignment_;
  mutable PipelineStages stages_;
  mutable std::vector<double> p2p_s_;
  mutable std::vector<double> weight_s_;          // per stage: W of a split backward
  mutable std::vector<char> input_region_;        // per node: in its stage's input region
  mutable std::vector<char> carries_gradient_;    // per node: scratch of stage_input_region
  mutable std::vector<int64_t> stage_param_bytes_;  // per pipeline stage (tied copies included)
  mutable PipelineScratch pipeline_;
  mutable std::vector<double> gradient_ready_s_;   // per node, absolute within the step
  mutable std::vector<double> stage_backward_s_;   // per stage: cumulated backward in last mb
  mutable std::vector<double> stage_tp_comm_s_;    // per stage: TP collectives per micro-batch
  mutable std::vector<double> stage_activation_bytes_;  // per pipeline stage, one micro-batch
  mutable std::vector<double> stage_transient_bytes_;   // per pipeline stage
  mutable std::vector<double> stage_workspace_bytes_;   // per stage: live while it computes
  mutable std::vector<double> node_kept_bytes_;  // per node: the activations it keeps for backward
  mutable std::vector<double> freed_bytes_;      // per device / stage: what the nodes whose backward ran have freed
  mutable std::vector<double> split_held_bytes_;        // per stage: held from I to W
  mutable std::vector<double> input_workspace_bytes_;   // per stage: workspace of its B or I
  mutable std::vector<double> weight_workspace_bytes_;  // per stage: workspace of its W
  mutable std::vector<double> group_bytes_;        // per local device / stage
  mutable std::vector<double> group_ready_s_;      // per local device / stage
  mutable std::vector<BucketedAllReduce> buckets_;
  // group_allreduce() memo: (group devices, concurrent groups per node) -> (cost, ring order).
  static constexpr size_t kAllReduceCacheEntries = 4096;
  // keyed by the group's devices with its `concurrent` appended (looked up without a copy:
  // group_devices_ takes the extra entry for the lookup)
  mutable std::map<std::vector<DeviceIndex>, std::pair<AllReduceCost, std::vector<DeviceIndex>>>
      allreduce_cache_;
  // group_shard_collective (kind, 0) or group_allreduce (kind, 1) of group_devices_ sharing
  // its busiest node with `concurrent` groups, remembered like allreduce_cache_ (the sharded
  // plans of a search price the same groups for every split).
  const AllReduceCost& shard_group_cost(Collective kind, bool allreduce, int64_t concurrent) const;
  mutable std::map<std::vector<DeviceIndex>, AllReduceCost> shard_cost_cache_;  // likewise, + kind
  mutable std::vector<DeviceIndex> group_devices_;
  mutable std::vector<int64_t> groups_on_node_;
  mutable std::vector<int64_t> node_stamp_;
  mutable std::vector<int64_t> processes_on_node_;
  mutable int64_t busiest_node_ = 0;  // compute_slowdown: the node with the most processes
  mutable std::vector<int64_t> rank_weight_;              // rescale_for_waiting_ranks: per rank
  mutable std::vector<std::vector<TimedPass>> timeline_;  // ... the first simulation's passes
  mutable std::vector<std::pair<double, int64_t>> busy_events_;
  mutable std::vector<double> breakpoint_s_;
  mutable std::vector<double> segment_ratio_;
  mutable std::vector<double> integral_s_;
  mutable std::vector<double> ratio_sum_;
  mutable std::vector<int64_t> ratio_count_;
  mutable std::vector<double> activation_bytes_;
  mutable std::vector<double> transient_bytes_;  // memory_cost.h: workspace + receive buffers
  mutable std::vector<double> recompute_bytes_;  // memory_cost.h: activations recomputed at once
  mutable std::vector<double> largest_unit_bytes_;  // per device: its largest node's parameters
  mutable std::vector<int64_t> recompute_inputs_;  // [producer * mp + device]: bytes kept
  mutable NodeTimes recompute_times_;            // node times with recomputed forwards added
  mutable std::vector<AllReduceCost> gather_cost_;   // per DP group (sharded plans)
  mutable std::vector<AllReduceCost> scatter_cost_;
  mutable std::vector<AllReduceCost> replicate_cost_;  // HSDP: the shards' all-reduce per group
  mutable std::vector<NodeIndex> units_;             // sharded units in backward order
  mutable std::vector<double> gathered_s_;           // per node: its backward gather's end
  mutable std::vector<int64_t> param_bytes_;
  mutable std::vector<int64_t> param_tensors_;  // per device / stage, the same way (counted ones)
  mutable std::vector<char> stage_stamp_;
};

// Returns the breakdown. An infeasible plan (memory) gets feasible=false and a reason; the
// ranking objective of an infeasible plan is +infinity.
Prediction evaluate(const Problem& problem, const Plan& plan);

// The objective search minimises: time_to_train_s with a convergence model, else 1/samples_per_s
// expressed as seconds per sample. +infinity when infeasible.
double objective(const Problem& problem, const Prediction& p);

// The order of candidate plans of one search point (one batch, so the objective follows the
// step time): a plan that fits beats one that does not; among plans that fit the shorter step,
// among plans that do not the smaller peak memory (peak_memory_bytes).
bool better_prediction(const Prediction& a, const Prediction& b);

}  // namespace hybridplan
