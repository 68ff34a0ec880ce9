// search: enumerate the search space (search_space), map each (dp, mp) onto devices
// (device_mapping.h), find the best assignment of every point (placement_search.h,
// pipeline_search.h) and rank the points by objective() of their evaluate() breakdown.
//
// Every point's plan is ranked by objective(problem, evaluate(plan)) and nothing else; the
// per-point searches minimise step_s, which for a fixed point (dp and batch fixed) orders plans
// exactly as the objective does (time to train = epochs(B) * ceil(samples / B) * step_s, or
// step_s / B seconds per sample).
#include "planner/searches/search.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <optional>
#include <queue>
#include <tuple>
#include <sstream>

#include "common/error.h"
#include "common/units.h"
#include "planner/costs/evaluate.h"
#include "planner/costs/tensor_parallel_cost.h"
#include "planner/run/convergence.h"
#include "planner/searches/device_mapping.h"
#include "planner/searches/pipeline_search.h"
#include "planner/searches/placement_search.h"

namespace hybridplan {
namespace {

const std::string kSource = "search options";

std::string str(int64_t v) { return std::to_string(v); }

std::string describe(const SearchSpacePoint& p) {
  std::ostringstream os;
  os << "dp=" << p.dp << " mp=" << p.mp;
  if (p.tp > 1) os << " tp=" << p.tp;
  if (p.sequence_parallel) os << " sp";
  os << " " << mode_name(p.mode);
  if (p.mode == MpMode::kPipeline)
    os << " (" << schedule_name(p.schedule) << ", " << p.num_microbatches << " micro-batches)";
  os << " b=" << p.per_replica_batch;
  if (p.accumulation_steps > 1) os << " K=" << p.accumulation_steps;
  return os.str();
}

std::vector<int64_t> microbatch_counts(const Job& job, int64_t batch) {
  std::vector<int64_t> out;
  if (!job.num_microbatches.empty()) {
    for (int64_t m : job.num_microbatches)
      if (m >= 1 && m <= batch && batch % m == 0) out.push_back(m);
    return out;
  }
  // Powers of two dividing the batch, and the batch itself: micro-batches of one sample
  // (Megatron-LM's setting) where the batch is not a power of two (144 = 9 * 16).
  for (int64_t m = 1; m <= batch; m *= 2)
    if (batch % m == 0) out.push_back(m);
  if (out.back() != batch) out.push_back(batch);
  return out;
}

}  // namespace

const char* sequence_parallel_search_name(SequenceParallelSearch s) {
  switch (s) {
    case SequenceParallelSearch::kAuto: return "auto";
    case SequenceParallelSearch::kOff: return "off";
    case SequenceParallelSearch::kOn: return "on";
  }
  return "auto";
}

std::optional<SequenceParallelSearch> sequence_parallel_search_from_name(const std::string& name) {
  for (SequenceParallelSearch s :
       {SequenceParallelSearch::kAuto, SequenceParallelSearch::kOff, SequenceParallelSearch::kOn}) {
    if (name == sequence_parallel_search_name(s)) return s;
  }
  return std::nullopt;
}

namespace {

// The tensor-parallel degrees of the search space, ascending (SearchOptions::tensor_degrees).
std::vector<int64_t> search_tensor_degrees(const Problem& problem, const SearchOptions& options) {
  const std::vector<int64_t> allowed = tp_degrees(problem.graph, problem.cluster);
  std::vector<int64_t> out = {1};
  if (options.tensor_degrees.empty()) {
    out.insert(out.end(), allowed.begin(), allowed.end());
    return out;
  }
  out.clear();
  for (int64_t t : options.tensor_degrees) {
    if (t != 1 && std::find(allowed.begin(), allowed.end(), t) == allowed.end()) {
      std::string rule = "must list 1 or degrees that divide devices_per_node = " +
                         str(problem.cluster.devices_per_node) +
                         " and the max_degree of at least one node with tensor_parallel";
      if (!problem.graph.has_tensor_parallel()) {
        rule += " (graph \"" + problem.graph.name + "\" has no node with tensor_parallel)";
      } else {
        std::string list;
        for (int64_t a : allowed) list += (list.empty() ? "" : ", ") + str(a);
        rule += " (here: " + (list.empty() ? std::string("none") : list) + ")";
      }
      throw_input_error(kSource, "tensor_degrees", rule, str(t));
    }
    out.push_back(t);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Per tensor-parallel degree of the space: the sequence-parallel settings its points take
// (SearchOptions::sequence_parallel; tp = 1: off). Throws InputError for kOn when no degree > 1
// allows it.
std::map<int64_t, std::vector<bool>> search_sequence_parallel(const Problem& problem,
                                                              const SearchOptions& options,
                                                              const std::vector<int64_t>& degrees) {
  std::map<int64_t, std::vector<bool>> out;
  bool any = false;
  std::string why;  // the first refusal, for kOn's message
  for (int64_t tp : degrees) {
    std::vector<bool>& settings = out[tp];
    const std::optional<std::string> refusal =
        tp > 1 ? sequence_parallel_refusal(problem.graph, tp) : std::optional<std::string>("tp = 1");
    if (tp > 1 && refusal && why.empty()) why = "tp = " + str(tp) + ": sequence_parallel " + *refusal;
    const bool allowed = !refusal && options.sequence_parallel != SequenceParallelSearch::kOff;
    any = any || allowed;
    if (!allowed) {
      if (tp == 1 || options.sequence_parallel != SequenceParallelSearch::kOn) settings = {false};
      continue;  // kOn: the degree is left out
    }
    if (options.sequence_parallel == SequenceParallelSearch::kAuto) settings.push_back(false);
    settings.push_back(true);
  }
  if (options.sequence_parallel == SequenceParallelSearch::kOn && !any && !options.dp_only) {
    throw_input_error(kSource, "sequence_parallel",
                      "must be \"auto\" or \"off\": no tensor-parallel degree of the space "
                      "allows sequence parallelism (" +
                          (why.empty() ? std::string("no degree > 1") : why) + ")",
                      "\"on\"");
  }
  return out;
}

// The most pipeline ranks (mp) of a pipeline spanning nodes the search considers. Megatron-LM's
// largest runs use 64 (Narayanan et al. 2021, arXiv 2104.04473: the trillion-parameter GPT on
// 3072 GPUs, tensor 8 x pipeline 64); beyond it, each point's partition (mp stages over the
// graph's nodes) and pipeline simulation grow with mp while the bubble grows too, and the
// search time on thousands of devices left its bound (bench/bench_search.cc).
constexpr int64_t kMaxSpanningStages = 64;

// Positions 1..n-1 of the topological order where a pipeline stage may begin.
int64_t allowed_stage_starts(const Graph& graph) {
  int64_t count = 0;
  for (size_t p = 1; p < graph.topo_order.size(); ++p) count += graph.nodes[graph.topo_order[p]].cut_before;
  return count;
}

// The devices the search plans for, after checking the options search_space reads.
int64_t searched_devices(const Cluster& cluster, const SearchOptions& options) {
  const int64_t devices = options.devices == 0 ? cluster.num_devices() : options.devices;
  if (devices < 1 || devices > cluster.num_devices()) {
    throw_input_error(kSource, "devices",
                      "must be in 1.." + str(cluster.num_devices()) + " (the devices of cluster \"" +
                          cluster.name + "\")",
                      str(options.devices));
  }
  if (options.top_k < 1) throw_input_error(kSource, "top_k", "must be >= 1", str(options.top_k));
  if (!options.placement && !options.pipeline && !options.dp_only) {
    throw_input_error(kSource, "placement/pipeline", "at least one MP mode must be enabled",
                      "both disabled");
  }
  return devices;
}

// Why a graph that can be cut into stages has no pipeline of mp stages (too few nodes, or too
// few places where a stage may begin).
std::string pipeline_refusal(int64_t mp, int64_t n, int64_t stage_starts) {
  if (n < mp) {
    return "needs at least " + str(mp) + " nodes for " + str(mp) + " stages (graph has " +
           str(n) + ")";
  }
  return "needs " + str(mp - 1) + " nodes where a stage may begin; the graph has " +
         str(stage_starts) + " (the others have cut_before false)";
}

// The pipeline points of `p` (dp, mp, tp and batch set): every micro-batch count of `counts`
// the model accepts, with every schedule of `schedules` the rules allow there (search_space's
// comment); `multi_ok`: the graph has the nodes and cuts for two stages per rank.
void add_pipeline_points(SearchSpacePoint p, const std::vector<int64_t>& counts, int64_t min_batch,
                         bool multi_ok, const std::vector<Schedule>& schedules,
                         const std::function<void(const SearchSpacePoint&)>& push) {
  p.mode = MpMode::kPipeline;
  for (int64_t m : counts) {
    if (p.per_replica_batch / m < min_batch) continue;  // micro-batches the model does not accept
    p.num_microbatches = m;
    for (Schedule s : schedules) {
      if (s == Schedule::kNone) continue;
      // torch.distributed.pipelining's Schedule1F1B (the Python executor's) refuses M < S.
      if (s == Schedule::k1F1B && m < p.mp) continue;
      const bool multi = schedule_is_multi_stage(s);
      if (multi && !multi_ok) continue;
      const int64_t rounds = std::max<int64_t>(1, m / p.mp);
      if (multi && s != Schedule::kZBV && m % rounds != 0) continue;  // torch's rounds
      p.schedule = s;
      p.virtual_stages = multi ? 2 : 1;
      push(p);
    }
  }
}

}  // namespace

int64_t next_accumulation_steps(const Problem& problem, int64_t replica_samples, int64_t after) {
  for (int64_t k : problem.job.accumulation_candidates()) {
    if (k <= after || replica_samples % k != 0) continue;
    if (replica_samples / k >= problem.graph.profiled.min_batch_size) return k;
  }
  return 0;
}

std::vector<SearchSpacePoint> search_space(const Problem& problem, const SearchOptions& options,
                                           std::vector<std::string>* skipped) {
  const Cluster& cluster = problem.cluster;
  const int64_t devices = searched_devices(cluster, options);
  const auto skip = [&](const std::string& why) {
    if (skipped) skipped->push_back(why);
  };
  const Graph& graph = problem.graph;
  const auto n = static_cast<int64_t>(graph.nodes.size());
  const int64_t stage_starts = allowed_stage_starts(graph);
  const bool serial_devices = cluster.device.type == "cpu";
  bool said_serial = false, said_split = false;
  const int64_t per_node = cluster.devices_per_node;
  // Pipelines spanning nodes: at most as many ranks as the graph has stages to give them and
  // kMaxSpanningStages (below); every larger mp is left out at once (one note).
  const int64_t spanning_max_mp = std::min({kMaxSpanningStages, n, stage_starts + 1});
  bool said_spanning = false;
  std::vector<SearchSpacePoint> points;
  const bool by_global = !problem.job.global_batches.empty();
  const BatchCandidates accumulation = problem.job.accumulation_candidates();
  const std::vector<int64_t> degrees = search_tensor_degrees(problem, options);
  const std::map<int64_t, std::vector<bool>> sp_settings =
      search_sequence_parallel(problem, options, degrees);
  for (const int64_t tp : degrees) {
    if (options.dp_only && tp > 1) break;
    const std::vector<bool>& settings = sp_settings.at(tp);
    if (settings.empty()) {
      skip("tp=" + str(tp) + ": left out with sequence parallelism on: sequence_parallel " +
           sequence_parallel_refusal(graph, tp).value_or(""));
      continue;
    }
    // every point of the degree, in each of its sequence-parallel settings (off first);
    // pipelines without (Plan::validate_structure: sequence parallelism is placement only)
    const auto push = [&](SearchSpacePoint p) {
      for (const bool sp : settings) {
        if (sp && p.mode == MpMode::kPipeline) continue;
        p.sequence_parallel = sp;
        points.push_back(p);
      }
    };
    for (int64_t mp = 1; mp * tp <= devices; ++mp) {
      // a replica's mp * tp devices: part of one node, or (a pipeline only) whole nodes
      const bool spans = mp * tp > per_node;
      if (devices % (mp * tp) != 0) continue;
      if (spans ? (mp * tp) % per_node != 0 : per_node % (mp * tp) != 0) continue;
      if (options.dp_only && mp > 1) break;
      if (spans && (!options.pipeline || !graph.pipeline_split.supported)) break;
      if (spans && mp > spanning_max_mp) {
        if (!said_spanning) {
          skip("pipelines spanning nodes: only mp <= " + str(spanning_max_mp) + " (" +
               str(kMaxSpanningStages) + " at most; the graph has " + str(n) + " nodes and " +
               str(stage_starts) + " places where a stage may begin)");
        }
        said_spanning = true;
        break;
      }
      const int64_t dp = devices / (mp * tp);
      const std::string head = "dp=" + str(dp) + " mp=" + str(mp) + (tp > 1 ? " tp=" + str(tp) : "");
      const std::vector<int64_t> batches = per_replica_batches_for(problem, dp);
      if (batches.empty()) {
        std::string globals;
        for (int64_t b : problem.job.global_batches) globals += (globals.empty() ? "" : ", ") + str(b);
        skip(head + ": no global batch of the job (" + globals + ") is divisible by dp=" + str(dp));
        continue;
      }
      const bool pipeline_ok = mp > 1 && options.pipeline && graph.pipeline_split.supported &&
                               n >= mp && stage_starts >= mp - 1;
      if (mp > 1 && options.pipeline && !pipeline_ok) {
        if (!graph.pipeline_split.supported) {
          if (!said_split) skip("pipeline: the model cannot be cut into stages: " + graph.pipeline_split.reason);
          said_split = true;
        } else {
          skip(head + " pipeline: " + pipeline_refusal(mp, n, stage_starts));
        }
      }
      if (mp > 1 && options.placement && serial_devices && !said_serial) {
        skip("placement mp>1: the cluster's devices are CPU ranks, and one process runs a "
             "replica's devices one after another: the same compute as mp=1 on fewer devices");
        said_serial = true;
      }
      // tensor parallelism splits a placement replica only on one device per rank (Plan
      // rules); one process drives a placement replica, inside one node
      const bool placement_ok = mp == 1 || (options.placement && !serial_devices && tp == 1 && !spans);
      // two stages per rank need twice the nodes and places to cut
      const bool multi_ok = n >= 2 * mp && stage_starts >= 2 * mp - 1;
      const int64_t min_batch = graph.profiled.min_batch_size;
      // (micro-step batch, accumulation steps) pairs: a global batch's first K (search()
      // tries the next where memory binds), else every K with the batch as it is
      std::vector<std::pair<int64_t, int64_t>> steps;
      for (int64_t replica : batches) {
        if (by_global && !problem.job.accumulation_steps.empty()) {  // each listed K
          for (int64_t k : accumulation) {
            if (replica % k == 0 && replica / k >= min_batch) steps.emplace_back(replica / k, k);
          }
          if (steps.empty() || steps.back().first * steps.back().second != replica) {
            skip(head + " global batch " + str(replica * dp) + ": no accumulation_steps of the "
                 "job divides the " + str(replica) + " samples per replica into batches the "
                 "model accepts");
          }
        } else if (by_global) {
          const int64_t k = next_accumulation_steps(problem, replica, 0);
          if (k == 0 && replica >= min_batch) {
            skip(head + " global batch " + str(replica * dp) + ": no accumulation_steps of the "
                 "job divides the " + str(replica) + " samples per replica");
            continue;
          }
          steps.emplace_back(k > 0 ? replica / k : replica, std::max<int64_t>(k, 1));
        } else {
          for (int64_t k : accumulation) steps.emplace_back(replica, k);
        }
      }
      for (const auto& [batch, k] : steps) {
        if (batch < min_batch) {
          skip(head + " b=" + str(batch) + ": below the smallest batch the model accepts "
               "(graph profiled.min_batch_size = " + str(min_batch) + ")");
          continue;
        }
        const SearchSpacePoint p{.dp = dp, .mp = mp, .tp = tp, .per_replica_batch = batch,
                                 .accumulation_steps = k};
        if (placement_ok) push(p);
        if (!pipeline_ok) continue;
        const auto counts = microbatch_counts(problem.job, batch);
        if (counts.empty()) {
          skip(head + " pipeline: no micro-batch count divides the per-replica batch " + str(batch));
        }
        add_pipeline_points(p, counts, min_batch, multi_ok, options.schedules, push);
      }
    }
  }
  return points;
}

namespace {

Plan skeleton_with_mapping(const Problem& problem, const SearchSpacePoint& point,
                           const std::string& graph_sha256, const DeviceMapping& mapping) {
  Plan plan;
  plan.graph_name = problem.graph.name;
  plan.graph_sha256 = graph_sha256;
  plan.precision = problem.job.precision;  // the job's, which evaluate() prices
  plan.cluster_name = problem.cluster.name;
  plan.cluster_num_nodes = problem.cluster.num_nodes;
  plan.cluster_devices_per_node = problem.cluster.devices_per_node;
  plan.world_size = point.dp * point.mp * point.tp;
  plan.dp = point.dp;
  plan.mp = point.mp;
  plan.tp = point.tp;
  plan.sequence_parallel = point.sequence_parallel;
  plan.mode = point.mode;
  plan.schedule = point.schedule;
  plan.virtual_stages = point.virtual_stages;
  plan.num_microbatches = point.num_microbatches;
  plan.per_replica_batch = point.per_replica_batch;
  plan.accumulation_steps = point.accumulation_steps;
  plan.compile = problem.job.compile;
  plan.global_batch = point.dp * point.per_replica_batch * point.accumulation_steps;
  plan.mesh = mapping.mesh;
  plan.device_mapping_note = mapping.note;
  plan.assignment.assign(problem.graph.nodes.size(), 0);
  return plan;
}

}  // namespace

Plan plan_skeleton(const Problem& problem, const SearchSpacePoint& point,
                   const std::string& graph_sha256) {
  return skeleton_with_mapping(problem, point, graph_sha256,
                               map_devices(problem.cluster, point.dp, point.mp, point.tp));
}

// The bound per compute kind (search.h): the pipeline's (its fill and drain included), the
// serial replica's whole compute, or the placement bound (critical path, work per device).
double step_lower_bound_s(const Evaluator& evaluator, const Plan& plan) {
  const Cluster& cluster = evaluator.problem().cluster;
  const double slowdown = evaluator.compute_slowdown(plan);
  double compute_s = 0;
  if (plan.mode == MpMode::kPipeline) {
    const auto m = static_cast<double>(plan.num_microbatches);
    const double micro = static_cast<double>(plan.per_replica_batch) / m;
    const double action_s = cluster.runtime.action_cost_s(schedule_name(plan.schedule), micro);
    const bool eager = blocks_run_eager(plan);  // priced as evaluate() prices it
    const double work_s =
        evaluator.node_times(micro, slowdown, plan.tp, plan.sequence_parallel, eager).total_s();
    compute_s = work_s * m / static_cast<double>(plan.mp) + 2 * m * action_s;
    // The fill and drain no split avoids. Each stage runs its passes one at a time, each kind
    // in micro-batch order: stage s's first forward waits for the forwards of the first
    // micro-batch on every stage before it, and (unless its backward is split, leaving a
    // weight pass to run late) its last backward is followed by theirs for the last one. So
    // the step is at least max_s (M c_s + f sum_{j<s} c_j), c_s = F_s + B_s with their
    // actions, f = 1, or f = the least share of a node's forward in its time (at most 1/2,
    // the actions' share) with the backward split: only the forwards wait. Over any c_s >= 0
    // summing to W = work + 2 S action_s that maximum is least when all its terms are equal:
    //   f W / (1 - (1 - f/M)^S)   (S stages; M W / S as f -> 0 or S = 1)
    // Stage times that shrink while other ranks wait (Evaluator rescale_for_waiting_ranks)
    // have no such bound.
    if (cluster.runtime.shared_host_slowdown.empty()) {
      const NodeTimes& times =
          evaluator.node_times(micro, slowdown, plan.tp, plan.sequence_parallel, eager);
      double fill = 1;
      if (schedule_splits_backward(plan.schedule)) {
        fill = 0.5;
        for (size_t v = 0; v < times.forward_s.size(); ++v) {
          const double node_s = times.forward_s[v] + times.backward_s[v];
          if (node_s > 0) fill = std::min(fill, times.forward_s[v] / node_s);
        }
      }
      const auto stages = static_cast<double>(plan.num_stages());
      const double total_s = work_s + 2 * stages * action_s;
      if (fill > 0) {
        const double filled = 1 - std::pow(1 - fill / m, stages);
        // a margin of rounding, so that a plan equal to its bound is never left out
        compute_s = std::max(compute_s, fill * total_s / filled * (1 - 1e-9));
      }
    }
  } else if (evaluator.serial_replica_devices()) {
    compute_s = evaluator
                    .node_times(static_cast<double>(plan.per_replica_batch), slowdown, plan.tp,
                                plan.sequence_parallel)
                    .total_s();
  } else {
    compute_s = placement_lower_bound_s(evaluator, plan);
  }
  return static_cast<double>(plan.accumulation_steps) * compute_s +
         cluster.runtime.step_overhead_s(plan.dp);
}

namespace {

// objective() of a plan of `point` whose step takes `step_s` (monotone in step_s).
double objective_of_step(const Problem& problem, const Plan& plan, double step_s) {
  Prediction p;
  p.step_s = step_s;
  const int64_t global_batch = plan.global_batch;
  p.samples_per_s = step_s > 0 ? static_cast<double>(global_batch) / step_s : 0.0;
  if (problem.job.convergence.model != Convergence::Model::kNone) {
    p.epochs = epochs_to_target(problem.job.convergence, static_cast<double>(global_batch));
    p.time_to_train_s = time_to_train_s(p.epochs, problem.job.samples_per_epoch, global_batch, step_s);
  }
  return objective(problem, p);
}

// A plan that does not fit in memory recomputes where memory binds: every node on a device
// (placement) or stage (pipeline) over the device's memory, closed under the plan rules (the
// calls of one module together; whole pipeline stages). Returns the number of nodes recomputed
// when the plan then fits (its prediction updated), else 0 (the plan unchanged).
// The calls of one module, grouped (module_of_call), in module-name order: what recompute_to_fit
// closes its choice under, found once per search.
std::vector<std::vector<size_t>> module_call_groups(const Graph& graph) {
  std::map<std::string, std::vector<size_t>> calls;
  for (size_t v = 0; v < graph.nodes.size(); ++v) calls[module_of_call(graph.nodes[v].name)].push_back(v);
  std::vector<std::vector<size_t>> groups;
  for (auto& [module, group] : calls) groups.push_back(std::move(group));
  return groups;
}

int64_t recompute_to_fit(const Evaluator& evaluator, const std::vector<std::vector<size_t>>& module_groups,
                         Plan& plan) {
  const Graph& graph = evaluator.problem().graph;
  const int64_t have = evaluator.problem().cluster.device.memory_bytes;
  const size_t n = graph.nodes.size();
  std::vector<uint8_t> flags(n, 0);
  for (size_t v = 0; v < n; ++v) {
    flags[v] = plan.predicted.memory_bytes[plan.device_of(plan.assignment[v])] > have ? 1 : 0;
  }
  // the groups that recompute together: the calls of one module; a pipeline's stages (each
  // closure below grows to its one fixed point, whatever the order of the groups)
  std::vector<std::vector<size_t>> stages;
  if (plan.mode == MpMode::kPipeline) {
    stages.resize(plan.num_stages());
    for (size_t v = 0; v < n; ++v) stages[plan.assignment[v]].push_back(v);
  }
  const std::vector<std::vector<size_t>>* kinds_of_group[] = {&module_groups, &stages};
  for (bool changed = true; changed;) {  // to a fixed point: a module's calls span stages
    changed = false;
    for (const auto* groups : kinds_of_group) {
      for (const auto& group : *groups) {
        if (std::none_of(group.begin(), group.end(), [&](size_t v) { return flags[v]; })) continue;
        for (size_t v : group) {
          if (!flags[v]) flags[v] = 1, changed = true;
        }
      }
    }
  }
  const auto count = static_cast<int64_t>(std::count(flags.begin(), flags.end(), 1));
  if (count == 0) return 0;
  // Selective first (it runs less again) where the profiler measured it, fully elsewhere; a
  // group recomputes alike, so one node without the measurement makes its whole group full,
  // and with it (a node in a module's group and a stage's) the other groups it joins, to a
  // fixed point; then every group fully.
  std::vector<uint8_t> selective = flags;
  for (size_t v = 0; v < n; ++v) {
    if (selective[v] && graph.nodes[v].has_selective()) selective[v] = kRecomputeSelective;
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto* groups : kinds_of_group) {
      for (const auto& group : *groups) {
        if (std::none_of(group.begin(), group.end(),
                         [&](size_t v) { return selective[v] == kRecomputeFull; })) {
          continue;
        }
        for (size_t v : group) {
          if (selective[v] == kRecomputeSelective) selective[v] = kRecomputeFull, changed = true;
        }
      }
    }
  }
  for (const std::vector<uint8_t>* kinds : {&selective, &flags}) {
    Plan candidate = plan;
    candidate.recompute = *kinds;
    candidate.predicted = evaluator.evaluate(candidate);
    if (candidate.predicted.feasible) {
      plan = std::move(candidate);
      return count;
    }
    if (kinds == &selective && selective == flags) break;  // nothing selective to try apart
  }
  return 0;
}

// A pipeline point of the accumulation chain (search_space's comment) at its new, smaller
// per-replica batch: its micro-batch count M kept where the batch still splits into M
// micro-batches the model accepts, else its micro-batch size kept (fewer micro-batches: the
// receive buffers, one per micro-batch, shrink with them); false when neither satisfies
// torch's schedules (1F1B: M >= mp; the interleaved ones: M a multiple of their rounds).
bool accumulated_microbatches(SearchSpacePoint& point, int64_t micro, int64_t min_batch) {
  const int64_t b = point.per_replica_batch;
  int64_t m = point.num_microbatches;
  if (b % m != 0 || b / m < min_batch) {
    if (b % micro != 0) return false;
    m = b / micro;
  }
  if (m < 1 || b % m != 0 || b / m < min_batch) return false;
  if (point.schedule == Schedule::k1F1B && m < point.mp) return false;
  if (schedule_is_multi_stage(point.schedule) && point.schedule != Schedule::kZBV &&
      m % std::max<int64_t>(1, m / point.mp) != 0) {
    return false;
  }
  point.num_microbatches = m;
  return true;
}

}  // namespace

std::optional<SearchSpacePoint> next_accumulation_point(const Problem& problem,
                                                        const SearchSpacePoint& point);

namespace {

// Whether `plan` (of `point`, found not to fit) fits at the last accumulation step count the
// chain reaches from it (next_accumulation_point), its assignment, sharding and recompute kept.
bool fits_at_last_accumulation(const Evaluator& evaluator, const SearchSpacePoint& point,
                               const Plan& plan) {
  SearchSpacePoint last = point;
  while (const std::optional<SearchSpacePoint> next =
             next_accumulation_point(evaluator.problem(), last)) {
    last = *next;
  }
  Plan trial = plan;
  trial.accumulation_steps = last.accumulation_steps;
  trial.per_replica_batch = last.per_replica_batch;
  trial.num_microbatches = last.num_microbatches;
  trial.global_batch = last.dp * last.per_replica_batch * last.accumulation_steps;
  return evaluator.evaluate(trial).feasible;
}

}  // namespace

std::optional<SearchSpacePoint> next_accumulation_point(const Problem& problem,
                                                        const SearchSpacePoint& point) {
  // listed steps are points of their own (search_space)
  if (problem.job.global_batches.empty() || !problem.job.accumulation_steps.empty()) {
    return std::nullopt;
  }
  const int64_t replica = point.per_replica_batch * point.accumulation_steps;
  const int64_t k = next_accumulation_steps(problem, replica, point.accumulation_steps);
  if (k == 0) return std::nullopt;
  SearchSpacePoint next = point;
  next.accumulation_steps = k;
  next.per_replica_batch = replica / k;
  if (point.mode == MpMode::kPipeline &&
      !accumulated_microbatches(next, point.per_replica_batch / point.num_microbatches,
                                problem.graph.profiled.min_batch_size)) {
    return std::nullopt;
  }
  return next;
}

std::vector<int64_t> shard_degrees(const Plan& plan, const Cluster& cluster) {
  std::vector<int64_t> out = {0};  // the whole data-parallel group
  const int64_t per_node = cluster.devices_per_node / std::max<int64_t>(1, plan.mp * plan.tp);
  if (per_node >= 2 && per_node < plan.dp && plan.dp % per_node == 0) out.push_back(per_node);
  return out;
}

namespace {

bool sharding_allowed(const Plan& plan, const std::vector<Sharding>& allowed, Sharding kind) {
  if (std::find(allowed.begin(), allowed.end(), kind) == allowed.end()) return false;
  if (kind == Sharding::kNone) return true;
  if (plan.dp < 2) return false;
  if (plan.mode == MpMode::kPlacement) return plan.mp == 1;
  if (plan.tp > 1) return false;  // a pipeline with tensor parallelism does not shard
  return kind == Sharding::kZero2;
}

// The (sharding kind, shard degree) pairs a pipeline point is split for (search()): unsharded
// and zero2 at each shard degree where allowed; unsharded where nothing is.
std::vector<std::pair<Sharding, int64_t>> pipeline_shardings(const Plan& plan,
                                                             const std::vector<Sharding>& allowed,
                                                             const Cluster& cluster) {
  std::vector<std::pair<Sharding, int64_t>> kinds;
  for (Sharding kind : {Sharding::kNone, Sharding::kZero2}) {
    if (!sharding_allowed(plan, allowed, kind)) continue;
    if (kind == Sharding::kNone) kinds.emplace_back(kind, 0);
    else for (int64_t degree : shard_degrees(plan, cluster)) kinds.emplace_back(kind, degree);
  }
  if (kinds.empty()) kinds.emplace_back(Sharding::kNone, 0);  // none excluded, none other allowed
  return kinds;
}

// Evaluates `plan` with every sharding kind of `allowed` its shape permits (Plan::
// validate_structure's rules), each at every shard degree (shard_degrees), and keeps the best.
// Returns the evaluations.
int64_t choose_sharding(const Evaluator& evaluator, const std::vector<Sharding>& allowed,
                        Plan& plan) {
  int64_t evaluations = 0;
  bool have = sharding_allowed(plan, allowed, plan.sharding);  // else any allowed kind wins
  const std::vector<int64_t> degrees = shard_degrees(plan, evaluator.problem().cluster);
  for (Sharding kind : {Sharding::kNone, Sharding::kZero2, Sharding::kZero3}) {
    if (!sharding_allowed(plan, allowed, kind)) continue;
    for (int64_t degree : kind == Sharding::kNone ? std::vector<int64_t>{0} : degrees) {
      if (kind == plan.sharding && degree == plan.dp_shard) continue;
      Plan candidate = plan;
      candidate.sharding = kind;
      candidate.dp_shard = degree;
      candidate.predicted = evaluator.evaluate(candidate);
      ++evaluations;
      if (!have || better_prediction(candidate.predicted, plan.predicted)) {
        plan = std::move(candidate);
        have = true;
      }
    }
  }
  return evaluations;
}

// A point as a key (search()'s priced points of more accumulation steps).
using PointKey = std::tuple<int64_t, int64_t, int64_t, bool, MpMode, Schedule, int64_t, int64_t,
                            int64_t, int64_t>;
PointKey point_key(const SearchSpacePoint& p) {
  return {p.dp, p.mp, p.tp, p.sequence_parallel, p.mode, p.schedule, p.virtual_stages,
          p.num_microbatches, p.per_replica_batch, p.accumulation_steps};
}

// What pricing a point gave search(): its best plan (recomputing where that alone fits) and the
// notes it left.
struct PricedPoint {
  Plan plan;
  bool recomputed = false;    // fits only with recompute_to_fit's recompute
  bool reaches_last = false;  // found not to fit, and fits_at_last_accumulation
  std::vector<std::string> placement_notes;
  std::vector<std::string> pipeline_notes;  // each sharding kind's split note, in order
};

// The best plan of `point` (out.plan: its skeleton on entry): the placement or pipeline search,
// each sharding kind, then recompute where memory binds. Adds its evaluations to `evaluations`.
void price_point(const Evaluator& evaluator, const SearchOptions& options,
                 const SearchSpacePoint& point, const PlacementSearchOptions& placement_options,
                 PipelinePartitionCache& partitions,
                 std::vector<std::vector<size_t>>& module_groups, PricedPoint& out,
                 int64_t& evaluations) {
  const Problem& problem = evaluator.problem();
  Plan& plan = out.plan;
  if (point.mode == MpMode::kPlacement) {
    PlacementOutcome o = search_placement(evaluator, plan, placement_options);
    evaluations += o.evaluations;
    if (point.mp > 1) {  // (tp = 1: placement with tp > 1 has mp = 1)
      out.placement_notes.push_back("dp=" + str(point.dp) + " mp=" + str(point.mp) + " b=" +
                                    str(point.per_replica_batch) + " placement: " + o.note);
    }
    plan.assignment = std::move(o.assignment);
    plan.predicted = std::move(o.predicted);
  } else {
    // The stages are split for each sharding kind the point allows (a sharded stage holds
    // less, so another split may fit or win); the best split of the best kind stands.
    std::optional<Plan> best;
    for (const auto& [kind, degree] : pipeline_shardings(plan, options.shardings, problem.cluster)) {
      Plan trial = plan;
      trial.sharding = kind;
      trial.dp_shard = degree;
      PipelineOutcome o =
          search_pipeline(evaluator, trial, options.exact_placement_max_nodes, &partitions);
      evaluations += o.evaluations;
      out.pipeline_notes.push_back(o.note);
      trial.assignment = std::move(o.assignment);
      trial.recompute = std::move(o.recompute);
      trial.predicted = std::move(o.predicted);
      if (!best || better_prediction(trial.predicted, best->predicted)) best = std::move(trial);
    }
    plan = std::move(*best);
  }
  if (point.mode == MpMode::kPlacement) evaluations += choose_sharding(evaluator, options.shardings, plan);
  if (!plan.predicted.feasible && module_groups.empty()) module_groups = module_call_groups(problem.graph);
  if (!plan.predicted.feasible && recompute_to_fit(evaluator, module_groups, plan) > 0) {
    out.recomputed = true;
  }
}

}  // namespace

SearchResult search(const Problem& problem, const SearchOptions& options) {
  SearchResult result;
  const std::vector<SearchSpacePoint> points = search_space(problem, options, &result.infeasible);
  const Evaluator evaluator(problem);
  // the graph's hash goes on the plans returned, hashed once at the end (it takes longer than
  // many evaluations of a large graph, and nothing the search evaluates reads it)
  const std::string sha;
  PlacementSearchOptions placement_options;
  placement_options.exact_max_nodes = options.exact_placement_max_nodes;

  // Device mappings depend on (dp, mp, tp) only.
  std::map<std::tuple<int64_t, int64_t, int64_t>, DeviceMapping> mappings;
  std::vector<Plan> skeletons;
  std::vector<std::pair<double, size_t>> by_bound;  // (objective lower bound, point index)
  for (size_t i = 0; i < points.size(); ++i) {
    const SearchSpacePoint& point = points[i];
    auto key = std::make_tuple(point.dp, point.mp, point.tp);
    auto it = mappings.find(key);
    if (it == mappings.end())
      it = mappings.emplace(key, map_devices(problem.cluster, point.dp, point.mp, point.tp)).first;
    skeletons.push_back(skeleton_with_mapping(problem, point, sha, it->second));
    by_bound.emplace_back(
        objective_of_step(problem, skeletons.back(), step_lower_bound_s(evaluator, skeletons.back())), i);
  }
  // Branch and bound over the points: most promising first; a point whose lower bound exceeds
  // the top_k-th best objective found cannot enter the result and is not searched.
  std::stable_sort(by_bound.begin(), by_bound.end());
  std::vector<std::tuple<double, size_t, Plan>> ranked;  // (objective, point index, plan)
  std::priority_queue<double> best_k;                     // the top_k smallest objectives
  int64_t pruned = 0;
  int64_t recomputed = 0;  // points that fit only with recompute
  int64_t sharded = 0;     // points whose best plan shards data parallelism
  std::optional<std::pair<int64_t, std::string>> least_memory;  // (peak bytes, point)
  std::map<std::string, std::string> pipeline_notes;
  PipelinePartitionCache partitions;
  std::vector<std::vector<size_t>> module_groups;  // recompute_to_fit's, on first need
  int64_t accumulated = 0;  // plans with more accumulation steps than their point's first
  // Best-first over the points: the search space's, and (search_space's comment) a global
  // batch's point again in more accumulation steps where memory binds, queued with its own
  // bound, so that it is searched only while that bound can still enter the top k.
  using Entry = std::pair<double, size_t>;  // (objective lower bound, ranking index)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> queue(by_bound.begin(),
                                                                            by_bound.end());
  std::vector<SearchSpacePoint> derived;  // ranking index points.size() + i
  // A point of more accumulation steps is reached again by other chains (b halved with M kept
  // from one point, with the micro-batch size kept from another): it is priced once, and its
  // outcome stands for every arrival (ranked once: ranked_points).
  std::map<PointKey, PricedPoint> priced_derived;
  std::set<PointKey> ranked_points;  // every point ranked (or found not to fit) so far
  const auto queue_point = [&](const SearchSpacePoint& next) {
    const Plan skeleton =
        skeleton_with_mapping(problem, next, sha, mappings.at({next.dp, next.mp, next.tp}));
    queue.emplace(objective_of_step(problem, skeleton, step_lower_bound_s(evaluator, skeleton)),
                  points.size() + derived.size());
    derived.push_back(next);
  };
  while (!queue.empty()) {
    const auto [bound, index] = queue.top();
    queue.pop();
    if (!options.exhaustive && static_cast<int>(best_k.size()) == options.top_k &&
        bound > best_k.top()) {
      ++pruned;
      continue;
    }
    const bool first = index < points.size();
    const SearchSpacePoint point = first ? points[index] : derived[index - points.size()];
    const std::optional<SearchSpacePoint> next = next_accumulation_point(problem, point);
    PricedPoint fresh;
    const PricedPoint* outcome = nullptr;
    if (!first && !options.exhaustive) {
      const auto seen = priced_derived.find(point_key(point));
      if (seen != priced_derived.end()) outcome = &seen->second;
    }
    if (!outcome) {
      fresh.plan = first ? std::move(skeletons[index])
                         : skeleton_with_mapping(problem, point, sha,
                                                 mappings.at({point.dp, point.mp, point.tp}));
      price_point(evaluator, options, point, placement_options, partitions, module_groups, fresh,
                  result.candidates_evaluated);
      // The same global batch in more micro-steps of fewer samples, unless the plan found does
      // not fit at the job's last step count either (its smallest micro-step: what is over is
      // the parameter state, which no step count shrinks).
      fresh.reaches_last = !fresh.plan.predicted.feasible && next &&
                           fits_at_last_accumulation(evaluator, point, fresh.plan);
      outcome = first || options.exhaustive
                    ? &fresh
                    : &priced_derived.emplace(point_key(point), std::move(fresh)).first->second;
    }
    // A point reached again (by another chain of accumulation steps) was ranked, and its next
    // step count queued, on its first arrival: ranking it again would list one plan twice.
    if (!ranked_points.insert(point_key(point)).second) continue;
    const std::string head = "dp=" + str(point.dp) + " mp=" + str(point.mp) +
                             (point.tp > 1 ? " tp=" + str(point.tp) : "") +
                             (point.sequence_parallel ? " sp" : "") + " " + mode_name(point.mode);
    for (const std::string& note : outcome->placement_notes) result.notes.push_back(note);
    for (const std::string& o_note : outcome->pipeline_notes) {
      // one note per (dp, mp, tp): a split found where any M or schedule has one
      const auto [note, fresh_note] = pipeline_notes.emplace(head, o_note);
      if (!fresh_note && note->second.rfind("no split fits", 0) == 0) note->second = o_note;
    }
    Plan plan;
    if (outcome == &fresh) plan = std::move(fresh.plan);
    else plan = outcome->plan;
    if (plan.sharding != Sharding::kNone) ++sharded;
    if (outcome->recomputed) ++recomputed;
    if (!plan.predicted.feasible) {
      const int64_t peak = peak_memory_bytes(plan.predicted);
      if (!least_memory || peak < least_memory->first) least_memory.emplace(peak, describe(point));
      result.infeasible.push_back(describe(point) + ": " + plan.predicted.infeasible_reason);
    } else {
      const double obj = objective(problem, plan.predicted);
      best_k.push(obj);
      if (static_cast<int>(best_k.size()) > options.top_k) best_k.pop();
      if (!first) ++accumulated;
      ranked.emplace_back(obj, index, std::move(plan));
      continue;
    }
    if (outcome->reaches_last) queue_point(*next);
  }
  if (pruned > 0) {
    result.notes.push_back(std::to_string(pruned) + " of " +
                           std::to_string(points.size() + derived.size()) +
                           " points not searched: a lower bound on their objective (compute "
                           "bound + fixed overhead) exceeds the top " +
                           std::to_string(options.top_k) + " found");
  }
  for (const auto& [head, note] : pipeline_notes) result.notes.push_back(head + ": " + note);
  if (sharded > 0) {
    result.notes.push_back(std::to_string(sharded) +
                           " points are best sharded (zero2/zero3: gradients, optimizer state and "
                           "for zero3 parameters over the data-parallel group)");
  }
  if (accumulated > 0) {
    result.notes.push_back(std::to_string(accumulated) +
                           " plans run their global batch in more gradient accumulation steps "
                           "than their point's first, at which no plan fits in memory (sharded "
                           "or recomputing)");
  }
  if (recomputed > 0) {
    result.notes.push_back(std::to_string(recomputed) +
                           " points fit in memory only with recompute: every node of the "
                           "devices or stages over memory recomputes its forward in backward "
                           "(selectively where that fits: its matrix products, convolutions "
                           "and attention kept)");
  }

  if (ranked.empty()) {
    std::ostringstream os;
    const int64_t devices = options.devices == 0 ? problem.cluster.num_devices() : options.devices;
    os << "no plan fits on " << devices << " devices of cluster \"" << problem.cluster.name << "\"";
    if (least_memory) {
      const int64_t have = problem.cluster.device.memory_bytes;
      os << ": smallest per-device memory need is " << format_bytes(least_memory->first) << " at "
         << least_memory->second << ", device has " << format_bytes(have) << " (over by "
         << format_bytes(least_memory->first - have) << ")";
    } else {
      os << ":";
      for (const std::string& why : result.infeasible) os << " " << why << ";";
    }
    throw InfeasibleError(os.str());
  }
  // Best first; ties keep search-space order (smaller mp first), so results are deterministic.
  std::sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
  });
  for (size_t i = 0; i < ranked.size() && static_cast<int>(i) < options.top_k; ++i)
    result.plans.push_back(std::move(std::get<2>(ranked[i])));
  if (!result.plans.empty()) {
    const std::string hash = graph_sha256(problem.graph);
    for (Plan& plan : result.plans) plan.graph_sha256 = hash;
  }
  return result;
}

}  // namespace hybridplan
