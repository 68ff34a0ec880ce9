#include "planner/searches/pipeline_search.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <sstream>

#include "common/error.h"
#include "planner/costs/compute_cost.h"
#include "planner/costs/memory_cost.h"
#include "planner/costs/tensor_parallel_cost.h"

namespace hybridplan {
namespace {

// Plan::recompute from each stage's kind: the stage's nodes alike, then closed under the plan
// rules (the calls of one module recompute together: a module whose calls the kinds disagree
// on recomputes fully, and with it the whole stages of its calls, to a fixed point). Empty
// when no stage recomputes.
// The calls of each module with more than one (module_of_call), in module-name order.
std::vector<std::vector<size_t>> shared_module_calls(const Graph& graph) {
  std::map<std::string, std::vector<size_t>> calls;
  for (size_t v = 0; v < graph.nodes.size(); ++v) calls[module_of_call(graph.nodes[v].name)].push_back(v);
  std::vector<std::vector<size_t>> out;
  for (auto& [module, group] : calls) {
    if (group.size() >= 2) out.push_back(std::move(group));
  }
  return out;
}

std::vector<uint8_t> stage_recompute(const Graph& graph, const std::vector<std::vector<size_t>>& calls,
                                     const std::vector<int32_t>& assignment,
                                     const std::vector<StageRecompute>& kinds) {
  if (std::all_of(kinds.begin(), kinds.end(), [](StageRecompute r) { return r == kRecomputeNone; })) {
    return {};
  }
  std::vector<StageRecompute> stage = kinds;
  for (bool changed = true; changed;) {
    changed = false;
    for (const std::vector<size_t>& group : calls) {
      const StageRecompute first = stage[assignment[group.front()]];
      if (std::all_of(group.begin(), group.end(), [&](size_t v) { return stage[assignment[v]] == first; })) {
        continue;
      }
      for (size_t v : group) {
        if (stage[assignment[v]] != kRecomputeFull) stage[assignment[v]] = kRecomputeFull, changed = true;
      }
    }
  }
  std::vector<uint8_t> out(graph.nodes.size());
  for (size_t v = 0; v < graph.nodes.size(); ++v) out[v] = stage[assignment[v]];
  return out;
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
                                                base.sequence_parallel, blocks_run_eager(base));
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
  // recompute (evaluate.cc with_recompute and memory): a stage runs its forwards again (all,
  // or selective_recompute_fraction of each), keeps nothing per micro-batch in flight (full) or
  // its costly ops' outputs (selective), and rebuilds the rest once
  c.prefix_full_recompute_s.assign(n + 1, 0.0);
  c.prefix_selective_recompute_s.assign(n + 1, 0.0);
  c.prefix_selective_kept_bytes.assign(n + 1, 0.0);
  c.prefix_selective_rebuilt_bytes.assign(n + 1, 0.0);
  c.prefix_unselective.assign(n + 1, 0);
  c.workspace_bytes.assign(n, 0.0);
  const int32_t sink = g.topo_order.back();
  for (int64_t p = 0; p < n; ++p) {
    const NodeIndex v = g.topo_order[p];
    const Node& node = g.nodes[v];
    c.cut_before[p] = node.cut_before ? 1 : 0;
    c.prefix_compute_s[p + 1] =
        c.prefix_compute_s[p] + m * (micro.forward_s[v] + micro.backward_s[v]);
    c.prefix_static_bytes[p + 1] =
        c.prefix_static_bytes[p] + static_cast<double>(tp_param_bytes(node, degrees[v])) * state_copies;
    const double activations = shares[v] * kept_bytes(node, micro_scale);
    c.prefix_activation_bytes[p + 1] = c.prefix_activation_bytes[p] + activations;
    c.prefix_full_recompute_s[p + 1] = c.prefix_full_recompute_s[p] + m * micro.forward_s[v];
    const double saved =
        node.has_selective() ? shares[v] * scaled_bytes(node.selective_saved_bytes, micro_scale) : 0.0;
    c.prefix_selective_recompute_s[p + 1] =
        c.prefix_selective_recompute_s[p] +
        (node.has_selective()
             ? m * (node.selective_recompute_fraction * micro.forward_s[v] +
                    selective_dispatch_s(node, evaluator.problem().cluster.runtime))
             : 0.0);
    c.prefix_selective_kept_bytes[p + 1] = c.prefix_selective_kept_bytes[p] + saved;
    c.prefix_selective_rebuilt_bytes[p + 1] =
        c.prefix_selective_rebuilt_bytes[p] + std::max(0.0, activations - saved);
    c.prefix_unselective[p + 1] = c.prefix_unselective[p] + (node.has_selective() ? 0 : 1);
    c.workspace_bytes[p] = backward_workspace_bytes(g, static_cast<NodeIndex>(v), micro_scale);
  }
  // torch's receive buffers, one per micro-batch each way (memory_cost.h); the replica's input
  // batch on the first stage; the model's output per micro-batch in flight on the last
  c.receive_bytes.assign(n + 1, 0.0);
  for (int64_t p = 1; p < n; ++p) c.receive_bytes[p] = m * cut_bytes[p] * micro_scale;
  c.first_stage_bytes = scaled_bytes(g.profiled.input_bytes,
                                     batch_scale(g, static_cast<double>(base.per_replica_batch)));
  c.last_stage_bytes = scaled_bytes(g.nodes[sink].output_bytes, micro_scale);
  // a tied parameter's copies: every stage holding one of its nodes but the first's
  for (const TiedParams& tied : g.tied_params) {
    PartitionCosts::TiedCopy copy;
    for (NodeIndex v : tied.nodes) copy.positions.push_back(position[v]);
    copy.bytes = static_cast<double>(tp_tied_bytes(tied, degrees)) * state_copies;
    c.tied_copies.push_back(std::move(copy));
  }
  c.boundary_s.assign(k - 1, std::vector<double>(n + 1, 0.0));
  // a row per distinct link, copied to the cuts that ride it (a pipeline spanning nodes has
  // many stages and two or three kinds of link between them)
  std::map<std::pair<double, double>, int> row_of_link;  // (bandwidth, latency) -> a row
  for (int l = 0; l + 1 < k; ++l) {
    const int64_t from = base.device_of(l), to = base.device_of(l + 1);
    if (from == to) continue;  // zbv's turn: two stages of one rank
    const Link link = tp_stage_link(problem.cluster, base.mesh[0][from], base.mesh[0][to], base.tp);
    const auto [seen, fresh] = row_of_link.emplace(std::make_pair(link.bandwidth_bytes_per_s, link.latency_s), l);
    if (!fresh) {
      c.boundary_s[l] = c.boundary_s[seen->second];
      continue;
    }
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
                                                         const Plan& base, bool* unconstrained,
                                                         std::optional<Partition>* least_memory) {
  if (unconstrained) *unconstrained = false;
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
    // the splits found for the same stages at other micro-batch sizes bound the DP (often
    // nearly optimal here too: the split moves little with the micro-batch)
    std::vector<std::vector<int64_t>> hints;
    for (const auto& [other, split] : unconstrained_) {
      if (split && std::get<0>(other) == std::get<0>(key) && std::get<1>(other) == std::get<1>(key) &&
          std::get<4>(other) == std::get<4>(key) && std::get<3>(other) == std::get<3>(key)) {
        hints.push_back(split->stage_starts);
      }
    }
    it = unconstrained_.emplace(key, optimal_partition(unlimited, hints)).first;
  }
  // Optimal under the limits too when, with each stage's fastest kind that fits, its bottleneck
  // is the unconstrained one at these costs (M scales it: the cached split is another M's
  // perhaps), so that a stage recomputing off the bottleneck does not change it.
  if (it->second) {
    const std::vector<int64_t>& starts = it->second->stage_starts;
    Partition p = partition_of(costs, starts);
    double bottleneck = 0;
    for (int s = 0; s < costs.num_stages(); ++s) {
      bottleneck = std::max(bottleneck, costs.stage_s(s, starts[s], starts[s + 1]));
    }
    if (p.bottleneck_s <= bottleneck) {
      if (unconstrained) {
        *unconstrained = std::all_of(p.recompute.begin(), p.recompute.end(),
                                     [](StageRecompute r) { return r == kRecomputeNone; });
      }
      return p;
    }
  }
  // the split without limits and the least-memory one bound the constrained DP where they fit
  std::vector<std::vector<int64_t>> hints;
  if (it->second) hints.push_back(it->second->stage_starts);
  if (least_memory && costs.memory_capacity_bytes > 0) {
    *least_memory = least_memory_partition(costs);
    if (!*least_memory || (*least_memory)->fullest_bytes > costs.memory_capacity_bytes) {
      return std::nullopt;
    }
    hints.push_back((*least_memory)->stage_starts);
  }
  return optimal_partition(costs, hints);
}

const std::vector<std::vector<size_t>>& PipelinePartitionCache::shared_module_calls(const Graph& graph) {
  if (!module_calls_) module_calls_ = hybridplan::shared_module_calls(graph);
  return *module_calls_;
}

PipelineOutcome search_pipeline(const Evaluator& evaluator, const Plan& base,
                                int exact_max_nodes, PipelinePartitionCache* cache) {
  const Problem& problem = evaluator.problem();
  const Graph& g = problem.graph;
  const auto n = static_cast<int64_t>(g.nodes.size());
  PipelineOutcome out;
  if (n < base.num_stages()) return out;
  Plan plan = base;
  // the calls of one module (stage_recompute), found once per search where a cache is given
  const std::vector<std::vector<size_t>>* calls = nullptr;
  std::vector<std::vector<size_t>> own_calls;
  // evaluates a split with each stage's kind (empty: base's recompute); returns whether it fits
  // and, in `memory`, its memory per rank
  const auto consider = [&](const std::vector<int64_t>& starts, const std::vector<StageRecompute>& kinds,
                            std::vector<int64_t>* memory = nullptr) {
    plan.assignment = stages_from_split(g, starts);
    if (!kinds.empty() && !calls) {
      if (cache) {
        calls = &cache->shared_module_calls(g);
      } else {
        own_calls = shared_module_calls(g);
        calls = &own_calls;
      }
    }
    plan.recompute = kinds.empty() ? base.recompute : stage_recompute(g, *calls, plan.assignment, kinds);
    Prediction pred = evaluator.evaluate(plan);
    ++out.evaluations;
    const bool fits = pred.feasible;
    if (memory) *memory = pred.memory_bytes;
    if (out.assignment.empty() || better_prediction(pred, out.predicted)) {
      out.predicted = std::move(pred);
      out.assignment = plan.assignment;
      out.recompute = plan.recompute;
    }
    return fits;
  };
  std::ostringstream note;
  if (n <= exact_max_nodes) {
    for_each_contiguous_partition(n, static_cast<int>(base.num_stages()), [&](const std::vector<int64_t>& starts) {
      for (size_t s = 1; s + 1 < starts.size(); ++s)
        if (!g.nodes[g.topo_order[starts[s]]].cut_before) return;
      consider(starts, {});
    });
    out.exact = true;
    note << "exact (all " << out.evaluations << " contiguous splits evaluated)";
  } else {
    PartitionCosts costs = pipeline_partition_costs(evaluator, base);
    bool unconstrained = false;
    std::optional<Partition> least;  // the least-memory split, where found on the way
    const std::optional<Partition> part =
        cache ? cache->optimal(costs, base, &unconstrained, &least) : optimal_partition(costs);
    if (part) consider(part->stage_starts, part->recompute);
    // The check above is per stage; evaluate() holds a rank's stages together (several stages a
    // rank: the check gave each a share of the memory). Where the split recomputes, it is also
    // evaluated keeping everything, and if that does not fit, recomputing only on the ranks
    // then over memory.
    const std::vector<StageRecompute> keep_all(base.num_stages(), kRecomputeNone);
    if (part && part->recompute != keep_all) {
      std::vector<int64_t> memory;
      if (!consider(part->stage_starts, keep_all, &memory)) {
        std::vector<StageRecompute> kinds = part->recompute;
        const int64_t have = problem.cluster.device.memory_bytes;
        for (int32_t st = 0; st < static_cast<int32_t>(kinds.size()); ++st) {
          if (memory[base.device_of(st)] <= have) kinds[st] = kRecomputeNone;
        }
        if (kinds != part->recompute && kinds != keep_all) consider(part->stage_starts, kinds);
      }
    }
    // Where memory shaped that split, also the split for keeping every activation checked on
    // the parameter state and kept activations alone (the relaxation of the check above: a
    // rank of several stages holds its memory otherwise than the check's share of it, so
    // evaluate() may find a split fits that the check refused).
    bool kept = false;
    if (!unconstrained) {
      // the costs without the recompute times, buffers, workspaces, batch, output and tied
      // copies: the terms it keeps are lent to it (swapped: no copy of the cut costs, a row of
      // positions per stage) and given back after its DP
      PartitionCosts keeping;
      keeping.memory_capacity_bytes = costs.memory_capacity_bytes;
      const auto lend = [&]() {
        std::swap(keeping.prefix_compute_s, costs.prefix_compute_s);
        std::swap(keeping.boundary_s, costs.boundary_s);
        std::swap(keeping.prefix_static_bytes, costs.prefix_static_bytes);
        std::swap(keeping.prefix_activation_bytes, costs.prefix_activation_bytes);
        std::swap(keeping.activation_multiplier, costs.activation_multiplier);
        std::swap(keeping.cut_before, costs.cut_before);
        std::swap(keeping.prefix_selective_kept_bytes, costs.prefix_selective_kept_bytes);
        std::swap(keeping.prefix_selective_rebuilt_bytes, costs.prefix_selective_rebuilt_bytes);
        std::swap(keeping.prefix_unselective, costs.prefix_unselective);
      };
      lend();
      const std::optional<Partition> keep = cache ? cache->optimal(keeping, base) : optimal_partition(keeping);
      lend();
      if (keep && (!part || keep->stage_starts != part->stage_starts ||
                   keep->recompute != part->recompute)) {
        consider(keep->stage_starts, keep->recompute);
        kept = true;
      }
    }
    if (part) {
      note << "bottleneck DP over the topological order (optimal for the stage-time proxy; "
              "a stage recomputes where keeping its activations does not fit"
           << (kept ? "; the split for keeping them under a looser memory check evaluated too" : "")
           << ")";
    } else {
      if (!least) least = least_memory_partition(costs);
      HP_INTERNAL_ASSERT(least.has_value(), "a point's pipeline has a split (search_space)");
      consider(least->stage_starts, least->recompute);
      note << "no split fits in memory; the least-memory split is reported";
    }
  }
  out.note = note.str();
  return out;
}

}  // namespace hybridplan
