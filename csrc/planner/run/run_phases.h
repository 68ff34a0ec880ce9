// Run phases: the plans over one training run, one per phase. The critical batch grows as training proceeds
// (McCandlish et al., https://arxiv.org/abs/1812.06162: the gradient noise scale rises as the
// loss falls), so the plan with the best time-to-accuracy early (small global batch, MP to keep
// steps fast) is not the best late (large batch, DP). This plans the run in phases.
//
// Formulation (dynamic programming over segments of progress):
//   progress [0, 1] cut into K equal segments k = [p_k, p_{k+1}] (a plan may change only at
//   their ends); candidates c = the best plan of every point of the search space (search() with
//   no top-k limit), each with its step_s and global batch B_c;
//   cost(k, c) = phase_epochs(B_c, p_k, p_{k+1}) * samples_per_epoch / B_c * step_c
//                (convergence.h: epochs_min ((p_{k+1} - p_k) + B_c * int 1/B_crit(p) dp))
//   best[0][c] = cost(0, c)
//   best[k][c] = cost(k, c) + min(best[k-1][c], min_c' best[k-1][c'] + switch_s)
//   answer     = min_c best[K-1][c]; consecutive segments of one plan form a phase.
// switch_s prices a change of plan: a checkpoint written and read back under the new layout
// plus a restart of the job (the reliability issue's checkpoints). The best single plan is
// min_c sum_k cost(k, c): the same objective as plan() without the last partial batch per epoch.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/documents/plan.h"
#include "planner/documents/problem.h"
#include "planner/searches/search.h"

namespace hybridplan {

struct RunPhasesOptions {
  int segments = 16;      // K
  double switch_s = -1;   // < 0: default_switch_s(problem)
};

struct RunPhase {
  double progress_start = 0;
  double progress_end = 0;
  Plan plan;
  double epochs = 0;   // of this phase
  double time_s = 0;   // training time of this phase (switches not included)
};

struct RunPhases {
  std::vector<RunPhase> phases;
  double time_s = 0;              // phases plus switches
  double switch_s = 0;            // the price of one switch used
  int64_t switches = 0;
  Plan best_single;               // the best plan for the whole run
  double best_single_time_s = 0;
  int64_t candidates = 0;
};

// An estimate of one plan switch: 30 s to restart the job plus writing and reading a
// checkpoint of the parameters and optimizer state at 1 GB/s.
double default_switch_s(const Problem& problem);

// Throws InputError unless the job has a critical_batch convergence model; InfeasibleError when
// no plan fits.
RunPhases plan_over_run(const Problem& problem, const SearchOptions& options,
                          const RunPhasesOptions& run_options);

Json run_phases_to_json(const RunPhases& run, const Problem& problem);

}  // namespace hybridplan
