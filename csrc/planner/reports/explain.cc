#include "planner/reports/explain.h"

#include <cctype>
#include <map>
#include <sstream>

#include "common/units.h"
#include "planner/costs/tensor_parallel_cost.h"

namespace hybridplan {
namespace {

// Splits "features.12" into ("features.", 12); names without a trailing number get -1.
std::pair<std::string, long long> split_number(const std::string& name) {
  size_t digits = name.size();
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(name[digits - 1]))) --digits;
  if (digits == name.size() || name.size() - digits > 15) return {name, -1};
  return {name.substr(0, digits), std::stoll(name.substr(digits))};
}

std::vector<std::string> names_of(const Plan& plan, const Graph* graph) {
  std::vector<std::string> names(plan.assignment.size());
  for (size_t v = 0; v < names.size(); ++v) {
    if (graph != nullptr && v < graph->nodes.size()) {
      names[v] = graph->nodes[v].name;
    } else if (v < plan.assignment_names.size() && !plan.assignment_names[v].empty()) {
      names[v] = plan.assignment_names[v];
    } else {
      names[v] = "node " + std::to_string(v);
    }
  }
  return names;
}

// Under tp > 1, which nodes with tensor_parallel run whole on every rank of their TP group, by
// the rule the cost model prices and the executor applies (tensor_parallel_cost.h
// tp_split_mask): those whose max_degree tp does not divide (a vocabulary of 100 rows under
// tp 8), by max_degree, and those left whole because a node tied to them is. Without this a
// plan reads as if tp split the whole model.
void explain_tp_split(std::ostream& out, const Graph& graph, int64_t tp) {
  const std::vector<uint8_t> splits = tp_split_mask(graph, tp);
  std::map<int64_t, std::vector<std::string>> undivided;  // max_degree -> nodes
  std::vector<std::string> tied;
  size_t with_tp = 0, split = 0;
  for (size_t v = 0; v < graph.nodes.size(); ++v) {
    const Node& node = graph.nodes[v];
    if (!node.tensor_parallel) continue;
    ++with_tp;
    if (splits[v]) {
      ++split;
    } else if (node.tensor_parallel->max_degree % tp != 0) {
      undivided[node.tensor_parallel->max_degree].push_back(node.name);
    } else {
      tied.push_back(node.name);
    }
  }
  out << "tensor parallel split at tp " << tp << ": " << split << " of " << with_tp
      << " nodes with tensor_parallel";
  if (with_tp < graph.nodes.size()) {
    out << " (" << graph.nodes.size() - with_tp << " nodes without it run whole)";
  }
  out << "\n";
  for (const auto& [max_degree, whole] : undivided) {
    out << "  run whole, tp " << tp << " does not divide their max_degree " << max_degree << ": "
        << compress_names(whole) << "\n";
  }
  if (!tied.empty()) {
    out << "  run whole, a node sharing their weight does not split: " << compress_names(tied)
        << "\n";
  }
}

std::string explain_with(const Plan& plan, const std::vector<std::string>& names,
                         const Problem* problem, const Graph* graph) {
  std::ostringstream out;
  const Prediction& p = plan.predicted;
  const bool pipeline = plan.mode == MpMode::kPipeline;
  out << "plan for graph \"" << plan.graph_name << "\" on cluster \"" << plan.cluster_name
      << "\"\n";
  out << "  " << plan.world_size << " devices = dp " << plan.dp << " x mp " << plan.mp;
  if (plan.tp > 1) out << " x tp " << plan.tp;
  if (plan.sequence_parallel) out << " sp";
  out << ", mode " << mode_name(plan.mode);
  if (pipeline) {
    out << " (" << schedule_name(plan.schedule) << ", " << plan.num_microbatches
        << " micro-batches of " << static_cast<double>(plan.per_replica_batch) / plan.num_microbatches;
    if (plan.virtual_stages > 1) out << ", " << plan.virtual_stages << " stages per rank";
    out << ")";
  }
  if (plan.sharding != Sharding::kNone) {
    const std::string over = plan.dp_replicate() > 1
                                 ? "over shard groups of " + std::to_string(plan.shard_degree()) +
                                       " replicas, the shards all-reduced across " +
                                       std::to_string(plan.dp_replicate()) + " groups (HSDP)"
                                 : "over dp";
    out << ", sharded " << sharding_name(plan.sharding)
        << (plan.sharding == Sharding::kZero2 ? " (gradients and optimizer state "
                                               : " (parameters, gradients and optimizer state ")
        << over << ")";
  }
  if (plan.tp > 1) {
    out << ", tensor parallel over groups of " << plan.tp
        << " consecutive devices (mesh entries are each group's first)";
    if (plan.sequence_parallel) {
      out << ", sequence parallel (the nodes between the TP regions run on 1/" << plan.tp
          << " of the tokens)";
    }
  }
  out << "\n  batch: " << plan.per_replica_batch << " per replica";
  if (plan.accumulation_steps > 1) {
    out << " per micro-step, " << plan.accumulation_steps
        << " micro-steps (gradients accumulated, synchronised once)";
  }
  out << ", " << plan.global_batch << " global\n";
  if (!plan.device_mapping_note.empty()) out << "  device mapping: " << plan.device_mapping_note << "\n";

  out << "mesh (replica: global devices)\n";
  for (size_t r = 0; r < plan.mesh.size(); ++r) {
    if (r == 8 && plan.mesh.size() > 9) {
      out << "  ... (" << plan.mesh.size() - 8 << " more replicas)\n";
      break;
    }
    out << "  replica " << r << ":";
    for (DeviceIndex d : plan.mesh[r]) out << " " << d;
    out << "\n";
  }

  out << (pipeline ? "stages\n" : "devices of each replica\n");
  const bool several = pipeline && plan.virtual_stages > 1;  // memory is per rank, below
  for (int64_t k = 0; k < plan.num_stages(); ++k) {
    std::vector<std::string> on_k;
    int64_t recomputed = 0, selectively = 0;
    for (size_t v = 0; v < plan.assignment.size(); ++v) {
      if (plan.assignment[v] == k) {
        on_k.push_back(names[v]);
        recomputed += plan.recomputes(v) ? 1 : 0;
        selectively += plan.recomputes_selectively(v) ? 1 : 0;
      }
    }
    out << "  " << (pipeline ? "stage " : "device ") << k << " (";
    if (several) out << "rank " << plan.device_of(static_cast<int32_t>(k)) << ", ";
    out << on_k.size() << " nodes";
    if (recomputed > 0) {
      out << ", " << recomputed << " recomputed";
      if (selectively > 0) out << " (" << selectively << " selectively)";
    }
    if (!several && k < static_cast<int64_t>(p.memory_bytes.size())) {
      out << ", " << format_bytes(static_cast<double>(p.memory_bytes[k]));
      if (problem != nullptr) {
        out << " of " << format_bytes(static_cast<double>(problem->cluster.device.memory_bytes));
      }
    }
    out << "): " << compress_names(on_k) << "\n";
  }
  for (size_t r = 0; several && r < p.memory_bytes.size(); ++r) {
    out << "  rank " << r << " memory " << format_bytes(static_cast<double>(p.memory_bytes[r]));
    if (problem != nullptr) {
      out << " of " << format_bytes(static_cast<double>(problem->cluster.device.memory_bytes));
    }
    out << "\n";
  }

  if (plan.tp > 1 && graph != nullptr) explain_tp_split(out, *graph, plan.tp);

  out << "predicted\n";
  out << "  step          " << format_seconds(p.step_s) << "\n";
  out << "    compute     " << format_seconds(p.compute_s);
  if (pipeline) out << " (bubble " << format_seconds(p.bubble_s) << ")";
  if (p.compute_slowdown != 1) out << " (x" << p.compute_slowdown << ": processes sharing a node)";
  out << "\n    all-reduce  " << format_seconds(p.allreduce_s) << " exposed after backward\n";
  if (plan.sharding != Sharding::kNone) {
    out << "    sharding    " << format_seconds(p.sharding_s)
        << " exposed all-gathers and reduce-scatters\n";
  }
  out << "    optimizer   " << format_seconds(p.optimizer_s) << "\n";
  out << "    overhead    " << format_seconds(p.overhead_s) << " per step (runtime)\n";
  out << "  transfers     " << format_seconds(p.transfer_s) << " in total (inside compute)\n";
  if (plan.tp > 1) {
    out << "  TP collectives " << format_seconds(p.tp_comm_s)
        << (pipeline ? " on the busiest stage over its micro-batches" : " per step")
        << (plan.sequence_parallel ? " (sequence parallelism's included)" : "")
        << " (inside compute, on the critical path)\n";
  }
  if (!p.compute_model.empty()) out << "  node times    " << p.compute_model << "\n";
  if (!p.memory_model.empty()) out << "  memory        " << p.memory_model << "\n";
  if (!p.allreduce_rings.empty()) {
    out << "  rings         ";
    for (size_t k = 0; k < p.allreduce_rings.size() && k < 4; ++k) {
      out << (k ? "; " : "") << (pipeline ? "stage " : "device ") << k << ":";
      const auto& ring = p.allreduce_rings[k];
      for (size_t i = 0; i < ring.size() && i < 16; ++i) out << " " << ring[i];
      if (ring.size() > 16) out << " ...";
    }
    if (p.allreduce_rings.size() > 4) out << "; ...";
    out << "\n";
  }
  out << "  throughput    " << format_count(p.samples_per_s) << " samples/s\n";
  if (p.epochs > 0) {
    out << "  epochs        " << p.epochs << " at global batch " << plan.global_batch << "\n";
    out << "  time to train " << format_seconds(p.time_to_train_s) << "\n";
  }
  out << "  feasible      " << (p.feasible ? "yes" : "no: " + p.infeasible_reason) << "\n";
  return out.str();
}

}  // namespace

std::string compress_names(const std::vector<std::string>& names, size_t max_groups) {
  // Runs of "<prefix><n>", "<prefix><n+1>", ... become "<prefix>[n-m]".
  std::string text;
  size_t groups = 0;
  size_t i = 0;
  while (i < names.size() && groups < max_groups) {
    const auto [prefix, first] = split_number(names[i]);
    size_t j = i + 1;
    long long last = first;
    while (first >= 0 && j < names.size()) {
      const auto [next_prefix, number] = split_number(names[j]);
      if (next_prefix != prefix || number != last + 1) break;
      last = number;
      ++j;
    }
    text += groups++ ? ", " : "";
    text += j - i >= 2 ? prefix + "[" + std::to_string(first) + "-" + std::to_string(last) + "]"
                       : names[i];
    i = j;
  }
  if (i < names.size()) text += ", ... (+" + std::to_string(names.size() - i) + " more)";
  return text;
}

std::string explain(const Plan& plan) {
  return explain_with(plan, names_of(plan, nullptr), nullptr, nullptr);
}

std::string explain(const Plan& plan, const Graph& graph) {
  return explain_with(plan, names_of(plan, &graph), nullptr, &graph);
}

std::string explain(const Problem& problem, const Plan& plan) {
  std::string text = explain_with(plan, names_of(plan, &problem.graph), &problem, &problem.graph);
  std::ostringstream links;
  const Cluster& c = problem.cluster;
  links << "cluster \"" << c.name << "\": " << c.num_nodes << " x " << c.devices_per_node << " "
        << c.device.name << ", intra-node "
        << (c.bandwidth_matrix.empty() ? format_bandwidth(c.intra_node.bandwidth_bytes_per_s)
                                       : std::string("per-pair matrix"));
  if (c.num_nodes > 1) links << ", inter-node " << format_bandwidth(c.inter_node.bandwidth_bytes_per_s);
  links << "\n";
  return text + links.str();
}

}  // namespace hybridplan
