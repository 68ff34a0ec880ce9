// evaluate(problem, plan): the full cost breakdown of any plan (from search, by hand, or from
// another tool). It never searches; search() ranks candidates by exactly this function.
//
//   step_s          = compute_s + allreduce_s + optimizer_s + overhead_s
//   compute_s       = placement: forward + backward makespan (placement_schedule.h); on "cpu"
//                                devices the replica's devices are one process, which runs every
//                                node one after another without transfers
//                     pipeline:  GPipe / 1F1B schedule length (pipeline_schedule.h), each action
//                                paying Cluster runtime.action_s
//                     node times at the (micro-)batch from compute_cost.h, multiplied by
//                     runtime.slowdown(processes of the plan on the busiest node)
//   allreduce_s     = max over DP groups of the all-reduce time left after backward ends
//                     (allreduce_cost.h: the library's ring, DDP's buckets, overlapped with the
//                     backward pass); pipelines with tied parameters (graph.h TiedParams) add
//                     the sum of the copies' gradients between the stages holding them, after
//                     the schedule: the ring over those stages' devices, per tied parameter
//   tied copies     = in a pipeline, every stage holding a node of a tied parameter other than
//                     the first holds a copy: its bytes join that stage's parameters (memory,
//                     its DP group's all-reduce, its optimizer step)
//   optimizer_s     = optimizer_cost.h: pipeline, the slowest stage's; placement, the
//                     replica's process: the per-tensor cost of all its devices' tensors, the
//                     bytes of its fullest device (all of them when one device runs the replica)
//   overhead_s      = Cluster runtime.step_s
//   recompute       = a node the plan recomputes (Plan::recompute) runs its forward again
//                     just before its backward: its backward time is backward_s + forward_s
//                     at the same batch (placement, pipeline stages alike); memory_cost.h
//                     gives what it saves
//   memory_bytes[k] = memory_cost.h, per local device / stage; any > device memory: infeasible
//   samples_per_s   = global_batch / step_s
//   epochs          = epochs_to_target(global_batch)                     (convergence.h)
//   time_to_train_s = epochs * ceil(samples_per_epoch / global_batch) * step_s
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "planner/allreduce_cost.h"
#include "planner/compute_cost.h"
#include "planner/pipeline_schedule.h"
#include "planner/placement_schedule.h"
#include "planner/plan.h"
#include "planner/problem.h"

namespace hybridplan {

// Evaluates many plans of one Problem quickly: per-batch data (node times, priority orders) is
// computed once per batch size and buffers are reused, so evaluate() allocates almost nothing.
// Holds a reference to `problem`, which must outlive it. Not safe for concurrent evaluate()
// calls on one object (use one Evaluator per thread).
class Evaluator {
 public:
  explicit Evaluator(const Problem& problem);

  // The breakdown of `plan`, which must fit the problem (validate it at the boundary:
  // Plan::validate); shapes are checked here (InputError) but not the graph hash.
  Prediction evaluate(const Plan& plan) const;
  const Problem& problem() const { return problem_; }
  BucketCaps bucket_caps;  // bucket_policy.h: DDP's

  // Node times at `batch` samples, multiplied by `slowdown` (cached per pair).
  const NodeTimes& node_times(double batch, double slowdown = 1.0) const;
  // `times` with the plan's recomputed forwards added to their nodes' backward (the same
  // object when the plan recomputes nothing; else valid until the next call).
  const NodeTimes& with_recompute(const Plan& plan, const NodeTimes& times) const;
  // The placement priority order for those times (cached with them).
  const PlacementOrder& placement_order(double batch, double slowdown = 1.0) const;
  // The compute multiplier of the plan's process layout: Cluster runtime.slowdown of the number
  // of the plan's processes on its busiest node.
  double compute_slowdown(const Plan& plan) const;
  // The simulated schedule of a pipeline plan: per stage, its passes with start and end times
  // from the step's start (what pipeline_compute() simulated).
  struct TimedPass {
    PipelinePass pass;
    double start_s = 0;
    double end_s = 0;
  };
  std::vector<std::vector<TimedPass>> pipeline_timeline(const Plan& plan) const;
  // True when a replica's devices are one process that runs them one after another ("cpu").
  bool serial_replica_devices() const { return problem_.cluster.device.type == "cpu"; }
  const ComputeModel& compute_model() const { return compute_; }

 private:
  struct BatchCosts {
    NodeTimes times;
    std::optional<PlacementOrder> order;
  };
  BatchCosts& batch_costs(double batch, double slowdown) const;
  void check_shape(const Plan& plan) const;
  double placement_compute(const Plan& plan, double slowdown, Prediction& out) const;
  double pipeline_compute(const Plan& plan, double slowdown, Prediction& out) const;
  double exposed_allreduce_s(const Plan& plan, double compute_s, Prediction& out) const;
  double optimizer_s(const Plan& plan) const;
  // Per local device / stage: parameter bytes including tied copies (param_bytes_).
  void fill_param_bytes(const Plan& plan) const;
  double tied_allreduce_s(const Plan& plan) const;
  void memory(const Plan& plan, Prediction& out) const;

  const Problem& problem_;
  ComputeModel compute_;
  std::vector<NodeIndex> reverse_topo_;
  mutable std::map<std::pair<double, double>, std::unique_ptr<BatchCosts>> batch_costs_;

  // Reused between calls.
  mutable LocalLinks links_;
  mutable PlacementScratch placement_;
  mutable std::vector<int32_t> serial_assignment_;
  mutable PipelineStages stages_;
  mutable std::vector<double> p2p_s_;
  mutable PipelineScratch pipeline_;
  mutable std::vector<double> gradient_ready_s_;   // per node, absolute within the step
  mutable std::vector<double> stage_backward_s_;   // per stage: cumulated backward in last mb
  mutable std::vector<double> group_bytes_;        // per local device / stage
  mutable std::vector<BucketedAllReduce> buckets_;
  // group_allreduce() memo: (group devices, concurrent groups per node) -> (cost, ring order).
  static constexpr size_t kAllReduceCacheEntries = 4096;
  mutable std::map<std::pair<std::vector<DeviceIndex>, int64_t>,
                   std::pair<AllReduceCost, std::vector<DeviceIndex>>>
      allreduce_cache_;
  mutable std::vector<DeviceIndex> group_devices_;
  mutable std::vector<int64_t> groups_on_node_;
  mutable std::vector<int64_t> node_stamp_;
  mutable std::vector<int64_t> processes_on_node_;
  mutable std::vector<double> activation_bytes_;
  mutable std::vector<double> transient_bytes_;  // memory_cost.h: workspace + receive buffers
  mutable std::vector<double> recompute_bytes_;  // memory_cost.h: activations recomputed at once
  mutable std::vector<int64_t> recompute_inputs_;  // [producer * mp + device]: bytes kept
  mutable NodeTimes recompute_times_;            // node times with recomputed forwards added
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

}  // namespace hybridplan
