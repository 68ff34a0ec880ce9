// evaluate(problem, plan): the full cost breakdown of any plan (from search, by hand, or from
// another tool). It never searches; search() ranks candidates by exactly this function.
//
//   step_s          = compute_s + allreduce_s
//   compute_s       = placement: forward + backward makespan (placement_schedule.h)
//                     pipeline:  GPipe / 1F1B schedule length (pipeline_schedule.h)
//   allreduce_s     = max over DP groups of the all-reduce time left after backward ends
//                     (allreduce_cost.h: bucketed, overlapped with the backward pass)
//   memory_bytes[k] = memory_cost.h, per local device / stage; any > device memory: infeasible
//   samples_per_s   = global_batch / step_s
//   epochs          = epochs_to_target(global_batch)                     (convergence.h)
//   time_to_train_s = epochs * ceil(samples_per_epoch / global_batch) * step_s
#pragma once
#include <map>
#include <vector>

#include "planner/allreduce_cost.h"
#include "planner/pipeline_schedule.h"
#include "planner/placement_schedule.h"
#include "planner/plan.h"
#include "planner/problem.h"

namespace hybridplan {

// Evaluates many plans of one Problem quickly: per-graph data (priority orders) is computed
// once and buffers are reused, so evaluate() allocates almost nothing. Holds a reference to
// `problem`, which must outlive it. Not safe for concurrent evaluate() calls on one object
// (use one Evaluator per thread).
class Evaluator {
 public:
  explicit Evaluator(const Problem& problem);

  // The breakdown of `plan`, which must fit the problem (validate it at the boundary:
  // Plan::validate); shapes are checked here (InputError) but not the graph hash.
  Prediction evaluate(const Plan& plan) const;
  const Problem& problem() const { return problem_; }
  double bucket_cap_bytes = kDefaultBucketCapBytes;

 private:
  void check_shape(const Plan& plan) const;
  double placement_compute(const Plan& plan, Prediction& out) const;
  double pipeline_compute(const Plan& plan, Prediction& out) const;
  double exposed_allreduce_s(const Plan& plan, double compute_s) const;
  void memory(const Plan& plan, Prediction& out) const;

  const Problem& problem_;
  PlacementOrder order_;
  std::vector<NodeIndex> reverse_topo_;

  // Reused between calls.
  mutable LocalLinks links_;
  mutable PlacementScratch placement_;
  mutable PipelineStages stages_;
  mutable std::vector<double> p2p_s_;
  mutable PipelineScratch pipeline_;
  mutable std::vector<double> gradient_ready_s_;   // per node, absolute within the step
  mutable std::vector<double> stage_backward_s_;   // per stage: cumulated backward in last mb
  mutable std::vector<double> group_bytes_;        // per local device / stage
  mutable std::vector<BucketedAllReduce> buckets_;
  // group_allreduce() memo: (group devices, concurrent groups per node) -> cost.
  static constexpr size_t kAllReduceCacheEntries = 4096;
  mutable std::map<std::pair<std::vector<DeviceIndex>, int64_t>, AllReduceCost> allreduce_cache_;
  mutable std::vector<DeviceIndex> group_devices_;
  mutable std::vector<int64_t> groups_on_node_;
  mutable std::vector<int64_t> node_stamp_;
  mutable std::vector<double> activation_bytes_;
  mutable std::vector<int64_t> param_bytes_;
};

// Returns the breakdown. An infeasible plan (memory) gets feasible=false and a reason; the
// ranking objective of an infeasible plan is +infinity.
Prediction evaluate(const Problem& problem, const Plan& plan);

// The objective search minimises: time_to_train_s with a convergence model, else 1/samples_per_s
// expressed as seconds per sample. +infinity when infeasible.
double objective(const Problem& problem, const Prediction& p);

}  // namespace hybridplan
