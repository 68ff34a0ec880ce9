#include "planner/costs/evaluate.h"

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "planner/costs/compute_cost.h"
#include "planner/costs/memory_cost.h"
#include "planner/costs/optimizer_cost.h"
#include "planner/costs/precision_cost.h"
#include "planner/costs/tensor_parallel_cost.h"
#include "planner/run/convergence.h"

namespace hybridplan {
namespace {

// The backward of node v that its weight gradient is a part of (split_backward): without the
// TP collective, which is the input gradient's.
double plain_weight_base_s(const NodeTimes& times, size_t v) {
  return times.backward_comm_s.empty() ? times.backward_s[v]
                                       : times.backward_s[v] - times.backward_comm_s[v];
}

}  // namespace

Evaluator::Evaluator(const Problem& problem)
    : converted_(converts_graph(problem) ? std::make_shared<const Problem>(in_job_precision(problem))
                                         : nullptr),
      problem_(converted_ ? *converted_ : problem),
      fsdp_(converted_ && records_autocast(problem)
                ? std::make_shared<const Problem>(
                      in_job_precision(problem, "cluster", PrecisionPolicy::kFsdp))
                : nullptr),
      compute_(problem_.graph, problem_.cluster),
      optimizer_state_(hybridplan::optimizer_state(problem_.job, problem_.graph)),
      reduce_ratio_(gradient_reduce_ratio(problem)),
      reverse_topo_(problem_.graph.topo_order.rbegin(), problem_.graph.topo_order.rend()),
      memory_models_{memory_model(problem, PrecisionPolicy::kAutocast),
                     memory_model(problem, PrecisionPolicy::kFsdp)} {}

const Graph& Evaluator::memory_graph(const Plan& plan) const {
  return fsdp_ && precision_policy(plan) == PrecisionPolicy::kFsdp ? fsdp_->graph : problem_.graph;
}

bool blocks_run_eager(const Plan& plan) {
  return plan.mode == MpMode::kPipeline && schedule_splits_backward(plan.schedule);
}

bool node_runs_eager(const Node& node, int64_t degree) {
  return degree > 1 && node.tensor_parallel && node.tensor_parallel->style == TpStyle::kVocabRowwise;
}

Evaluator::BatchCosts& Evaluator::batch_costs(double batch, double slowdown, int64_t tp,
                                              bool sequence_parallel, bool eager) const {
  sequence_parallel = sequence_parallel && tp > 1;
  eager = eager || !problem_.job.compile;
  auto& slot = batch_costs_[{batch, slowdown, tp, sequence_parallel, eager}];
  if (!slot) {
    slot = std::make_unique<BatchCosts>();
    slot->times = compute_.at_batch(batch);
    if (!eager) {  // compiled blocks: eager time / measured speed-up
      const std::vector<Node>& nodes = problem_.graph.nodes;
      const std::vector<int64_t>& degrees = node_degrees(tp);
      for (size_t v = 0; v < nodes.size(); ++v) {
        if (!nodes[v].has_compile_speedup() || node_runs_eager(nodes[v], degrees[v])) continue;
        slot->times.forward_s[v] /= nodes[v].compile_forward_speedup;
        slot->times.backward_s[v] /= nodes[v].compile_backward_speedup;
      }
    }
    for (double& t : slot->times.forward_s) t *= slowdown;
    for (double& t : slot->times.backward_s) t *= slowdown;
    if (tp > 1) {  // split compute, then the collectives (not slowed: not compute)
      apply_tensor_parallel(problem_.graph, tp_collectives(problem_.cluster, tp), tp,
                            batch_scale(problem_.graph, batch), slot->times, sequence_parallel);
    }
  }
  return *slot;
}

const std::vector<int64_t>& Evaluator::node_degrees(int64_t tp) const {
  auto it = node_degrees_.find(tp);
  if (it == node_degrees_.end()) it = node_degrees_.emplace(tp, tp_node_degrees(problem_.graph, tp)).first;
  return it->second;
}

const std::vector<double>& Evaluator::activation_shares(int64_t tp, bool sequence_parallel) const {
  const std::pair<int64_t, bool> key{tp, sequence_parallel && tp > 1};
  auto it = activation_shares_.find(key);
  if (it == activation_shares_.end()) {
    it = activation_shares_.emplace(key, tp_activation_shares(problem_.graph, tp, key.second)).first;
  }
  return it->second;
}

const NodeTimes& Evaluator::node_times(double batch, double slowdown, int64_t tp,
                                       bool sequence_parallel, bool eager) const {
  return batch_costs(batch, slowdown, tp, sequence_parallel, eager).times;
}

const PlacementOrder& Evaluator::placement_order(double batch, double slowdown, int64_t tp,
                                                 bool sequence_parallel) const {
  BatchCosts& costs = batch_costs(batch, slowdown, tp, sequence_parallel);
  if (!costs.order) costs.order = placement_priority_order(problem_.graph, costs.times);
  return *costs.order;
}

const NodeTimes& Evaluator::with_recompute(const Plan& plan, const NodeTimes& times) const {
  if (plan.recompute.empty()) return times;
  recompute_times_ = times;
  const bool tp_comm = !recompute_times_.forward_comm_s.empty();
  // A block recomputed selectively runs eager under compile (its policy is a dispatch mode that
  // compiled code does not go through: python/hybridplan/executor/compiling.py
  // compiled_names): its compute back at eager time, the TP collectives as they are.
  const bool undo_compile = problem_.job.compile && !blocks_run_eager(plan);
  for (size_t v = 0; v < recompute_times_.backward_s.size(); ++v) {
    const Node& node = problem_.graph.nodes[v];
    if (undo_compile && plan.recomputes_selectively(v) && node.has_compile_speedup() &&
        !node_runs_eager(node, node_degrees(plan.tp)[v])) {  // not eager already
      const double forward_comm = tp_comm ? recompute_times_.forward_comm_s[v] : 0.0;
      const double backward_comm = tp_comm ? recompute_times_.backward_comm_s[v] : 0.0;
      recompute_times_.forward_s[v] =
          (recompute_times_.forward_s[v] - forward_comm) * node.compile_forward_speedup +
          forward_comm;
      recompute_times_.backward_s[v] =
          (recompute_times_.backward_s[v] - backward_comm) * node.compile_backward_speedup +
          backward_comm;
    }
    // its cheap ops only (Node::selective_*), else its whole forward (a TP collective included)
    const double share = plan.recomputes_selectively(v)
                             ? problem_.graph.nodes[v].selective_recompute_fraction
                             : plan.recomputes(v) ? 1.0 : 0.0;
    if (share == 0) continue;
    recompute_times_.backward_s[v] += share * recompute_times_.forward_s[v];
    if (plan.recomputes_selectively(v)) {
      recompute_times_.backward_s[v] +=
          selective_dispatch_s(problem_.graph.nodes[v], problem_.cluster.runtime);
    }
    if (tp_comm) recompute_times_.backward_comm_s[v] += share * recompute_times_.forward_comm_s[v];
  }
  return recompute_times_;
}

double Evaluator::compute_slowdown(const Plan& plan) const {
  const Cluster& cluster = problem_.cluster;
  if (cluster.runtime.shared_host_slowdown.empty()) return 1.0;
  // Placement runs one process per replica (on its first device's node), pipeline one per device;
  // each is tp processes, one per TP rank, on the node of its TP group.
  processes_on_node_.assign(cluster.num_nodes, 0);
  int64_t busiest = 0;
  for (const auto& row : plan.mesh) {
    const size_t count = plan.mode == MpMode::kPipeline ? row.size() : 1;
    for (size_t k = 0; k < count; ++k) {
      const int64_t node = row[k] / cluster.devices_per_node;
      processes_on_node_[node] += plan.tp;
      if (processes_on_node_[node] > busiest) {
        busiest = processes_on_node_[node];
        busiest_node_ = node;
      }
    }
  }
  return cluster.runtime.slowdown(busiest);
}

// A malformed plan is an InputError (the one plan validation, less the identity checks that
// need the graph's hash), never out-of-range access.
void Evaluator::check_shape(const Plan& plan) const {
  plan.validate_structure("plan");
  plan.validate_fit("plan", problem_.graph, problem_.cluster);
}

double Evaluator::placement_compute(const Plan& plan, double slowdown, Prediction& out) const {
  const Graph& graph = problem_.graph;
  const auto batch = static_cast<double>(plan.per_replica_batch);
  const std::vector<int32_t>* assignment = &plan.assignment;
  if (serial_replica_devices()) {  // one process runs every node in turn: one device, no transfers
    serial_assignment_.assign(graph.nodes.size(), 0);
    assignment = &serial_assignment_;
  }
  fill_local_links(problem_.cluster, plan.mesh[0], links_);
  const NodeTimes& times_at_batch =
      with_recompute(plan, node_times(batch, slowdown, plan.tp, plan.sequence_parallel));
  const PlacementTimes times =
      simulate_placement(graph, placement_order(batch, slowdown, plan.tp, plan.sequence_parallel),
                         *assignment, links_, times_at_batch, batch_scale(graph, batch), placement_);
  gradient_ready_s_.resize(graph.nodes.size());
  for (size_t v = 0; v < graph.nodes.size(); ++v) {
    gradient_ready_s_[v] = times.forward_s + placement_.backward_finish_s[v];
  }
  out.transfer_s = times.transfer_s;
  out.bubble_s = 0;
  // tp > 1 has mp = 1: every node is on the replica's one critical path
  out.tp_comm_s = 0;
  for (size_t v = 0; v < times_at_batch.forward_comm_s.size(); ++v) {
    out.tp_comm_s += times_at_batch.forward_comm_s[v] + times_at_batch.backward_comm_s[v];
  }
  return times.forward_s + times.backward_s;
}

double Evaluator::pipeline_compute(const Plan& plan, double slowdown, Prediction& out) const {
  const Graph& graph = problem_.graph;
  const int64_t num_stages = plan.num_stages();
  const double microbatch = static_cast<double>(plan.per_replica_batch) /
                            static_cast<double>(plan.num_microbatches);
  const NodeTimes& plain_times =
      node_times(microbatch, slowdown, plan.tp, plan.sequence_parallel, blocks_run_eager(plan));
  const NodeTimes& micro_times = with_recompute(plan, plain_times);
  const double action_s = problem_.cluster.runtime.action_cost_s(schedule_name(plan.schedule), microbatch);
  pipeline_stage_costs(graph, plan.assignment, num_stages, micro_times,
                       batch_scale(graph, microbatch), action_s, stages_);
  // A split backward runs two actions, I and W (pipeline_schedule.h): W is the nodes' weight
  // gradients at their plain backward (a recomputed forward and a TP collective, the input
  // gradient's, belong to I).
  const bool split = schedule_splits_backward(plan.schedule);
  weight_s_.assign(split ? num_stages : 0, action_s);
  if (split) {
    stage_input_region(graph, plan.assignment, carries_gradient_, input_region_);
    for (size_t v = 0; v < graph.nodes.size(); ++v) {
      const double base_s = plain_weight_base_s(plain_times, v);
      const SplitBackward part = split_backward(graph.nodes[v], base_s, slowdown, input_region_[v] != 0);
      weight_s_[plan.assignment[v]] += part.weight_s;
      // the split's own cost: I + W is more than the plain backward by that much
      stages_.backward_s[plan.assignment[v]] += part.input_s + part.weight_s - base_s;
    }
    for (double& b : stages_.backward_s) b += action_s;
  }
  p2p_s_.assign(stages_.boundary_bytes.size(), 0.0);
  for (size_t s = 0; s < p2p_s_.size(); ++s) {
    const int64_t from = plan.device_of(static_cast<int32_t>(s));
    const int64_t to = plan.device_of(static_cast<int32_t>(s + 1));
    if (stages_.boundary_bytes[s] <= 0 || from == to) continue;  // zbv's turn: one rank
    // between nodes on the inter-node link, shared by the TP ranks' transfers
    const Link link = tp_stage_link(problem_.cluster, plan.mesh[0][from], plan.mesh[0][to], plan.tp);
    p2p_s_[s] = boundary_p2p_s(link, stages_.boundary_tensors[s], stages_.boundary_bytes[s]);
  }
  const PipelineShape shape{.num_stages = num_stages, .num_microbatches = plan.num_microbatches,
                            .num_ranks = plan.mp};
  // (rescale_for_waiting_ranks changes the stage times these refer to, then the schedule runs again)
  const StagePassTimes pass_times{stages_.forward_s, stages_.backward_s, weight_s_, p2p_s_,
                                  problem_.cluster.collectives == CollectiveLibrary::kGloo};
  PipelineTimes times = simulate_pipeline(plan.schedule, shape, pass_times, pipeline_);
  if (rescale_for_waiting_ranks(plan, slowdown, action_s)) {
    times = simulate_pipeline(plan.schedule, shape, pass_times, pipeline_);
  }
  // Gradients become final during each stage's last B (or W), in reverse topological order.
  stage_backward_s_.assign(num_stages, action_s);
  gradient_ready_s_.resize(graph.nodes.size());
  for (NodeIndex v : reverse_topo_) {
    const int32_t s = plan.assignment[v];
    stage_backward_s_[s] += pipeline_.last_backward_is_weight[s]
                                ? split_backward(graph.nodes[v], plain_weight_base_s(plain_times, v),
                                                 slowdown, input_region_[v] != 0)
                                      .weight_s
                                : micro_times.backward_s[v];
    gradient_ready_s_[v] = pipeline_.last_backward_start_s[s] + stage_backward_s_[s];
  }
  out.transfer_s = times.transfer_s;
  out.bubble_s = times.bubble_s;
  // the busiest stage's TP collectives, once per micro-batch
  out.tp_comm_s = 0;
  if (!micro_times.forward_comm_s.empty()) {
    stage_tp_comm_s_.assign(num_stages, 0.0);
    for (size_t v = 0; v < graph.nodes.size(); ++v) {
      stage_tp_comm_s_[plan.assignment[v]] += micro_times.forward_comm_s[v] + micro_times.backward_comm_s[v];
    }
    out.tp_comm_s = static_cast<double>(plan.num_microbatches) *
                    *std::max_element(stage_tp_comm_s_.begin(), stage_tp_comm_s_.end());
  }
  return times.compute_s;
}

std::vector<std::vector<Evaluator::TimedPass>> Evaluator::pipeline_timeline(const Plan& plan) const {
  check_shape(plan);
  HP_INTERNAL_ASSERT(plan.mode == MpMode::kPipeline, "pipeline_timeline of a placement plan");
  Prediction scratch;
  pipeline_compute(plan, compute_slowdown(plan), scratch);
  std::vector<std::vector<TimedPass>> out;
  simulated_timeline(plan, out);
  return out;
}

void Evaluator::simulated_timeline(const Plan& plan, std::vector<std::vector<TimedPass>>& out) const {
  const int64_t m = plan.num_microbatches;
  out.resize(plan.mp);
  for (auto& rank : out) rank.clear();
  for (int64_t r = 0; r < plan.mp; ++r) {
    for (const PipelinePass& pass : pipeline_.passes[r]) {
      const int64_t at = pass.stage * m + pass.microbatch;
      double end_s = 0, duration_s = 0;
      switch (pass.kind) {
        case PassKind::kForward:
          end_s = pipeline_.forward_finish_s[at];
          duration_s = stages_.forward_s[pass.stage];
          break;
        case PassKind::kBackward:
          end_s = pipeline_.backward_finish_s[at];
          duration_s = stages_.backward_s[pass.stage];
          break;
        case PassKind::kBackwardInput:
          end_s = pipeline_.backward_finish_s[at];
          duration_s = stages_.backward_s[pass.stage] - weight_s_[pass.stage];
          break;
        case PassKind::kBackwardWeight:
          end_s = pipeline_.weight_finish_s[at];
          duration_s = weight_s_[pass.stage];
          break;
      }
      out[r].push_back({pass, end_s - duration_s, end_s});
    }
  }
}

bool Evaluator::rescale_for_waiting_ranks(const Plan& plan, double slowdown, double action_s) const {
  const Cluster& cluster = problem_.cluster;
  if (cluster.runtime.shared_host_slowdown.empty() || slowdown <= 0) return false;
  // The weight of each pipeline rank on the busiest node (compute_slowdown found it for this
  // plan): its replicas there, times its TP ranks.
  if (processes_on_node_[busiest_node_] < 2) return false;
  rank_weight_.assign(plan.mp, 0);
  for (const auto& row : plan.mesh) {
    for (int64_t k = 0; k < plan.mp; ++k) {
      if (row[k] / cluster.devices_per_node == busiest_node_) rank_weight_[k] += plan.tp;
    }
  }
  simulated_timeline(plan, timeline_);
  // c(t), the processes computing on the node: +weight at a pass's start, -weight at its end.
  busy_events_.clear();
  for (int64_t r = 0; r < plan.mp; ++r) {
    if (rank_weight_[r] == 0) continue;
    for (const TimedPass& p : timeline_[r]) {
      if (p.end_s <= p.start_s) continue;
      busy_events_.emplace_back(p.start_s, rank_weight_[r]);
      busy_events_.emplace_back(p.end_s, -rank_weight_[r]);
    }
  }
  std::sort(busy_events_.begin(), busy_events_.end());
  // Piecewise constant slowdown(c(t)) / slowdown: breakpoints and the integral up to each.
  breakpoint_s_.clear();
  segment_ratio_.clear();
  integral_s_.clear();
  int64_t computing = 0;
  double integral = 0;
  for (size_t e = 0; e < busy_events_.size(); ++e) {
    computing += busy_events_[e].second;
    if (e + 1 < busy_events_.size() && busy_events_[e + 1].first == busy_events_[e].first) continue;
    if (!breakpoint_s_.empty()) integral += segment_ratio_.back() * (busy_events_[e].first - breakpoint_s_.back());
    breakpoint_s_.push_back(busy_events_[e].first);
    integral_s_.push_back(integral);
    segment_ratio_.push_back(computing > 0 ? cluster.runtime.slowdown(computing) / slowdown : 1.0);
  }
  const auto integral_to = [&](double t) {
    const auto at = std::upper_bound(breakpoint_s_.begin(), breakpoint_s_.end(), t) - breakpoint_s_.begin() - 1;
    if (at < 0) return 0.0;
    return integral_s_[at] + segment_ratio_[at] * (t - breakpoint_s_[at]);
  };
  // The mean ratio over each (stage, kind)'s passes: [stage * 3 + 0] F, + 1 B or I, + 2 W.
  const int64_t num_stages = plan.num_stages();
  ratio_sum_.assign(num_stages * 3, 0.0);
  ratio_count_.assign(num_stages * 3, 0);
  bool changed = false;
  for (int64_t r = 0; r < plan.mp; ++r) {
    if (rank_weight_[r] == 0) continue;
    for (const TimedPass& p : timeline_[r]) {
      if (p.end_s <= p.start_s) continue;
      const int64_t slot = p.pass.stage * 3 + (p.pass.kind == PassKind::kForward          ? 0
                                               : p.pass.kind == PassKind::kBackwardWeight ? 2
                                                                                          : 1);
      const double ratio = (integral_to(p.end_s) - integral_to(p.start_s)) / (p.end_s - p.start_s);
      ratio_sum_[slot] += ratio;
      ++ratio_count_[slot];
      changed = changed || ratio != 1.0;
    }
  }
  if (!changed) return false;
  const auto scaled = [&](double pass_s, int64_t slot) {
    if (ratio_count_[slot] == 0) return pass_s;
    const double compute = std::max(0.0, pass_s - action_s);
    return pass_s - compute + compute * ratio_sum_[slot] / static_cast<double>(ratio_count_[slot]);
  };
  const bool split = !weight_s_.empty();
  for (int64_t s = 0; s < num_stages; ++s) {
    stages_.forward_s[s] = scaled(stages_.forward_s[s], s * 3);
    if (split) {
      const double input_s = scaled(stages_.backward_s[s] - weight_s_[s], s * 3 + 1);
      weight_s_[s] = scaled(weight_s_[s], s * 3 + 2);
      stages_.backward_s[s] = input_s + weight_s_[s];
    } else {
      stages_.backward_s[s] = scaled(stages_.backward_s[s], s * 3 + 1);
    }
  }
  return true;
}

void Evaluator::count_groups_on_nodes(const Plan& plan) const {
  const Cluster& cluster = problem_.cluster;
  // G per node: groups with gradient bytes that span nodes and have a member on the node.
  groups_on_node_.assign(cluster.num_nodes, 0);
  node_stamp_.assign(cluster.num_nodes, -1);
  const auto spans_nodes = [&](int64_t k) {
    const int64_t first = plan.mesh[0][k] / cluster.devices_per_node;
    for (const auto& row : plan.mesh) {
      if (row[k] / cluster.devices_per_node != first) return true;
    }
    return false;
  };
  for (int64_t k = 0; k < plan.mp; ++k) {
    if (group_bytes_[k] <= 0 || !spans_nodes(k)) continue;
    for (const auto& row : plan.mesh) {
      const int64_t node = row[k] / cluster.devices_per_node;
      if (node_stamp_[node] != k) {
        node_stamp_[node] = k;
        ++groups_on_node_[node];
      }
    }
  }
}

void Evaluator::fill_group_ready_s(const Plan& plan) const {
  group_ready_s_.assign(plan.mp, 0.0);
  for (size_t v = 0; v < plan.assignment.size(); ++v) {
    double& ready = group_ready_s_[plan.device_of(plan.assignment[v])];
    ready = std::max(ready, gradient_ready_s_[v]);
  }
}

int64_t Evaluator::fill_group_devices(const Plan& plan, int64_t k, int64_t first, int64_t stride,
                                      int64_t count) const {
  group_devices_.clear();
  int64_t concurrent = 1;
  for (int64_t i = 0; i < (count < 0 ? plan.dp : count); ++i) {
    const DeviceIndex d = plan.mesh[first + i * stride][k];
    group_devices_.push_back(d);
    concurrent = std::max(concurrent, groups_on_node_[d / problem_.cluster.devices_per_node]);
  }
  return concurrent * plan.tp;  // each TP rank runs its own ring over its replicas' TP ranks
}

double Evaluator::exposed_allreduce_s(const Plan& plan, double compute_s, Prediction& out) const {
  out.allreduce_rings.clear();
  if (plan.dp <= 1) return 0.0;
  const Graph& graph = problem_.graph;
  const Cluster& cluster = problem_.cluster;
  const int64_t groups = plan.mp;
  fill_param_bytes(plan);
  group_bytes_.assign(param_bytes_.begin(), param_bytes_.end());
  for (double& b : group_bytes_) b *= reduce_ratio_;  // gradients reduced in fp32 (precision_cost.h)
  count_groups_on_nodes(plan);
  buckets_.resize(groups);
  out.allreduce_rings.resize(groups);
  for (int64_t k = 0; k < groups; ++k) {
    const int64_t concurrent = fill_group_devices(plan, k);
    // A group's cost depends only on its devices and sharing; search re-evaluates the same
    // mesh many times with other assignments, and grouping thousands of devices by node
    // dominated evaluate() at large dp.
    group_devices_.push_back(concurrent);  // the key: the devices, then the sharing
    auto it = allreduce_cache_.find(group_devices_);
    group_devices_.pop_back();
    if (it == allreduce_cache_.end()) {
      if (allreduce_cache_.size() > kAllReduceCacheEntries) allreduce_cache_.clear();
      std::vector<DeviceIndex> ring;
      const AllReduceCost cost = group_allreduce(cluster, group_devices_, concurrent, &ring);
      std::vector<DeviceIndex> key = group_devices_;
      key.push_back(concurrent);
      it = allreduce_cache_.emplace(std::move(key), std::make_pair(cost, std::move(ring))).first;
    }
    out.allreduce_rings[k] = it->second.second;
    const AllReduceCost cost = group_bytes_[k] > 0 ? it->second.first : AllReduceCost{};
    buckets_[k] = BucketedAllReduce(cost, bucket_caps);
  }
  // Feed gradients in the order they become ready on each device; a tied copy's gradient is
  // ready with its stage's first node's.
  fill_group_ready_s(plan);
  const std::vector<int64_t>& degrees = node_degrees(plan.tp);
  for (int64_t k = 0; k < groups; ++k) {
    double node_bytes = 0;
    for (size_t v = 0; v < graph.nodes.size(); ++v) {
      if (plan.device_of(plan.assignment[v]) == k) {
        node_bytes += static_cast<double>(tp_param_bytes(graph.nodes[v], degrees[v])) * reduce_ratio_;
      }
    }
    const double copies = group_bytes_[k] - node_bytes;
    if (copies > 0) buckets_[k].add_gradient(group_ready_s_[k], copies);
  }
  const std::vector<NodeIndex>& ready_order =
      plan.mode == MpMode::kPipeline
          ? reverse_topo_
          : placement_order(static_cast<double>(plan.per_replica_batch), out.compute_slowdown,
                            plan.tp, plan.sequence_parallel)
                .backward;
  for (NodeIndex v : ready_order) {
    buckets_[plan.device_of(plan.assignment[v])].add_gradient(
        gradient_ready_s_[v],
        static_cast<double>(tp_param_bytes(graph.nodes[v], degrees[v])) * reduce_ratio_);
  }
  double end_s = 0;
  for (auto& bucketed : buckets_) end_s = std::max(end_s, bucketed.end_s());
  return std::max(0.0, end_s - compute_s);
}

void Evaluator::count_hybrid_groups_on_nodes(const Plan& plan, bool shard_groups) const {
  const Cluster& cluster = problem_.cluster;
  // Shard groups: dp_replicate x mp of them, dp_shard consecutive replicas each; replicate
  // groups: dp_shard x mp, replicas dp_shard apart.
  const int64_t groups = shard_groups ? plan.dp_replicate() : plan.shard_degree();
  const int64_t members = shard_groups ? plan.shard_degree() : plan.dp_replicate();
  const int64_t member_stride = shard_groups ? 1 : plan.shard_degree();
  const auto group_first = [&](int64_t g) { return shard_groups ? g * plan.shard_degree() : g; };
  const auto node_of = [&](int64_t g, int64_t i, int64_t k) {
    return plan.mesh[group_first(g) + i * member_stride][k] / cluster.devices_per_node;
  };
  groups_on_node_.assign(cluster.num_nodes, 0);
  node_stamp_.assign(cluster.num_nodes, -1);
  for (int64_t k = 0; k < plan.mp; ++k) {
    for (int64_t g = 0; g < groups; ++g) {
      bool spans = false;
      for (int64_t i = 1; i < members && !spans; ++i) spans = node_of(g, i, k) != node_of(g, 0, k);
      if (!spans) continue;
      const int64_t stamp = k * groups + g;
      for (int64_t i = 0; i < members; ++i) {
        const int64_t node = node_of(g, i, k);
        if (node_stamp_[node] != stamp) {
          node_stamp_[node] = stamp;
          ++groups_on_node_[node];
        }
      }
    }
  }
}

const AllReduceCost& Evaluator::shard_group_cost(Collective kind, bool allreduce,
                                                 int64_t concurrent) const {
  // the key: the devices, then the collective and the sharing (appended for the lookup)
  const size_t size = group_devices_.size();
  group_devices_.insert(group_devices_.end(),
                        {static_cast<DeviceIndex>(kind), allreduce ? 1 : 0, concurrent});
  auto it = shard_cost_cache_.find(group_devices_);
  if (it == shard_cost_cache_.end()) {
    if (shard_cost_cache_.size() > kAllReduceCacheEntries) shard_cost_cache_.clear();
    std::vector<DeviceIndex> key = group_devices_;
    group_devices_.resize(size);
    const Cluster& cluster = problem_.cluster;
    const AllReduceCost cost = allreduce ? group_allreduce(cluster, group_devices_, concurrent)
                                         : group_shard_collective(cluster, group_devices_, kind, concurrent);
    it = shard_cost_cache_.emplace(std::move(key), cost).first;
  }
  group_devices_.resize(size);
  return it->second;
}

double Evaluator::exposed_sharding_s(const Plan& plan, double compute_s, double slowdown,
                                     bool reduce) const {
  const Graph& graph = problem_.graph;
  const Cluster& cluster = problem_.cluster;
  fill_param_bytes(plan);
  gather_cost_.resize(plan.mp);
  scatter_cost_.resize(plan.mp);
  replicate_cost_.assign(plan.mp, AllReduceCost{});
  const bool hybrid = plan.dp_replicate() > 1;  // HSDP: shard groups all-reduce their shards
  if (hybrid) {
    count_hybrid_groups_on_nodes(plan, true);
  } else {
    group_bytes_.assign(param_bytes_.begin(), param_bytes_.end());
    count_groups_on_nodes(plan);
  }
  for (int64_t k = 0; k < plan.mp; ++k) {  // the shard group of replica 0 (all alike)
    const int64_t concurrent = fill_group_devices(plan, k, 0, 1, plan.shard_degree());
    gather_cost_[k] = shard_group_cost(Collective::kAllGather, false, concurrent);
    scatter_cost_[k] = shard_group_cost(Collective::kReduceScatter, false, concurrent);
  }
  if (hybrid) {
    count_hybrid_groups_on_nodes(plan, false);
    for (int64_t k = 0; k < plan.mp; ++k) {  // the replicate group of replica 0
      const int64_t across = fill_group_devices(plan, k, 0, plan.shard_degree(), plan.dp_replicate());
      replicate_cost_[k] = shard_group_cost(Collective::kAllReduce, true, across);
    }
  }
  // A unit's gradient leaves as a reduce-scatter over its shard group, then (HSDP) an all-reduce
  // of its shard (bytes / dp_shard) over its replicate group, as FSDP2 runs them in turn.
  const double shard_share = 1.0 / static_cast<double>(plan.shard_degree());
  const auto reduce_s = [&](int64_t k, double bytes) {
    if (!reduce) return 0.0;  // an accumulation's earlier micro-step: no reduction
    bytes *= reduce_ratio_;   // gradients leave in fp32 under a 16-bit precision (precision_cost.h)
    return scatter_cost_[k].time_s(bytes) + (hybrid ? replicate_cost_[k].time_s(bytes * shard_share) : 0.0);
  };
  if (plan.mode == MpMode::kPipeline) {
    // Each stage gathers its parameters at its first forward, on the pipeline's fill path, and
    // a rank reduce-scatters its stages' gradients after its last backward.
    double fill_s = 0;
    for (size_t s = 0; s < stage_param_bytes_.size(); ++s) {
      // a pipeline's stages run under autocast with fp32 parameters: gathered in fp32
      fill_s += gather_cost_[plan.device_of(static_cast<int32_t>(s))].time_s(
          static_cast<double>(stage_param_bytes_[s]) * reduce_ratio_);
    }
    fill_group_ready_s(plan);
    double end_s = 0;
    for (int64_t k = 0; k < plan.mp; ++k) {
      end_s = std::max(end_s, group_ready_s_[k] + reduce_s(k, static_cast<double>(param_bytes_[k])));
    }
    return fill_s + std::max(0.0, end_s - compute_s);
  }
  // Placement, mp = 1: a unit per node with parameters, in the order the replica runs them.
  const NodeTimes& times =
      with_recompute(plan, node_times(static_cast<double>(plan.per_replica_batch), slowdown, plan.tp,
                                      plan.sequence_parallel));
  const bool zero3 = plan.sharding == Sharding::kZero3;
  const AllReduceCost& gather = gather_cost_[0];
  const std::vector<int64_t>& degrees = node_degrees(plan.tp);
  const auto bytes = [&](NodeIndex v) {
    return static_cast<double>(tp_param_bytes(graph.nodes[v], degrees[v]));
  };
  // The ranks meet at every unit's collectives: the replica's compute slows by this share
  // (cluster.h runtime.sharded_compute_slowdown; measured by calibrate).
  const double meeting_s = cluster.runtime.sharded_compute_slowdown * compute_s;
  if (serial_replica_devices()) {  // one thread computes and waits for every collective in turn
    double total_s = meeting_s;
    for (size_t v = 0; v < graph.nodes.size(); ++v) {
      total_s += (zero3 ? 2 : 1) * gather.time_s(bytes(v)) + reduce_s(0, bytes(v));
    }
    return total_s;
  }
  // One communication stream beside compute: a unit's all-gather is issued when the previous
  // unit's forward starts (prefetch), its forward waits for it; in backward (zero3) the next
  // unit's all-gather is issued when a unit's backward starts, and a unit's reduce-scatter
  // when its backward ends.
  double t = 0, comm = 0, previous_start = 0, plain = 0;
  for (NodeIndex v : graph.topo_order) {
    plain += times.forward_s[v] + times.backward_s[v];
    if (bytes(v) > 0) {
      comm = std::max(previous_start, comm) + gather.time_s(bytes(v));
      t = std::max(t, comm);
      previous_start = t;
    }
    t += times.forward_s[v];
  }
  units_.clear();
  for (NodeIndex v : reverse_topo_) {
    if (bytes(v) > 0) units_.push_back(v);
  }
  gathered_s_.assign(graph.nodes.size(), 0.0);
  if (zero3 && !units_.empty()) {
    comm = std::max(t, comm) + gather.time_s(bytes(units_[0]));
    gathered_s_[units_[0]] = comm;
  }
  size_t next = 1;
  for (NodeIndex v : reverse_topo_) {
    if (bytes(v) > 0) {
      if (zero3) {
        t = std::max(t, gathered_s_[v]);
        if (next < units_.size()) {
          comm = std::max(t, comm) + gather.time_s(bytes(units_[next]));
          gathered_s_[units_[next++]] = comm;
        }
      }
      t += times.backward_s[v];
      if (reduce) comm = std::max(t, comm) + reduce_s(0, bytes(v));
    } else {
      t += times.backward_s[v];
    }
  }
  return std::max(t, comm) - plain + meeting_s;
}

double Evaluator::optimizer_s(const Plan& plan) const {
  fill_param_bytes(plan);
  const Cluster& cluster = problem_.cluster;
  const OptimizerState& optimizer = optimizer_state_;
  // A sharded plan updates its shards: 1/dp_shard of the bytes, every tensor (docs/sharding.md).
  const bool sharded = plan.sharding != Sharding::kNone;
  const double share = sharded ? 1.0 / static_cast<double>(plan.shard_degree()) : 1.0;
  if (plan.mode == MpMode::kPlacement) {
    // One process per replica loops over every tensor of its devices (the per-tensor cost adds
    // up); the devices stream their bytes concurrently, unless one device runs them all.
    const bool serial = serial_replica_devices();
    int64_t bytes = 0, tensors = 0;
    for (size_t d = 0; d < param_bytes_.size(); ++d) {
      bytes = serial ? bytes + param_bytes_[d] : std::max(bytes, param_bytes_[d]);
      tensors += param_tensors_[d];
    }
    return optimizer_step_s(cluster, optimizer, static_cast<double>(bytes) * share,
                            static_cast<double>(tensors), sharded);
  }
  double slowest_s = 0;  // pipeline: a process per stage
  for (size_t d = 0; d < param_bytes_.size(); ++d) {
    slowest_s = std::max(slowest_s, optimizer_step_s(cluster, optimizer,
                                                     static_cast<double>(param_bytes_[d]) * share,
                                                     static_cast<double>(param_tensors_[d]), sharded));
  }
  return slowest_s;
}

void Evaluator::fill_param_bytes(const Plan& plan) const {
  const Graph& graph = problem_.graph;
  const int64_t values = plan.num_stages();  // local devices (placement) or stages (pipeline)
  stage_param_bytes_.assign(values, 0);
  param_tensors_.assign(plan.mp, 0);
  const std::vector<int64_t>& degrees = node_degrees(plan.tp);
  for (size_t v = 0; v < graph.nodes.size(); ++v) {
    stage_param_bytes_[plan.assignment[v]] += tp_param_bytes(graph.nodes[v], degrees[v]);
    param_tensors_[plan.device_of(plan.assignment[v])] +=
        std::max<int64_t>(0, graph.nodes[v].param_tensors);
  }
  if (plan.mode == MpMode::kPipeline) {
    for (const TiedParams& tied : graph.tied_params) {
      // Every stage holding one of the nodes, but the first node's (whose param_bytes count
      // it): each stage module holds its own copy, two stages of one rank two.
      stage_stamp_.assign(values, 0);
      stage_stamp_[plan.assignment[tied.nodes.front()]] = 1;
      for (NodeIndex v : tied.nodes) {
        const int32_t s = plan.assignment[v];
        if (stage_stamp_[s]) continue;
        stage_stamp_[s] = 1;
        stage_param_bytes_[s] += tp_tied_bytes(tied, degrees);
        if (graph.nodes[tied.nodes.front()].param_tensors >= 0) param_tensors_[plan.device_of(s)] += 1;
      }
    }
  }
  param_bytes_.assign(plan.mp, 0);
  for (int64_t s = 0; s < values; ++s) {
    param_bytes_[plan.device_of(static_cast<int32_t>(s))] += stage_param_bytes_[s];
  }
}

double Evaluator::tied_allreduce_s(const Plan& plan) const {
  if (plan.mode != MpMode::kPipeline || problem_.graph.tied_params.empty()) return 0.0;
  double total_s = 0;
  for (const TiedParams& tied : problem_.graph.tied_params) {
    group_devices_.clear();
    for (NodeIndex v : tied.nodes) {
      const DeviceIndex d = plan.mesh[0][plan.device_of(plan.assignment[v])];
      if (std::find(group_devices_.begin(), group_devices_.end(), d) == group_devices_.end()) {
        group_devices_.push_back(d);
      }
    }
    if (group_devices_.size() < 2) continue;
    std::sort(group_devices_.begin(), group_devices_.end());
    total_s += group_allreduce(problem_.cluster, group_devices_, plan.tp)
                   .time_s(static_cast<double>(tp_tied_bytes(tied, node_degrees(plan.tp))) *
                           reduce_ratio_);  // fp32 gradients (precision_cost.h)
  }
  return total_s;
}

void Evaluator::memory_kept(const Plan& plan, double scale) const {
  const Graph& graph = memory_graph(plan);
  const bool pipeline = plan.mode == MpMode::kPipeline;
  const int64_t values = plan.num_stages();
  activation_bytes_.assign(values, 0.0);
  fill_param_bytes(plan);
  transient_bytes_.assign(values, 0.0);
  recompute_bytes_.assign(values, 0.0);
  largest_unit_bytes_.assign(values, 0.0);
  node_kept_bytes_.assign(graph.nodes.size(), 0.0);
  recompute_inputs_.assign(plan.recompute.empty() || pipeline ? 0 : graph.nodes.size() * plan.mp, 0);
  const std::vector<int64_t>& degrees = node_degrees(plan.tp);
  const std::vector<double>& shares = activation_shares(plan.tp, plan.sequence_parallel);
  for (size_t v = 0; v < graph.nodes.size(); ++v) {
    const int32_t k = plan.assignment[v];
    largest_unit_bytes_[k] = std::max(largest_unit_bytes_[k],
                                      static_cast<double>(tp_param_bytes(graph.nodes[v], degrees[v])));
    // a TP rank keeps its slice of a split activation, and under sequence parallelism of a
    // per-token node's (tensor_parallel_cost.h)
    const double share = shares[v];
    const double before = activation_bytes_[k];
    double activations = share * kept_bytes(graph.nodes[v], scale);
    if (plan.recomputes_selectively(v)) {  // it also keeps its costly ops' outputs
      const double saved = share * scaled_bytes(graph.nodes[v].selective_saved_bytes, scale);
      activation_bytes_[k] += saved;
      activations = std::max(0.0, activations - saved);  // what its recompute rebuilds
    }
    if (!plan.recomputes(v)) {
      activation_bytes_[k] += activations;
    } else if (pipeline) {  // the stage is one checkpoint; its inputs are its receive buffers
      recompute_bytes_[k] += activations;
    } else {  // the node keeps its inputs; one node's activations are rebuilt at a time
      for (int32_t e : graph.in_edges[v]) {  // a value several checkpoints keep is held once
        int64_t& kept = recompute_inputs_[static_cast<size_t>(graph.edges[e].src) * plan.mp + k];
        kept = std::max(kept, graph.edges[e].bytes);
      }
      recompute_bytes_[k] = std::max(recompute_bytes_[k], activations);
    }
    node_kept_bytes_[v] = activation_bytes_[k] - before;
  }
}

void Evaluator::memory_transient(const Plan& plan, double scale) const {
  const Graph& graph = memory_graph(plan);
  const bool pipeline = plan.mode == MpMode::kPipeline;
  const int64_t values = plan.num_stages();
  const int32_t sink = graph.topo_order.empty() ? -1 : graph.topo_order.back();
  const bool multi_stage = pipeline && schedule_is_multi_stage(plan.schedule);
  // The backward workspace: node v's backward runs once the nodes after it on its device have
  // run theirs and freed what they kept (memory_cost.h), so it needs its workspace above what
  // is held less those.
  freed_bytes_.assign(values, 0.0);
  for (auto it = graph.topo_order.rbegin(); it != graph.topo_order.rend(); ++it) {
    const int32_t k = plan.assignment[*it];
    transient_bytes_[k] = std::max(transient_bytes_[k],
                                   backward_workspace_bytes(graph, *it, scale) - freed_bytes_[k]);
    freed_bytes_[k] += node_kept_bytes_[*it];
  }
  for (size_t i = 0; i < recompute_inputs_.size(); ++i) {
    activation_bytes_[i % plan.mp] += scaled_bytes(recompute_inputs_[i], scale);
  }
  for (int64_t k = 0; k < values; ++k) transient_bytes_[k] += recompute_bytes_[k];
  // What is live only while one stage computes (its backward workspace, its recomputed
  // activations): a rank holding several stages needs the largest, not the sum (below).
  stage_workspace_bytes_ = transient_bytes_;
  if (sink >= 0) {
    const double replica_scale = batch_scale(graph, static_cast<double>(plan.per_replica_batch));
    // the replica's input batch, where the first node runs: a step's whole batch, all its
    // micro-steps' (the caller holds it while step() runs its parts)
    transient_bytes_[plan.assignment[graph.topo_order.front()]] +=
        scaled_bytes(graph.profiled.input_bytes, replica_scale) *
        static_cast<double>(plan.accumulation_steps);
    // the model's output, held until its backward is done: the whole batch's (placement), or
    // one per micro-batch in flight on the last stage (pipeline)
    const int32_t last = plan.assignment[sink];
    double outputs_held = static_cast<double>(in_flight_microbatches(
        pipeline ? plan.schedule : Schedule::kNone, plan.num_microbatches, plan.mp, last));
    if (multi_stage) {  // the last stage's micro-batches in flight on its rank's pass order
      stage_activation_bytes_.assign(values, 0.0);
      stage_activation_bytes_[last] = 1.0;
      outputs_held = peak_activation_bytes(pipeline_.passes[plan.device_of(last)], stage_activation_bytes_);
    }
    transient_bytes_[last] += scaled_bytes(graph.nodes[sink].output_bytes, scale) * outputs_held;
  }
  if (pipeline) {  // receive buffers, one per micro-batch, each way (pipeline_compute filled stages_)
    const auto m = static_cast<double>(plan.num_microbatches);
    for (size_t b = 0; b < stages_.boundary_bytes.size(); ++b) {
      transient_bytes_[b] += m * stages_.boundary_bytes[b];  // gradients into stage b
      // ZB-V's turn joins two stages of one rank: torch's schedule hands the producer's output
      // over as the consumer's input (set_local_fwd_input), which the producer holds for its
      // own backward anyway. The input gradient it hands back (set_local_bwd_input) stays
      // referenced by the receiving stage until the next step replaces it: a buffer as usual.
      if (plan.device_of(static_cast<int32_t>(b)) == plan.device_of(static_cast<int32_t>(b + 1))) continue;
      transient_bytes_[b + 1] += m * stages_.boundary_bytes[b];  // activations into stage b + 1
    }
  }
}

void Evaluator::memory_fold_ranks(const Plan& plan, double scale) const {
  const Graph& graph = memory_graph(plan);
  const int64_t values = plan.num_stages();
  stage_activation_bytes_ = activation_bytes_;
  stage_transient_bytes_ = transient_bytes_;
  activation_bytes_.assign(plan.mp, 0.0);
  transient_bytes_.assign(plan.mp, 0.0);
  const bool split = schedule_splits_backward(plan.schedule);
  split_held_bytes_.assign(split ? values : 0, 0.0);
  if (split) {  // input_region_: pipeline_compute's, for this plan
    // A stage none of whose nodes is in its input region (the first) runs its whole backward
    // in W: its workspace is W's, and its I needs none.
    weight_workspace_bytes_ = stage_workspace_bytes_;
    input_workspace_bytes_.assign(values, 0.0);
    // I runs the region's nodes from the stage's outputs back (reverse topological order) with
    // the graph retained for W: the nodes after v free nothing (memory_transient's credit does
    // not apply), and the gradients I recorded at them are held while v's backward runs.
    for (auto it = graph.topo_order.rbegin(); it != graph.topo_order.rend(); ++it) {
      const int32_t v = *it;
      if (!input_region_[v]) continue;  // I records nothing for it: W runs it whole
      const int32_t s = plan.assignment[v];
      input_workspace_bytes_[s] = std::max(input_workspace_bytes_[s],
                                           backward_workspace_bytes(graph, v, scale) +
                                               split_held_bytes_[s] + recompute_bytes_[s]);
      weight_workspace_bytes_[s] = 0.0;
      // the gradients I records for W, held until it: measured, else the output gradient of
      // a node with parameters
      const Node& node = graph.nodes[v];
      if (node.split_held_bytes >= 0) {
        split_held_bytes_[s] += scaled_bytes(node.split_held_bytes, scale);
      } else if (node.param_bytes > 0) {
        split_held_bytes_[s] += scaled_bytes(node.output_bytes, scale);
      }
    }
  } else {
    input_workspace_bytes_ = stage_workspace_bytes_;
    weight_workspace_bytes_.clear();
  }
  // a stage's workspace is live while its backward runs: it joins what the rank holds at
  // that pass (peak_activation_bytes), not the rank's largest held activations
  for (int64_t k = 0; k < plan.mp; ++k) {
    activation_bytes_[k] = peak_activation_bytes(pipeline_.passes[k], stage_activation_bytes_,
                                                 split_held_bytes_, input_workspace_bytes_,
                                                 weight_workspace_bytes_);
  }
  for (int64_t s = 0; s < values; ++s) {  // held buffers add up
    transient_bytes_[plan.device_of(static_cast<int32_t>(s))] +=
        stage_transient_bytes_[s] - stage_workspace_bytes_[s];
  }
}

// Memory per device (memory_cost.h) in four steps: what each device or stage keeps for the
// backward (memory_kept), what is live only for a while (memory_transient), a multi-stage
// rank's stages folded into the rank (memory_fold_ranks), then the total per device.
void Evaluator::memory(const Plan& plan, Prediction& out) const {
  const Graph& graph = memory_graph(plan);
  const bool pipeline = plan.mode == MpMode::kPipeline;
  const double batch = pipeline ? static_cast<double>(plan.per_replica_batch) /
                                      static_cast<double>(plan.num_microbatches)
                                : static_cast<double>(plan.per_replica_batch);
  const double scale = batch_scale(graph, batch);  // bytes are exactly linear in the batch
  // Per assignment value: local device (placement) or stage (pipeline), folded into the ranks
  // that hold several stages at the end.
  memory_kept(plan, scale);
  memory_transient(plan, scale);
  const bool multi_stage = pipeline && schedule_is_multi_stage(plan.schedule);
  if (multi_stage) memory_fold_ranks(plan, scale);
  out.memory_bytes.resize(plan.mp);
  const int64_t have_bytes = problem_.cluster.device.memory_bytes;
  ShardedState sharded;
  sharded.sharding = plan.sharding;
  sharded.dp = plan.shard_degree();
  sharded.pipeline = pipeline;
  sharded.overlapped = !serial_replica_devices();
  sharded.accumulating = plan.accumulation_steps > 1;
  for (int64_t k = 0; k < plan.mp; ++k) {
    const int64_t in_flight =
        multi_stage ? 1
                    : in_flight_microbatches(pipeline ? plan.schedule : Schedule::kNone,
                                             plan.num_microbatches, plan.mp, k);
    // a sharded unit: a node with parameters (placement); the whole stage (pipeline)
    sharded.largest_unit_bytes =
        pipeline ? static_cast<double>(param_bytes_[k]) : largest_unit_bytes_[k];
    out.memory_bytes[k] = device_memory_bytes(param_bytes_[k], activation_bytes_[k], in_flight,
                                              optimizer_state_, transient_bytes_[k], sharded);
    if (out.feasible && out.memory_bytes[k] > have_bytes) {
      out.feasible = false;
      out.infeasible_reason =
          memory_infeasible_reason(plan.mode, k, plan.mesh[0][k], out.memory_bytes[k], have_bytes);
    }
  }
}

Prediction Evaluator::evaluate(const Plan& plan) const {
  check_shape(plan);
  // The job's precision is what is priced (the search copies it into its plans); a plan that
  // names another was planned for another job. A plan without one is priced in the job's.
  if (plan.precision != Precision::kFp32 && plan.precision != problem_.job.precision) {
    throw_input_error("plan", "precision",
                      std::string("must be the job's precision \"") +
                          precision_name(problem_.job.precision) +
                          "\" (a plan is priced and applied in the precision of the job it was "
                          "planned for)",
                      std::string("\"") + precision_name(plan.precision) + "\"");
  }
  if (plan.compile != problem_.job.compile) {
    throw_input_error("plan", "compile",
                      std::string("must be the job's compile = ") +
                          (problem_.job.compile ? "true" : "false") +
                          " (a plan is priced and applied compiled or eager as the job it was "
                          "planned for says)",
                      plan.compile ? "true" : "false");
  }
  Prediction out;
  out.compute_model = compute_.description();
  out.memory_model = memory_models_[precision_policy(plan) == PrecisionPolicy::kFsdp ? 1 : 0];
  out.compute_slowdown = compute_slowdown(plan);
  // One micro-step's compute; the gradients are synchronised once, overlapping the last
  // micro-step's backward (accumulation: the earlier ones only accumulate).
  const double micro_s = plan.mode == MpMode::kPipeline
                             ? pipeline_compute(plan, out.compute_slowdown, out)
                             : placement_compute(plan, out.compute_slowdown, out);
  const auto steps = static_cast<double>(plan.accumulation_steps);
  if (plan.sharding == Sharding::kNone) {
    out.allreduce_s = exposed_allreduce_s(plan, micro_s, out) + tied_allreduce_s(plan);
  } else {
    out.allreduce_rings.clear();
    out.sharding_s = exposed_sharding_s(plan, micro_s, out.compute_slowdown, true);
    // the earlier micro-steps gather the parameters again but reduce nothing
    if (plan.accumulation_steps > 1) {
      out.sharding_s +=
          (steps - 1) * exposed_sharding_s(plan, micro_s, out.compute_slowdown, false);
    }
    out.allreduce_s = tied_allreduce_s(plan);
  }
  // accumulation_steps micro-steps per step: their compute and what it includes
  out.compute_s = steps * micro_s;
  out.transfer_s *= steps;
  out.bubble_s *= steps;
  out.tp_comm_s *= steps;
  out.optimizer_s = optimizer_s(plan);
  out.overhead_s = problem_.cluster.runtime.step_overhead_s(plan.dp);
  out.step_s = out.compute_s + out.allreduce_s + out.sharding_s + out.optimizer_s + out.overhead_s;
  const auto global_batch = static_cast<double>(plan.global_batch);
  // A graph of zero-time nodes has step_s = 0; report 0 rather than an infinite rate, which
  // JSON cannot carry.
  out.samples_per_s = out.step_s > 0 ? global_batch / out.step_s : 0.0;
  memory(plan, out);
  const Job& job = problem_.job;
  if (job.convergence.model != Convergence::Model::kNone) {
    out.epochs = epochs_to_target(job.convergence, global_batch);
    out.time_to_train_s = time_to_train_s(out.epochs, job.samples_per_epoch, plan.global_batch,
                                          out.step_s);
  }
  return out;
}

Prediction evaluate(const Problem& problem, const Plan& plan) {
  return Evaluator(problem).evaluate(plan);
}

bool better_prediction(const Prediction& a, const Prediction& b) {
  if (a.feasible != b.feasible) return a.feasible;
  if (a.feasible) return a.step_s < b.step_s;
  return peak_memory_bytes(a) < peak_memory_bytes(b);
}

double objective(const Problem& problem, const Prediction& p) {
  if (!p.feasible) return std::numeric_limits<double>::infinity();
  if (problem.job.convergence.model != Convergence::Model::kNone) return p.time_to_train_s;
  return p.samples_per_s > 0 ? 1.0 / p.samples_per_s : 0.0;
}

}  // namespace hybridplan
