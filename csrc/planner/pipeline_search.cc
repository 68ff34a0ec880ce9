#include "planner/pipeline_search.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "common/error.h"
#include "planner/compute_cost.h"
#include "planner/memory_cost.h"
#include "planner/tensor_parallel_cost.h"

namespace hybridplan {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The split needing the least memory on its fullest stage, by bisection on the capacity
// (fits() is monotone in it), to 0.1 % (the message prints three digits): used only to report
// how far from fitting a point is.
std::vector<int64_t> least_memory_split(PartitionCosts costs) {
  std::fill(costs.prefix_compute_s.begin(), costs.prefix_compute_s.end(), 0.0);
  for (auto& row : costs.boundary_s) std::fill(row.begin(), row.end(), 0.0);
  const int64_t n = costs.num_positions();
  const double max_mult =
      *std::max_element(costs.activation_multiplier.begin(), costs.activation_multiplier.end());
  double lo = 0, hi = costs.prefix_static_bytes[n] + max_mult * costs.prefix_activation_bytes[n];
  costs.memory_capacity_bytes = hi;
  auto best = optimal_partition(costs);
  for (int it = 0; it < 60 && hi - lo > 1e-3 * hi; ++it) {
    costs.memory_capacity_bytes = (lo + hi) / 2;
    if (auto p = optimal_partition(costs)) {
      hi = costs.memory_capacity_bytes;
      best = std::move(p);
    } else {
      lo = costs.memory_capacity_bytes;
    }
  }
  return best->stage_starts;
}

}  // namespace

std::vector<int32_t> stages_from_split(const Graph& graph, const std::vector<int64_t>& starts) {
  std::vector<int32_t> a(graph.nodes.size(), 0);
  for (size_t s = 0; s + 1 < starts.size(); ++s)
    for (int64_t p = starts[s]; p < starts[s + 1]; ++p) a[graph.topo_order[p]] = static_cast<int32_t>(s);
  return a;
}

PartitionCosts pipeline_partition_costs(const Evaluator& evaluator, const Plan& base) {
  const Problem& problem = evaluator.problem();
  const Graph& g = problem.graph;
  const auto n = static_cast<int64_t>(g.nodes.size());
  const int k = static_cast<int>(base.num_stages());
  const double m = static_cast<double>(base.num_microbatches);
  const double microbatch = static_cast<double>(base.per_replica_batch) / m;
  const double micro_scale = batch_scale(g, microbatch);
  const NodeTimes& micro = evaluator.node_times(microbatch, evaluator.compute_slowdown(base), base.tp,
                                                base.sequence_parallel);
  // The stage's parameter state per parameter byte under the plan's sharding (memory_cost.h).
  ShardedState sharded;
  sharded.sharding = base.sharding;
  sharded.dp = base.shard_degree();
  sharded.pipeline = true;
  const double state_copies = parameter_state_bytes(1.0, evaluator.optimizer_state(), sharded);

  const std::vector<int64_t>& degrees = evaluator.node_degrees(base.tp);
  const std::vector<double>& shares = evaluator.activation_shares(base.tp, base.sequence_parallel);
  std::vector<int64_t> position(n);
  for (int64_t p = 0; p < n; ++p) position[g.topo_order[p]] = p;
  // cut_bytes(p) by a difference array: node u at q with last consumer at L crosses (q, L].
  // cut_tensors(p) likewise: each crossing value is its own message (pipeline_schedule.h).
  std::vector<double> cut_bytes(n + 1, 0.0), cut_tensors(n + 1, 0.0);
  for (int64_t v = 0; v < n; ++v) {
    int64_t last = -1, bytes = 0;
    for (int32_t e : g.out_edges[v]) {
      last = std::max(last, position[g.edges[e].dst]);
      bytes = std::max(bytes, g.edges[e].bytes);
    }
    if (last < 0) continue;
    cut_bytes[position[v] + 1] += static_cast<double>(bytes);
    cut_bytes[last + 1] -= static_cast<double>(bytes);
    cut_tensors[position[v] + 1] += 1;
    cut_tensors[last + 1] -= 1;
  }
  for (int64_t p = 1; p <= n; ++p) {
    cut_bytes[p] += cut_bytes[p - 1];
    cut_tensors[p] += cut_tensors[p - 1];
  }

  PartitionCosts c;
  c.prefix_compute_s.assign(n + 1, 0.0);
  c.prefix_static_bytes.assign(n + 1, 0.0);
  c.prefix_activation_bytes.assign(n + 1, 0.0);
  c.cut_before.assign(n + 1, 1);
  for (int64_t p = 0; p < n; ++p) {
    const NodeIndex v = g.topo_order[p];
    const Node& node = g.nodes[v];
    c.cut_before[p] = node.cut_before ? 1 : 0;
    c.prefix_compute_s[p + 1] =
        c.prefix_compute_s[p] + m * (micro.forward_s[v] + micro.backward_s[v]);
    c.prefix_static_bytes[p + 1] =
        c.prefix_static_bytes[p] + static_cast<double>(tp_param_bytes(node, degrees[v])) * state_copies;
    c.prefix_activation_bytes[p + 1] =
        c.prefix_activation_bytes[p] +
        shares[v] * scaled_bytes(node.activation_bytes(), micro_scale);
  }
  c.boundary_s.assign(k - 1, std::vector<double>(n + 1, 0.0));
  for (int l = 0; l + 1 < k; ++l) {
    const int64_t from = base.device_of(l), to = base.device_of(l + 1);
    if (from == to) continue;  // zbv's turn: two stages of one rank
    const Link link = tp_stage_link(problem.cluster, base.mesh[0][from], base.mesh[0][to], base.tp);
    for (int64_t p = 0; p <= n; ++p) {
      if (cut_bytes[p] <= 0) continue;
      c.boundary_s[l][p] = 2 * m * boundary_p2p_s(link, cut_tensors[p], cut_bytes[p] * micro_scale);
    }
  }
  c.activation_multiplier.resize(k);
  const bool multi_stage = schedule_is_multi_stage(base.schedule);
  const PipelineShape shape{.num_stages = k, .num_microbatches = base.num_microbatches, .num_ranks = base.mp};
  std::vector<std::vector<PipelinePass>> passes(multi_stage ? base.mp : 0);  // per rank, once
  for (int64_t r = 0; r < static_cast<int64_t>(passes.size()); ++r) {
    passes[r] = rank_passes(base.schedule, shape, r);
  }
  std::vector<double> one_stage(k, 0.0);
  for (int s = 0; s < k; ++s) {
    if (!multi_stage) {
      c.activation_multiplier[s] = static_cast<double>(
          in_flight_microbatches(base.schedule, base.num_microbatches, base.mp, s));
      continue;
    }
    // the stage's micro-batches in flight on its rank's pass order
    one_stage.assign(k, 0.0);
    one_stage[s] = 1.0;
    c.activation_multiplier[s] = peak_activation_bytes(passes[base.device_of(s)], one_stage);
  }
  // The DP bounds each stage alone; a rank holds virtual_stages of them (a heuristic share:
  // evaluate() checks the rank's whole memory).
  c.memory_capacity_bytes = static_cast<double>(problem.cluster.device.memory_bytes) /
                            static_cast<double>(base.virtual_stages);
  return c;
}

std::optional<Partition> PipelinePartitionCache::optimal(const PartitionCosts& costs,
                                                         const Plan& base) {
  // The proxy is M * (per-micro-batch stage time) for compute and transfers alike, so without
  // memory limits the best split depends on the micro-batch size, not on M or the schedule.
  // It is optimal with limits too whenever it fits them (a constrained optimum is never
  // better than the unconstrained one); only then is the constrained DP needed.
  const auto key = std::make_tuple(base.num_stages(), base.schedule == Schedule::kZBV,
                                   static_cast<double>(base.per_replica_batch) /
                                       static_cast<double>(base.num_microbatches),
                                   base.mesh[0], base.tp);
  auto it = unconstrained_.find(key);
  if (it == unconstrained_.end()) {
    PartitionCosts unlimited = costs;
    unlimited.memory_capacity_bytes = 0;
    it = unconstrained_.emplace(key, optimal_partition(unlimited)).first;
  }
  if (it->second && partition_bottleneck_s(costs, it->second->stage_starts) < kInfinity) {
    return it->second;
  }
  return optimal_partition(costs);
}

PipelineOutcome search_pipeline(const Evaluator& evaluator, const Plan& base,
                                int exact_max_nodes, PipelinePartitionCache* cache) {
  const Problem& problem = evaluator.problem();
  const Graph& g = problem.graph;
  const auto n = static_cast<int64_t>(g.nodes.size());
  PipelineOutcome out;
  if (n < base.num_stages()) return out;
  Plan plan = base;
  const auto consider = [&](const std::vector<int64_t>& starts) {
    plan.assignment = stages_from_split(g, starts);
    Prediction pred = evaluator.evaluate(plan);
    ++out.evaluations;
    if (out.assignment.empty() || better_prediction(pred, out.predicted)) {
      out.predicted = std::move(pred);
      out.assignment = plan.assignment;
    }
  };
  std::ostringstream note;
  if (n <= exact_max_nodes) {
    for_each_contiguous_partition(n, static_cast<int>(base.num_stages()), [&](const std::vector<int64_t>& starts) {
      for (size_t s = 1; s + 1 < starts.size(); ++s)
        if (!g.nodes[g.topo_order[starts[s]]].cut_before) return;
      consider(starts);
    });
    out.exact = true;
    note << "exact (all " << out.evaluations << " contiguous splits evaluated)";
  } else {
    const PartitionCosts costs = pipeline_partition_costs(evaluator, base);
    if (auto part = cache ? cache->optimal(costs, base) : optimal_partition(costs)) {
      consider(part->stage_starts);
      note << "bottleneck DP over the topological order (optimal for the stage-time proxy)";
    } else {
      consider(least_memory_split(costs));
      note << "no split fits in memory; the least-memory split is reported";
    }
  }
  out.note = note.str();
  return out;
}

}  // namespace hybridplan
