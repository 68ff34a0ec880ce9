// Pipeline search: the stage assignment of one pipeline point (dp, mp = S stages, batch b,
// M micro-batches, schedule and mesh fixed). Stages are contiguous intervals of
// graph.topo_order (which keeps stage numbers non-decreasing along every edge).
//
// Exact (graph has <= exact_max_nodes nodes): every one of the C(n-1, S-1) contiguous splits
// is evaluated with Evaluator::evaluate and the best step_s wins, so the result is optimal for
// the full cost model over contiguous splits.
// Stages begin only at nodes whose cut_before is true (graph.h).
// Larger graphs: the bottleneck DP of pipeline_partition.h on the stage-time proxy
//   stage_s = M * (F_s + B_s)                                       (compute at b/M samples)
//           + 2 * M * p2p(boundary in) + 2 * M * p2p(boundary out)  (activations + gradients)
//   p2p(cut at p between stages l, l+1) = latency + cut_bytes(p) * (b/M)/b0 / bandwidth
//   cut_bytes(p) = sum over nodes u before p whose last consumer is at or after p of u's
//                  largest out-edge bytes (pipeline_schedule.h counts values the same way)
// subject to memory_cost.h per stage (parameters, gradients, optimizer state and tied copies;
// activations times the schedule's in-flight micro-batches; the backward workspace, torch's
// receive buffers (M per cut, each way), the input batch and the held output), then
// evaluated. Each stage keeps its activations where that fits, else recomputes selectively
// (every node measured) or fully, whichever is the fastest that fits, with the forwards run
// again in its stage_s: the split is chosen with its recompute (a split chosen for keeping and
// recomputed afterwards puts too much on the stages with few micro-batches in flight: Megatron's
// 529.6B layout was missed so). The proxy is the steady-state cost of the slowest stage; the
// schedule's fill/drain is common to all splits. Where no split fits, the split whose fullest
// stage needs the least memory (each stage's least-memory kind) is evaluated and reported.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <string>
#include <vector>

#include "planner/costs/evaluate.h"
#include "planner/documents/plan.h"
#include "planner/searches/pipeline_partition.h"

namespace hybridplan {

struct PipelineOutcome {
  std::vector<int32_t> assignment;  // stage per node; empty when the graph has < S nodes
  std::vector<uint8_t> recompute;   // Plan::recompute of the split (empty: none)
  Prediction predicted;
  bool exact = false;
  int64_t evaluations = 0;
  std::string note;
};

// Remembers the DP's split without memory limits per (stages, micro-batch size, stage devices),
// shared by the points of one search: see optimal() in pipeline_search.cc.
class PipelinePartitionCache {
 public:
  // `unconstrained` (optional): set to whether the result is the split without memory limits
  // (no stage recomputes, none moved for memory). `least_memory` (optional): where the split
  // without limits does not fit, the least-memory split (least_memory_partition) is found
  // first and left here; when even it does not fit, no split does, and nullopt is returned
  // without the constrained DP (most points of a large model that fit nowhere cost one DP
  // instead of two).
  std::optional<Partition> optimal(const PartitionCosts& costs, const Plan& base,
                                   bool* unconstrained = nullptr,
                                   std::optional<Partition>* least_memory = nullptr);

  // The calls of each module that has several (module_of_call), found on first use: the calls
  // recompute alike (pipeline_search.cc stage_recompute). One graph per cache.
  const std::vector<std::vector<size_t>>& shared_module_calls(const Graph& graph);

 private:
  std::optional<std::vector<std::vector<size_t>>> module_calls_;
  // (stages, V mapping, micro-batch, the replica's devices, tp) -> the split without memory limits
  std::map<std::tuple<int64_t, bool, double, std::vector<DeviceIndex>, int64_t>, std::optional<Partition>>
      unconstrained_;
};

// `base`: a pipeline plan skeleton (mode, schedule, mp, num_microbatches, mesh, batch). `cache`
// (optional) shares DP results between points of one search.
PipelineOutcome search_pipeline(const Evaluator& evaluator, const Plan& base,
                                int exact_max_nodes, PipelinePartitionCache* cache = nullptr);

// The proxy costs above for `base` (positions = graph.topo_order), with node times from the
// evaluator's compute model at the micro-batch and the stage starts the graph allows.
PartitionCosts pipeline_partition_costs(const Evaluator& evaluator, const Plan& base);

// Stage per node from a split of the topological order.
std::vector<int32_t> stages_from_split(const Graph& graph, const std::vector<int64_t>& starts);

}  // namespace hybridplan
