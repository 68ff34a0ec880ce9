#include "planner/run/run_phases.h"

#include <algorithm>
#include <limits>

#include "common/error.h"
#include "planner/costs/memory_cost.h"
#include "planner/run/convergence.h"

namespace hybridplan {
namespace {

constexpr double kRestartS = 30.0;
constexpr double kCheckpointBytesPerS = 1e9;

// Seconds to train progress [p0, p1] under `plan`.
double segment_s(const Problem& problem, const Plan& plan, double p0, double p1) {
  const auto batch = static_cast<double>(plan.global_batch);
  return phase_epochs(problem.job.convergence, batch, p0, p1) *
         static_cast<double>(problem.job.samples_per_epoch) / batch * plan.predicted.step_s;
}

}  // namespace

double default_switch_s(const Problem& problem) {
  double param_bytes = 0;
  for (const Node& n : problem.graph.nodes) param_bytes += static_cast<double>(n.param_bytes);
  // the checkpoint: parameters and the optimizer's state (an fp32 master copy with it under
  // mixed precision)
  const double state = param_bytes * (1 + optimizer_state(problem.job, problem.graph).copies());
  return kRestartS + 2 * state / kCheckpointBytesPerS;
}

RunPhases plan_over_run(const Problem& problem, const SearchOptions& options,
                          const RunPhasesOptions& run_options) {
  if (problem.job.convergence.model != Convergence::Model::kCriticalBatch) {
    throw_input_error("job", "convergence.model",
                      "must be critical_batch to plan over the run (the critical batch, or its "
                      "trajectory over training progress, decides each phase's plan)",
                      problem.job.convergence.model == Convergence::Model::kTable ? "table" : "none");
  }
  if (run_options.segments < 1) {
    throw_input_error("run schedule", "segments", "must be >= 1", std::to_string(run_options.segments));
  }
  SearchOptions all = options;
  all.top_k = std::numeric_limits<int>::max();
  const std::vector<Plan> candidates = search(problem, all).plans;
  const auto k_count = static_cast<size_t>(run_options.segments);
  const size_t c_count = candidates.size();
  RunPhases out;
  out.candidates = static_cast<int64_t>(c_count);
  out.switch_s = run_options.switch_s >= 0 ? run_options.switch_s : default_switch_s(problem);
  const auto progress = [&](size_t k) { return static_cast<double>(k) / static_cast<double>(k_count); };

  std::vector<std::vector<double>> cost(k_count, std::vector<double>(c_count));
  for (size_t k = 0; k < k_count; ++k)
    for (size_t c = 0; c < c_count; ++c) cost[k][c] = segment_s(problem, candidates[c], progress(k), progress(k + 1));

  std::vector<std::vector<double>> best(k_count, std::vector<double>(c_count));
  std::vector<std::vector<int64_t>> from(k_count, std::vector<int64_t>(c_count, -1));
  best[0] = cost[0];
  for (size_t k = 1; k < k_count; ++k) {
    const auto arg_min = static_cast<size_t>(std::min_element(best[k - 1].begin(), best[k - 1].end()) - best[k - 1].begin());
    for (size_t c = 0; c < c_count; ++c) {
      const double stay = best[k - 1][c];
      const double move = best[k - 1][arg_min] + out.switch_s;
      const bool switching = arg_min != c && move < stay;
      best[k][c] = cost[k][c] + (switching ? move : stay);
      from[k][c] = static_cast<int64_t>(switching ? arg_min : c);
    }
  }
  size_t c = static_cast<size_t>(std::min_element(best.back().begin(), best.back().end()) - best.back().begin());
  out.time_s = best.back()[c];
  std::vector<size_t> chosen(k_count);
  for (size_t k = k_count; k-- > 0;) {
    chosen[k] = c;
    if (k > 0) c = static_cast<size_t>(from[k][c]);
  }
  for (size_t k = 0; k < k_count; ++k) {
    const Plan& plan = candidates[chosen[k]];
    if (k == 0 || chosen[k] != chosen[k - 1]) {
      if (k > 0) ++out.switches;
      out.phases.push_back({progress(k), progress(k), plan, 0, 0});
    }
    RunPhase& phase = out.phases.back();
    phase.progress_end = progress(k + 1);
    phase.time_s += cost[k][chosen[k]];
    phase.epochs += phase_epochs(problem.job.convergence, static_cast<double>(plan.global_batch),
                                 progress(k), progress(k + 1));
  }
  double single = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < c_count; ++i) {
    double total = 0;
    for (size_t k = 0; k < k_count; ++k) total += cost[k][i];
    if (total < single) {
      single = total;
      out.best_single = candidates[i];
    }
  }
  out.best_single_time_s = single;
  return out;
}

Json run_phases_to_json(const RunPhases& run, const Problem& problem) {
  Json phases = Json::array();
  for (const RunPhase& p : run.phases) {
    phases.push_back({{"progress_start", p.progress_start}, {"progress_end", p.progress_end},
                      {"epochs", p.epochs}, {"time_s", p.time_s},
                      {"plan", plan_to_json(p.plan, problem.graph, problem.cluster)}});
  }
  return {{"phases", std::move(phases)}, {"time_s", run.time_s},
          {"switches", run.switches}, {"switch_s", run.switch_s},
          {"best_single_time_s", run.best_single_time_s},
          {"best_single", plan_to_json(run.best_single, problem.graph, problem.cluster)},
          {"gain_over_best_single", run.best_single_time_s / run.time_s - 1},
          {"candidates", run.candidates}};
}

}  // namespace hybridplan
