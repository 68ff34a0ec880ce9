#include "planner/evaluate.h"

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "planner/compute_cost.h"
#include "planner/convergence.h"
#include "planner/memory_cost.h"

namespace hybridplan {

Evaluator::Evaluator(const Problem& problem)
    : problem_(problem),
      order_(placement_priority_order(problem.graph)),
      reverse_topo_(problem.graph.topo_order.rbegin(), problem.graph.topo_order.rend()) {}

// A malformed plan is an InputError (the one plan validation, less the identity checks that
// need the graph's hash), never out-of-range access.
void Evaluator::check_shape(const Plan& plan) const {
  plan.validate_structure("plan");
  plan.validate_fit("plan", problem_.graph, problem_.cluster);
}

double Evaluator::placement_compute(const Plan& plan, Prediction& out) const {
  const Graph& graph = problem_.graph;
  fill_local_links(problem_.cluster, plan.mesh[0], links_);
  const double scale = batch_scale(graph, static_cast<double>(plan.per_replica_batch));
  const PlacementTimes times =
      schedule_placement(graph, order_, plan.assignment, links_, scale, placement_);
  gradient_ready_s_.resize(graph.nodes.size());
  for (size_t v = 0; v < graph.nodes.size(); ++v) {
    gradient_ready_s_[v] = times.forward_s + placement_.backward_finish_s[v];
  }
  out.transfer_s = times.transfer_s;
  out.bubble_s = 0;
  return times.forward_s + times.backward_s;
}

double Evaluator::pipeline_compute(const Plan& plan, Prediction& out) const {
  const Graph& graph = problem_.graph;
  const int64_t num_stages = plan.mp;
  const double microbatch = static_cast<double>(plan.per_replica_batch) /
                            static_cast<double>(plan.num_microbatches);
  const double scale = batch_scale(graph, microbatch);
  pipeline_stage_costs(graph, plan.assignment, num_stages, scale, stages_);
  p2p_s_.assign(stages_.boundary_bytes.size(), 0.0);
  for (size_t s = 0; s < p2p_s_.size(); ++s) {
    if (stages_.boundary_bytes[s] <= 0) continue;
    const Link link = problem_.cluster.link(plan.mesh[0][s], plan.mesh[0][s + 1]);
    p2p_s_[s] = link.latency_s + stages_.boundary_bytes[s] / link.bandwidth_bytes_per_s;
  }
  const PipelineTimes times = simulate_pipeline(plan.schedule, plan.num_microbatches,
                                                stages_.forward_s, stages_.backward_s, p2p_s_,
                                                pipeline_);
  // Gradients become final during each stage's last backward, in reverse topological order.
  stage_backward_s_.assign(num_stages, 0.0);
  gradient_ready_s_.resize(graph.nodes.size());
  for (NodeIndex v : reverse_topo_) {
    const int32_t s = plan.assignment[v];
    stage_backward_s_[s] += scaled_time_s(graph.nodes[v].backward_s, scale);
    gradient_ready_s_[v] = pipeline_.last_backward_start_s[s] + stage_backward_s_[s];
  }
  out.transfer_s = times.transfer_s;
  out.bubble_s = times.bubble_s;
  return times.compute_s;
}

double Evaluator::exposed_allreduce_s(const Plan& plan, double compute_s) const {
  if (plan.dp <= 1) return 0.0;
  const Graph& graph = problem_.graph;
  const Cluster& cluster = problem_.cluster;
  const int64_t groups = plan.mp;
  group_bytes_.assign(groups, 0.0);
  for (size_t v = 0; v < graph.nodes.size(); ++v) {
    group_bytes_[plan.assignment[v]] += static_cast<double>(graph.nodes[v].param_bytes);
  }
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
  for (int64_t k = 0; k < groups; ++k) {
    if (group_bytes_[k] <= 0 || !spans_nodes(k)) continue;
    for (const auto& row : plan.mesh) {
      const int64_t node = row[k] / cluster.devices_per_node;
      if (node_stamp_[node] != k) {
        node_stamp_[node] = k;
        ++groups_on_node_[node];
      }
    }
  }
  buckets_.resize(groups);
  for (int64_t k = 0; k < groups; ++k) {
    group_devices_.clear();
    int64_t concurrent = 1;
    for (const auto& row : plan.mesh) {
      group_devices_.push_back(row[k]);
      concurrent = std::max(concurrent, groups_on_node_[row[k] / cluster.devices_per_node]);
    }
    AllReduceCost cost{};
    if (group_bytes_[k] > 0) {
      // A group's cost depends only on its devices and sharing; search re-evaluates the same
      // mesh many times with other assignments, and grouping thousands of devices by node
      // dominated evaluate() at large dp.
      auto key = std::make_pair(group_devices_, concurrent);
      auto it = allreduce_cache_.find(key);
      if (it == allreduce_cache_.end()) {
        if (allreduce_cache_.size() > kAllReduceCacheEntries) allreduce_cache_.clear();
        it = allreduce_cache_.emplace(std::move(key), group_allreduce(cluster, group_devices_, concurrent)).first;
      }
      cost = it->second;
    }
    buckets_[k] = BucketedAllReduce(cost, bucket_cap_bytes);
  }
  // Feed gradients in the order they become ready on each device.
  const std::vector<NodeIndex>& ready_order =
      plan.mode == MpMode::kPipeline ? reverse_topo_ : order_.backward;
  for (NodeIndex v : ready_order) {
    buckets_[plan.assignment[v]].add_gradient(gradient_ready_s_[v],
                                              static_cast<double>(graph.nodes[v].param_bytes));
  }
  double end_s = 0;
  for (auto& bucketed : buckets_) end_s = std::max(end_s, bucketed.end_s());
  return std::max(0.0, end_s - compute_s);
}

void Evaluator::memory(const Plan& plan, Prediction& out) const {
  const Graph& graph = problem_.graph;
  const bool pipeline = plan.mode == MpMode::kPipeline;
  const double batch = pipeline ? static_cast<double>(plan.per_replica_batch) /
                                      static_cast<double>(plan.num_microbatches)
                                : static_cast<double>(plan.per_replica_batch);
  const double scale = batch_scale(graph, batch);
  activation_bytes_.assign(plan.mp, 0.0);
  param_bytes_.assign(plan.mp, 0);
  for (size_t v = 0; v < graph.nodes.size(); ++v) {
    activation_bytes_[plan.assignment[v]] += scaled_bytes(graph.nodes[v].output_bytes, scale);
    param_bytes_[plan.assignment[v]] += graph.nodes[v].param_bytes;
  }
  out.memory_bytes.resize(plan.mp);
  const int64_t have_bytes = problem_.cluster.device.memory_bytes;
  for (int64_t k = 0; k < plan.mp; ++k) {
    const int64_t in_flight =
        in_flight_microbatches(pipeline ? plan.schedule : Schedule::kNone, plan.num_microbatches,
                               plan.mp, k);
    out.memory_bytes[k] = device_memory_bytes(param_bytes_[k], activation_bytes_[k], in_flight,
                                              problem_.job.optimizer);
    if (out.feasible && out.memory_bytes[k] > have_bytes) {
      out.feasible = false;
      out.infeasible_reason =
          memory_infeasible_reason(plan.mode, k, plan.mesh[0][k], out.memory_bytes[k], have_bytes);
    }
  }
}

Prediction Evaluator::evaluate(const Plan& plan) const {
  check_shape(plan);
  Prediction out;
  out.compute_s = plan.mode == MpMode::kPipeline ? pipeline_compute(plan, out)
                                                 : placement_compute(plan, out);
  out.allreduce_s = exposed_allreduce_s(plan, out.compute_s);
  out.step_s = out.compute_s + out.allreduce_s;
  const auto global_batch = static_cast<double>(plan.dp * plan.per_replica_batch);
  // A graph of zero-time nodes has step_s = 0; report 0 rather than an infinite rate, which
  // JSON cannot carry.
  out.samples_per_s = out.step_s > 0 ? global_batch / out.step_s : 0.0;
  memory(plan, out);
  const Job& job = problem_.job;
  if (job.convergence.model != Convergence::Model::kNone) {
    out.epochs = epochs_to_target(job.convergence, global_batch);
    out.time_to_train_s = time_to_train_s(out.epochs, job.samples_per_epoch,
                                          plan.dp * plan.per_replica_batch, out.step_s);
  }
  return out;
}

Prediction evaluate(const Problem& problem, const Plan& plan) {
  return Evaluator(problem).evaluate(plan);
}

double objective(const Problem& problem, const Prediction& p) {
  if (!p.feasible) return std::numeric_limits<double>::infinity();
  if (problem.job.convergence.model != Convergence::Model::kNone) return p.time_to_train_s;
  return p.samples_per_s > 0 ? 1.0 / p.samples_per_s : 0.0;
}

}  // namespace hybridplan
