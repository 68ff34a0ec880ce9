#include "planner/searches/placement_search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>

#include "common/error.h"
#include "common/units.h"
#include "planner/costs/compute_cost.h"
#include "planner/costs/memory_cost.h"
#include "planner/costs/tensor_parallel_cost.h"
#include "planner/searches/pipeline_partition.h"
#include "planner/simulations/placement_simulation.h"

namespace hybridplan {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Relative slack on pruning so that rounding in the bound never cuts off a better leaf.
constexpr double kPruneSlack = 1e-9;

// Per-node numbers at the plan's per-replica batch, as evaluate() sees them (node times from the
// compute model, times the plan's shared-node slowdown), so the bounds hold for its compute_s.
struct NodeCosts {
  std::vector<double> forward_s, backward_s, activation_bytes, edge_bytes;
  std::vector<int64_t> param_bytes;
  double total_forward_s = 0, total_backward_s = 0;

  NodeCosts(const Evaluator& evaluator, const Plan& base) {
    const Graph& g = evaluator.problem().graph;
    const auto batch = static_cast<double>(base.per_replica_batch);
    const NodeTimes& times =
        evaluator.node_times(batch, evaluator.compute_slowdown(base), base.tp, base.sequence_parallel);
    forward_s = times.forward_s;
    backward_s = times.backward_s;
    const double scale = batch_scale(g, batch);
    const std::vector<int64_t>& degrees = evaluator.node_degrees(base.tp);
    const std::vector<double>& shares = evaluator.activation_shares(base.tp, base.sequence_parallel);
    for (size_t v = 0; v < g.nodes.size(); ++v) {
      activation_bytes.push_back(shares[v] * kept_bytes(g.nodes[v], scale));
      param_bytes.push_back(tp_param_bytes(g.nodes[v], degrees[v]));
      total_forward_s += forward_s[v];
      total_backward_s += backward_s[v];
    }
    for (const Edge& e : g.edges) edge_bytes.push_back(scaled_bytes(e.bytes, scale));
  }
};

// Longest paths with transfers on edges whose both ends are placed on different devices
// (assignment -1: not placed yet, no transfer assumed). Returns CP_f + CP_b separately.
std::pair<double, double> critical_paths_s(const Graph& g, const NodeCosts& c,
                                           const std::vector<int32_t>& assignment,
                                           const LocalLinks& links, std::vector<double>& dist) {
  const auto xfer = [&](int32_t from, int32_t to, int32_t edge) {
    if (from < 0 || to < 0) return 0.0;
    return links.transfer_s(from, to, c.edge_bytes[edge]);
  };
  dist.assign(g.nodes.size(), 0.0);
  // Longest path through one pass: `inputs_of[v]` are the edges feeding v in that pass and
  // `producer(e)` their far end (in_edges/src forward, out_edges/dst backward).
  const auto longest_path_s = [&](auto begin, auto end,
                                  const std::vector<std::vector<int32_t>>& inputs_of,
                                  auto producer, const std::vector<double>& node_s) {
    double longest_s = 0;
    for (auto it = begin; it != end; ++it) {
      const NodeIndex v = *it;
      double in_s = 0;
      for (int32_t k : inputs_of[v]) {
        const NodeIndex u = producer(g.edges[k]);
        in_s = std::max(in_s, dist[u] + xfer(assignment[u], assignment[v], k));
      }
      dist[v] = in_s + node_s[v];
      longest_s = std::max(longest_s, dist[v]);
    }
    return longest_s;
  };
  const double cp_f = longest_path_s(g.topo_order.begin(), g.topo_order.end(), g.in_edges,
                                     [](const Edge& e) { return e.src; }, c.forward_s);
  const double cp_b = longest_path_s(g.topo_order.rbegin(), g.topo_order.rend(), g.out_edges,
                                     [](const Edge& e) { return e.dst; }, c.backward_s);
  return {cp_f, cp_b};
}

Plan with_assignment(const Plan& base, std::vector<int32_t> assignment) {
  Plan p = base;
  p.assignment = std::move(assignment);
  return p;
}

// HEFT-style: in forward priority order, each node goes to the device where it would finish
// earliest (forward + backward time, inputs' transfers included) among devices it fits on.
std::vector<int32_t> earliest_finish_assignment(const Graph& g, const NodeCosts& c,
                                                const PlacementOrder& order,
                                                const LocalLinks& links, int64_t mp,
                                                int64_t capacity_bytes,
                                                const OptimizerState& optimizer) {
  const size_t n = g.nodes.size();
  std::vector<int32_t> a(n, 0);
  std::vector<double> finish(n, 0), free_s(mp, 0), act(mp, 0);
  std::vector<int64_t> params(mp, 0);
  for (NodeIndex v : order.forward) {
    int32_t best = -1, least_memory = 0;
    double best_finish = kInf;
    int64_t least_memory_bytes = std::numeric_limits<int64_t>::max();
    for (int32_t d = 0; d < mp; ++d) {
      const int64_t need = device_memory_bytes(params[d] + c.param_bytes[v],
                                               act[d] + c.activation_bytes[v], 1, optimizer);
      if (need < least_memory_bytes) {
        least_memory_bytes = need;
        least_memory = d;
      }
      if (need > capacity_bytes) continue;
      double start = free_s[d];
      for (int32_t k : g.in_edges[v]) {
        const Edge& e = g.edges[k];
        start = std::max(start, finish[e.src] + links.transfer_s(a[e.src], d, c.edge_bytes[k]));
      }
      const double f = start + c.forward_s[v] + c.backward_s[v];
      if (f < best_finish) {
        best_finish = f;
        best = d;
      }
    }
    if (best < 0) {  // fits nowhere: the emptiest device, so memory stays balanced
      best = least_memory;
      double start = free_s[best];
      for (NodeIndex u : g.preds[v]) start = std::max(start, finish[u]);
      best_finish = start + c.forward_s[v] + c.backward_s[v];
    }
    a[v] = best;
    finish[v] = best_finish;
    free_s[best] = best_finish;
    params[best] += c.param_bytes[v];
    act[best] += c.activation_bytes[v];
  }
  return a;
}

// A contiguous split of the topological order into min(mp, n) parts minimising the largest
// part of `weight` (compute, or memory when `weight_is_memory`), as a placement; none when no
// split has a finite cost (e.g. a node time scaled past the double range).
std::optional<std::vector<int32_t>> contiguous_assignment(const Graph& g, const NodeCosts& c, int64_t mp,
                                           bool weight_is_memory, int64_t capacity_bytes,
                                           const OptimizerState& optimizer) {
  const size_t n = g.nodes.size();
  const int k = static_cast<int>(std::min<int64_t>(mp, static_cast<int64_t>(n)));
  const double state_copies = parameter_state_bytes(1.0, optimizer, ShardedState{});
  PartitionCosts pc;
  pc.prefix_compute_s.assign(n + 1, 0);
  pc.prefix_static_bytes.assign(n + 1, 0);
  pc.prefix_activation_bytes.assign(n + 1, 0);
  pc.boundary_s.assign(k - 1, std::vector<double>(n + 1, 0));
  pc.activation_multiplier.assign(k, 1.0);
  for (size_t p = 0; p < n; ++p) {
    const NodeIndex v = g.topo_order[p];
    const double memory = c.param_bytes[v] * state_copies + c.activation_bytes[v];
    pc.prefix_compute_s[p + 1] =
        pc.prefix_compute_s[p] + (weight_is_memory ? memory : c.forward_s[v] + c.backward_s[v]);
    pc.prefix_static_bytes[p + 1] = pc.prefix_static_bytes[p] + c.param_bytes[v] * state_copies;
    pc.prefix_activation_bytes[p + 1] = pc.prefix_activation_bytes[p] + c.activation_bytes[v];
  }
  pc.memory_capacity_bytes = weight_is_memory ? 0 : static_cast<double>(capacity_bytes);
  auto part = optimal_partition(pc);
  if (!part) {  // nothing fits: balance memory instead
    pc.memory_capacity_bytes = 0;
    part = optimal_partition(pc);
  }
  if (!part) return std::nullopt;
  std::vector<int32_t> a(n, 0);
  for (int s = 0; s < k; ++s)
    for (int64_t p = part->stage_starts[s]; p < part->stage_starts[s + 1]; ++p)
      a[g.topo_order[p]] = s;
  return a;
}

std::string percent(double x) {
  std::ostringstream os;
  os.precision(3);
  os << 100 * x << "%";
  return os.str();
}

}  // namespace

double placement_lower_bound_s(const Evaluator& evaluator, const Plan& base) {
  const Graph& graph = evaluator.problem().graph;
  const int64_t mp = base.mp;
  const NodeCosts c(evaluator, base);
  LocalLinks none;
  std::vector<double> dist;
  const auto [cp_f, cp_b] =
      critical_paths_s(graph, c, std::vector<int32_t>(graph.nodes.size(), -1), none, dist);
  const double m = static_cast<double>(mp);
  return std::max(cp_f, c.total_forward_s / m) + std::max(cp_b, c.total_backward_s / m);
}

std::vector<int32_t> interchangeable_devices(const Cluster& cluster,
                                             const std::vector<std::vector<DeviceIndex>>& mesh) {
  const auto mp = static_cast<int32_t>(mesh.front().size());
  const auto same = [&](DeviceIndex a, DeviceIndex b, DeviceIndex c, DeviceIndex d) {
    const Link x = cluster.link(a, b), y = cluster.link(c, d);
    return x.bandwidth_bytes_per_s == y.bandwidth_bytes_per_s && x.latency_s == y.latency_s;
  };
  // Swapping i and j must leave every link inside each replica and every link between the
  // replicas' i-th (resp. j-th) devices -- their DP group -- unchanged.
  const auto swappable = [&](int32_t i, int32_t j) {
    for (const auto& row : mesh) {
      if (row[i] / cluster.devices_per_node != row[j] / cluster.devices_per_node) return false;
      if (!same(row[i], row[j], row[j], row[i])) return false;
      for (int32_t x = 0; x < mp; ++x) {
        if (x == i || x == j) continue;
        if (!same(row[i], row[x], row[j], row[x]) || !same(row[x], row[i], row[x], row[j]))
          return false;
      }
      for (const auto& other : mesh) {
        if (&other == &row) continue;
        if (!same(row[i], other[i], row[j], other[j])) return false;
      }
    }
    return true;
  };
  // Transpositions that are symmetries generate a symmetric group on each class, so the
  // relation is an equivalence: compare each device with its class representatives only.
  std::vector<int32_t> cls(mp);
  for (int32_t i = 0; i < mp; ++i) {
    cls[i] = i;
    for (int32_t j = 0; j < i; ++j) {
      if (cls[j] == j && swappable(i, j)) {
        cls[i] = j;
        break;
      }
    }
  }
  return cls;
}

PlacementOutcome heuristic_placement(const Evaluator& evaluator, const Plan& base,
                                     const PlacementSearchOptions& options) {
  const Problem& problem = evaluator.problem();
  const Graph& g = problem.graph;
  const int64_t mp = base.mp;
  const NodeCosts c(evaluator, base);
  LocalLinks links;
  fill_local_links(problem.cluster, base.mesh[0], links);
  const int64_t capacity = problem.cluster.device.memory_bytes;
  const OptimizerState& opt = evaluator.optimizer_state();

  PlacementOutcome out;
  out.lower_bound_compute_s = placement_lower_bound_s(evaluator, base);
  const auto consider = [&](std::vector<int32_t> a) {
    Plan p = with_assignment(base, std::move(a));
    Prediction pred = evaluator.evaluate(p);
    ++out.evaluations;
    if (out.assignment.empty() || better_prediction(pred, out.predicted)) {
      out.assignment = std::move(p.assignment);
      out.predicted = std::move(pred);
    }
  };
  consider(std::vector<int32_t>(g.nodes.size(), 0));
  if (mp > 1) {
    const PlacementOrder& order = evaluator.placement_order(
        static_cast<double>(base.per_replica_batch), evaluator.compute_slowdown(base), base.tp,
        base.sequence_parallel);
    consider(earliest_finish_assignment(g, c, order, links, mp, capacity, opt));
    for (const bool by_memory : {false, true}) {
      if (auto a = contiguous_assignment(g, c, mp, by_memory, capacity, opt)) consider(std::move(*a));
    }
  }

  // First-improvement local search: move one node to a device one of its neighbours uses, or
  // to the least loaded device (which opens parallelism when every neighbour shares a device).
  std::vector<double> load_s(mp, 0.0);
  for (size_t v = 0; v < g.nodes.size(); ++v)
    load_s[out.assignment[v]] += c.forward_s[v] + c.backward_s[v];
  // evaluate() reads every node and edge, and every mesh entry for the all-reduce groups.
  const int64_t visits_per_eval =
      static_cast<int64_t>(g.nodes.size() + g.edges.size()) + base.dp * base.mp + 1;
  const int64_t budget = out.evaluations +
                         std::max<int64_t>(16, options.local_search_node_visits / visits_per_eval);
  Plan trial = with_assignment(base, out.assignment);
  std::vector<char> tried(mp);
  bool improved = mp > 1;
  while (improved && out.evaluations < budget) {
    improved = false;
    for (NodeIndex v : g.topo_order) {
      if (out.evaluations >= budget) break;
      const int32_t here = trial.assignment[v];
      std::fill(tried.begin(), tried.end(), 0);
      tried[here] = 1;
      const auto try_device = [&](int32_t d) {
        if (tried[d] || out.evaluations >= budget) return;
        tried[d] = 1;
        trial.assignment[v] = d;
        Prediction pred = evaluator.evaluate(trial);
        ++out.evaluations;
        if (better_prediction(pred, out.predicted)) {
          const double node_s = c.forward_s[v] + c.backward_s[v];
          load_s[out.assignment[v]] -= node_s;
          load_s[d] += node_s;
          out.predicted = std::move(pred);
          out.assignment = trial.assignment;
          improved = true;
        } else {
          trial.assignment[v] = out.assignment[v];
        }
      };
      for (NodeIndex u : g.preds[v]) try_device(out.assignment[u]);
      for (NodeIndex w : g.succs[v]) try_device(out.assignment[w]);
      try_device(static_cast<int32_t>(std::min_element(load_s.begin(), load_s.end()) -
                                      load_s.begin()));
    }
  }

  out.gap = out.lower_bound_compute_s > 0
                ? std::max(0.0, out.predicted.compute_s / out.lower_bound_compute_s - 1.0)
                : 0.0;
  std::ostringstream note;
  note << "heuristic (earliest-finish seeds + local search, " << out.evaluations
       << " evaluations): compute " << format_seconds(out.predicted.compute_s)
       << ", lower bound " << format_seconds(out.lower_bound_compute_s)
       << " (max(critical path, work/mp) per pass), gap " << percent(out.gap);
  out.note = note.str();
  return out;
}

namespace {

// Depth-first branch and bound over nodes in topological order (see the header).
class BranchAndBound {
 public:
  BranchAndBound(const Evaluator& evaluator, const Plan& base, PlacementOutcome& best)
      : ev_(evaluator),
        g_(evaluator.problem().graph),
        c_(evaluator, base),
        mp_(static_cast<int32_t>(base.mp)),
        capacity_(evaluator.problem().cluster.device.memory_bytes),
        optimizer_(evaluator.optimizer_state()),
        plan_(with_assignment(base, std::vector<int32_t>(g_.nodes.size(), -1))),
        best_(best),
        cls_(interchangeable_devices(evaluator.problem().cluster, base.mesh)),
        load_f_(mp_, 0),
        load_b_(mp_, 0),
        act_(mp_, 0),
        params_(mp_, 0),
        used_(mp_, 0) {
    fill_local_links(evaluator.problem().cluster, base.mesh[0], links_);
  }

  void run() { branch(0); }

 private:
  double bound_s() {
    const auto [cp_f, cp_b] = critical_paths_s(g_, c_, plan_.assignment, links_, dist_);
    double lf = c_.total_forward_s / mp_, lb = c_.total_backward_s / mp_;
    for (int32_t d = 0; d < mp_; ++d) {
      lf = std::max(lf, load_f_[d]);
      lb = std::max(lb, load_b_[d]);
    }
    return std::max(lf, cp_f) + std::max(lb, cp_b);
  }

  bool pruned(double bound) const {
    return best_.predicted.feasible && bound * (1 - kPruneSlack) >= best_.predicted.step_s;
  }

  void branch(size_t position) {
    if (position == g_.topo_order.size()) {
      Prediction pred = ev_.evaluate(plan_);
      ++best_.evaluations;
      if (better_prediction(pred, best_.predicted)) {
        best_.predicted = std::move(pred);
        best_.assignment = plan_.assignment;
      }
      return;
    }
    const NodeIndex v = g_.topo_order[position];
    // Candidate devices: every used device, and the lowest unused one of each class.
    std::vector<std::pair<double, int32_t>> order;
    std::vector<char> class_opened(mp_, 0);
    for (int32_t d = 0; d < mp_; ++d) {
      if (!used_[d]) {
        if (class_opened[cls_[d]]) continue;
        class_opened[cls_[d]] = 1;
      }
      const int64_t need = device_memory_bytes(params_[d] + c_.param_bytes[v],
                                               act_[d] + c_.activation_bytes[v], 1, optimizer_);
      if (need > capacity_) continue;  // memory only grows along the branch
      place(v, d, +1);
      const double bound = bound_s();
      place(v, d, -1);
      if (!pruned(bound)) order.emplace_back(bound, d);
    }
    // Most promising first, so good incumbents come early.
    std::stable_sort(order.begin(), order.end());
    for (const auto& [bound, d] : order) {
      if (pruned(bound)) break;
      place(v, d, +1);
      branch(position + 1);
      place(v, d, -1);
    }
  }

  void place(NodeIndex v, int32_t d, int sign) {
    plan_.assignment[v] = sign > 0 ? d : -1;
    load_f_[d] += sign * c_.forward_s[v];
    load_b_[d] += sign * c_.backward_s[v];
    act_[d] += sign * c_.activation_bytes[v];
    params_[d] += sign * c_.param_bytes[v];
    used_[d] += sign;
  }

  const Evaluator& ev_;
  const Graph& g_;
  const NodeCosts c_;
  const int32_t mp_;
  const int64_t capacity_;
  const OptimizerState optimizer_;
  Plan plan_;
  PlacementOutcome& best_;
  const std::vector<int32_t> cls_;
  LocalLinks links_;
  std::vector<double> load_f_, load_b_, act_;
  std::vector<int64_t> params_;
  std::vector<int32_t> used_;
  std::vector<double> dist_;
};

}  // namespace

PlacementOutcome search_placement(const Evaluator& evaluator, const Plan& base,
                                  const PlacementSearchOptions& options) {
  HP_INTERNAL_ASSERT(base.mp >= 1 && !base.mesh.empty(), "mp=" << base.mp);
  PlacementOutcome out = heuristic_placement(evaluator, base, options);
  const auto n = static_cast<int64_t>(evaluator.problem().graph.nodes.size());
  if (base.mp == 1 || n > options.exact_max_nodes) return out;

  const int64_t heuristic_evaluations = out.evaluations;
  BranchAndBound(evaluator, base, out).run();
  out.exact = true;
  out.gap = out.lower_bound_compute_s > 0
                ? std::max(0.0, out.predicted.compute_s / out.lower_bound_compute_s - 1.0)
                : 0.0;
  std::ostringstream note;
  note << "exact (branch and bound over " << n << " nodes, " << out.evaluations - heuristic_evaluations
       << " leaves evaluated after a heuristic incumbent)";
  out.note = note.str();
  return out;
}

}  // namespace hybridplan
