// Placement search: the node -> local device assignment of one replica (dp, mp, mesh and batch
// fixed) that minimises the evaluated step time.
//
// Formulation: variables x_v in {0..mp-1} for every node v; minimise step_s(x) =
// Evaluator::evaluate(plan with assignment x).step_s over assignments whose every device fits
// in memory. For a fixed (dp, mp, per-replica batch) the search objective (time to train, or
// seconds per sample) is step_s times a constant, so minimising step_s minimises it.
//
// Lower bound (placement_simulation.h: forward makespan + backward makespan, each a list
// schedule where a device runs one node at a time and a node waits for its inputs):
//   LB = max(CP_f, W_f / mp, max_d L_f(d)) + max(CP_b, W_b / mp, max_d L_b(d))
//   CP_f: longest path of forward_s (+ transfers known to cross devices), W_f total forward_s,
//   L_f(d) forward_s already on device d; the same with backward_s for the backward pass.
// Exact (<= exact_max_nodes nodes): depth-first branch and bound over the nodes in topological
// order, pruning when LB >= the incumbent's step_s or a device is over memory (memory only
// grows as nodes are added). Symmetry: local devices i and j are interchangeable when swapping
// them leaves every link the cost model reads unchanged (links inside each replica and the
// links of their data-parallel groups across replicas); a node may then go to any used device
// of a class or only to the class's lowest unused one (devices differing in links are never
// merged). The incumbent starts from the heuristic.
// Heuristic (larger graphs): seeds (a HEFT-style earliest-finish list assignment, Topcuoglu et
// al., IEEE TPDS 2002, https://doi.org/10.1109/71.993206; the compute-balanced and the
// memory-balanced contiguous splits of the topological order; everything on device 0), then
// first-improvement local search moving single nodes to a neighbour's device, each move
// evaluated by the cost model, within a deterministic budget of node visits. Its gap to LB is
// reported: compute_s / LB - 1 >= 0.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/costs/evaluate.h"
#include "planner/documents/plan.h"

namespace hybridplan {

struct PlacementSearchOptions {
  int exact_max_nodes = 10;  // branch and bound up to this many nodes, heuristic above
  // Local search budget: evaluations * (nodes + edges) node visits at most (deterministic).
  int64_t local_search_node_visits = 2'000'000;
};

struct PlacementOutcome {
  std::vector<int32_t> assignment;  // best found (feasible when any assignment tried fits)
  Prediction predicted;             // its evaluate() breakdown
  bool exact = false;               // proven optimal by branch and bound
  double lower_bound_compute_s = 0; // LB above for the empty assignment (valid for any)
  double gap = 0;                   // predicted.compute_s / lower_bound_compute_s - 1
  int64_t evaluations = 0;
  std::string note;                 // "exact (branch and bound, 123 evaluations)" or the gap
};

// `base` carries dp, mp (>= 1), mesh and per_replica_batch; its assignment is ignored.
PlacementOutcome search_placement(const Evaluator& evaluator, const Plan& base,
                                  const PlacementSearchOptions& options);

// The heuristic alone (also the incumbent of the exact search).
PlacementOutcome heuristic_placement(const Evaluator& evaluator, const Plan& base,
                                     const PlacementSearchOptions& options);

// LB of the empty assignment at the plan's per-replica batch and process layout, in seconds.
double placement_lower_bound_s(const Evaluator& evaluator, const Plan& base);

// interchangeable[i] = the smallest local device j with i and j interchangeable (see above).
std::vector<int32_t> interchangeable_devices(const Cluster& cluster,
                                             const std::vector<std::vector<DeviceIndex>>& mesh);

}  // namespace hybridplan
