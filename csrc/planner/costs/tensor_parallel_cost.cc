#include "planner/costs/tensor_parallel_cost.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/error.h"

namespace hybridplan {

namespace {

// ratio(t) of the header from measured split times (tensor_parallel's or sequence_parallel's).
double split_time_ratio(const Node& node, const std::vector<TpSplitTime>& points, int64_t tp,
                        bool backward) {
  const auto t = static_cast<double>(tp);
  const double whole_s = backward ? node.backward_s : node.forward_s;
  if (points.empty() || whole_s <= 0) return 1.0 / t;
  const auto ratio_at = [&](const TpSplitTime& p) {
    return (backward ? p.backward_s : p.forward_s) / whole_s;
  };
  // (log2 degree, ratio), starting at degree 1 with ratio 1.
  double x0 = 0, r0 = 1;
  const double x = std::log2(t);
  for (const TpSplitTime& p : points) {
    const double x1 = std::log2(static_cast<double>(p.degree));
    const double r1 = ratio_at(p);
    if (p.degree == tp) return r1;
    if (x < x1) return r0 + (r1 - r0) * (x - x0) / (x1 - x0);
    x0 = x1;
    r0 = r1;
  }
  const TpSplitTime& last = points.back();
  return ratio_at(last) * static_cast<double>(last.degree) / t;
}

bool per_token(const Node& node) {
  return node.sequence_parallel && node.sequence_parallel->role == SpRole::kPerToken;
}

}  // namespace

double tp_time_ratio(const Node& node, int64_t tp, bool backward) {
  if (tp <= 1 || !node.tensor_parallel) return 1.0;
  return split_time_ratio(node, node.tensor_parallel->split_times, tp, backward);
}

double sp_time_ratio(const Node& node, int64_t tp, bool backward) {
  if (tp <= 1 || !per_token(node)) return 1.0;
  return split_time_ratio(node, node.sequence_parallel->split_times, tp, backward);
}

int64_t tp_param_bytes(const Node& node, int64_t tp) {
  if (tp <= 1 || !node.tensor_parallel) return node.param_bytes;
  const int64_t split = node.tensor_parallel->split_param_bytes;
  return node.param_bytes - split + (split + tp - 1) / tp;
}

double tp_activation_share(const Node& node, int64_t tp) {
  if (tp <= 1 || !node.tensor_parallel || !node.tensor_parallel->activation_split) return 1.0;
  return 1.0 / static_cast<double>(tp);
}

std::vector<uint8_t> tp_split_mask(const std::vector<int64_t>& max_degrees,
                                   const std::vector<std::vector<NodeIndex>>& tied_groups,
                                   int64_t tp) {
  std::vector<uint8_t> splits(max_degrees.size(), 0);
  for (const std::vector<NodeIndex>& group : tied_groups) {
    for (NodeIndex v : group) {
      HP_INTERNAL_ASSERT(v >= 0 && static_cast<size_t>(v) < splits.size(), "tied node " << v);
    }
  }
  if (tp <= 1) return splits;
  for (size_t v = 0; v < max_degrees.size(); ++v) {
    splits[v] = max_degrees[v] >= 1 && max_degrees[v] % tp == 0 ? 1 : 0;
  }
  // a tied group splits only if all its nodes do; a node left whole there may hold another
  // tie, so to a fixed point
  for (bool changed = true; changed;) {
    changed = false;
    for (const std::vector<NodeIndex>& group : tied_groups) {
      const bool all = std::all_of(group.begin(), group.end(), [&](NodeIndex v) { return splits[v]; });
      if (all) continue;
      for (NodeIndex v : group) {
        if (splits[v]) {
          splits[v] = 0;
          changed = true;
        }
      }
    }
  }
  return splits;
}

std::vector<uint8_t> tp_split_mask(const Graph& graph, int64_t tp) {
  std::vector<int64_t> max_degrees(graph.nodes.size(), 0);
  for (size_t v = 0; v < graph.nodes.size(); ++v) {
    if (graph.nodes[v].tensor_parallel) max_degrees[v] = graph.nodes[v].tensor_parallel->max_degree;
  }
  std::vector<std::vector<NodeIndex>> tied;
  for (const TiedParams& t : graph.tied_params) tied.push_back(t.nodes);
  return tp_split_mask(max_degrees, tied, tp);
}

std::vector<int64_t> tp_node_degrees(const Graph& graph, int64_t tp) {
  const std::vector<uint8_t> splits = tp_split_mask(graph, tp);
  std::vector<int64_t> out(splits.size(), 1);
  for (size_t v = 0; v < splits.size(); ++v) {
    if (splits[v]) out[v] = tp;
  }
  return out;
}

int64_t tp_tied_bytes(const TiedParams& tied, const std::vector<int64_t>& node_degrees) {
  if (tied.nodes.empty()) return tied.bytes;
  const int64_t t = node_degrees[tied.nodes.front()];  // the group's nodes split alike
  return t > 1 ? (tied.bytes + t - 1) / t : tied.bytes;
}

std::vector<int64_t> tp_degrees(const Graph& graph, const Cluster& cluster) {
  std::vector<int64_t> out;
  if (!graph.has_tensor_parallel()) return out;
  for (int64_t t = 2; t <= cluster.devices_per_node; ++t) {
    if (cluster.devices_per_node % t != 0) continue;
    const std::vector<uint8_t> splits = tp_split_mask(graph, t);
    if (std::find(splits.begin(), splits.end(), 1) != splits.end()) out.push_back(t);
  }
  return out;
}

const AllReduceCost& TpCollectives::of(Collective op) const {
  switch (op) {
    case Collective::kAllReduce: return all_reduce;
    case Collective::kAllGather: return all_gather;
    case Collective::kReduceScatter: return reduce_scatter;
  }
  return all_reduce;
}

TpCollectives tp_collectives(const Cluster& cluster, int64_t tp) {
  TpCollectives out;
  if (tp <= 1) return out;
  HP_INTERNAL_ASSERT(cluster.devices_per_node % tp == 0,
                     "tp=" << tp << " does not divide devices_per_node=" << cluster.devices_per_node);
  if (cluster.intra_node_tp_allreduce) {  // calibrated as the executor runs them (cluster.h)
    const Link& link = *cluster.intra_node_tp_allreduce;
    out.all_reduce = ring_allreduce(tp, link.bandwidth_bytes_per_s, link.latency_s);
    out.all_gather = ring_shard_collective(tp, link.bandwidth_bytes_per_s, link.latency_s);
    out.reduce_scatter = out.all_gather;
    return out;
  }
  // The slowest aligned group of node 0 (every node is alike), term by term.
  const auto slower = [](AllReduceCost& into, const AllReduceCost& c) {
    into.fixed_s = std::max(into.fixed_s, c.fixed_s);
    into.per_byte_s = std::max(into.per_byte_s, c.per_byte_s);
  };
  std::vector<DeviceIndex> group(tp);
  for (int64_t first = 0; first < cluster.devices_per_node; first += tp) {
    std::iota(group.begin(), group.end(), first);
    slower(out.all_reduce, group_allreduce(cluster, group, 1));
    slower(out.all_gather, group_shard_collective(cluster, group, Collective::kAllGather, 1));
    slower(out.reduce_scatter, group_shard_collective(cluster, group, Collective::kReduceScatter, 1));
  }
  return out;
}

Link tp_stage_link(const Cluster& cluster, DeviceIndex from, DeviceIndex to, int64_t tp) {
  Link link = cluster.link(from, to);
  if (tp > 1 && from / cluster.devices_per_node != to / cluster.devices_per_node) {
    link.bandwidth_bytes_per_s /= static_cast<double>(tp);
  }
  return link;
}

void apply_tensor_parallel(const Graph& graph, const TpCollectives& collectives, int64_t tp,
                           double batch_scale, NodeTimes& times, bool sequence_parallel) {
  if (tp <= 1) return;
  const size_t n = graph.nodes.size();
  times.forward_comm_s.assign(n, 0.0);
  times.backward_comm_s.assign(n, 0.0);
  const auto one_s = [&](const TpCollective& c) {
    const double bytes = c.fixed_bytes ? static_cast<double>(c.bytes) : scaled_bytes(c.bytes, batch_scale);
    return collectives.of(c.op).time_s(bytes);
  };
  const auto comm_s = [&](const std::optional<TpCollective>& c) { return c ? one_s(*c) : 0.0; };
  const auto list_s = [&](const std::vector<TpCollective>& list) {
    double sum = 0;
    for (const TpCollective& c : list) sum += one_s(c);
    return sum;
  };
  const std::vector<uint8_t> splits = tp_split_mask(graph, tp);
  for (size_t v = 0; v < n; ++v) {
    const Node& node = graph.nodes[v];
    const SequenceParallel* sp = sequence_parallel && node.sequence_parallel ? &*node.sequence_parallel : nullptr;
    double forward_ratio = 1, backward_ratio = 1;
    if (splits[v]) {
      forward_ratio = tp_time_ratio(node, tp, false);
      backward_ratio = tp_time_ratio(node, tp, true);
      if (sp == nullptr) {
        times.forward_comm_s[v] = comm_s(node.tensor_parallel->forward_collective);
        times.backward_comm_s[v] = comm_s(node.tensor_parallel->backward_collective);
      }
    } else if (sp == nullptr) {
      continue;  // runs whole: its own time, no collective
    } else {  // per_token or gather (Plan::validate_fit: every colwise / rowwise one splits)
      forward_ratio = sp_time_ratio(node, tp, false);
      backward_ratio = sp_time_ratio(node, tp, true);
    }
    if (sp != nullptr) {  // its sequence-parallel collectives, in place of any TP one
      times.forward_comm_s[v] = list_s(sp->forward_collectives);
      times.backward_comm_s[v] = list_s(sp->backward_collectives);
    }
    times.forward_s[v] = times.forward_s[v] * forward_ratio + times.forward_comm_s[v];
    times.backward_s[v] = times.backward_s[v] * backward_ratio + times.backward_comm_s[v];
  }
}

std::optional<std::string> sequence_parallel_refusal(const Graph& graph, int64_t tp) {
  const auto quoted = [](const std::string& s) { return "\"" + s + "\""; };
  if (tp <= 1) {
    return std::optional<std::string>(
        "must be false with tp = 1 (sequence parallelism splits the tokens over a TP group)");
  }
  if (!graph.has_sequence_parallel()) {
    return "must be false: graph " + quoted(graph.name) +
           " has no node with sequence_parallel (profile it again with sequence parallelism "
           "detection)";
  }
  const std::vector<uint8_t> splits = tp_split_mask(graph, tp);
  for (size_t v = 0; v < graph.nodes.size(); ++v) {
    const Node& node = graph.nodes[v];
    if (!node.sequence_parallel) continue;
    const SequenceParallel& sp = *node.sequence_parallel;
    if (sp.max_degree % tp != 0) {
      return "must be false with tp = " + std::to_string(tp) + ": it does not divide node " +
             quoted(node.name) + "'s sequence_parallel.max_degree " + std::to_string(sp.max_degree) +
             " (every node with sequence_parallel splits its tokens over the TP group)";
    }
    if ((sp.role == SpRole::kColwise || sp.role == SpRole::kRowwise) && !splits[v]) {
      return "must be false with tp = " + std::to_string(tp) + ": node " + quoted(node.name) +
             " (sequence_parallel role " + quoted(sp_role_name(sp.role)) +
             ") runs whole at this tp (tensor_parallel.max_degree " +
             std::to_string(node.tensor_parallel->max_degree) +
             "; a tied group splits only where all its nodes do), so it cannot enter or leave "
             "the sequence-parallel region";
    }
  }
  return std::nullopt;
}

std::vector<double> tp_activation_shares(const Graph& graph, int64_t tp, bool sequence_parallel) {
  const std::vector<int64_t> degrees = tp_node_degrees(graph, tp);
  std::vector<double> out(graph.nodes.size(), 1.0);
  for (size_t v = 0; v < graph.nodes.size(); ++v) {
    out[v] = tp_activation_share(graph.nodes[v], degrees[v]);
    if (sequence_parallel && tp > 1 && per_token(graph.nodes[v])) out[v] = 1.0 / static_cast<double>(tp);
    const std::optional<SequenceParallel>& sp = graph.nodes[v].sequence_parallel;
    if (sequence_parallel && tp > 1 && sp && sp->role == SpRole::kGather && sp->saved_share) {
      out[v] = *sp->saved_share;  // its inputs gathered apart and kept apart
    }
  }
  return out;
}

}  // namespace hybridplan
