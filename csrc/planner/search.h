// search(problem, options): the top-K plans over dp x mp, both MP modes, micro-batch counts and
// device mappings, each with its evaluate() breakdown.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/plan.h"
#include "planner/problem.h"

namespace hybridplan {

struct SearchOptions {
  int64_t devices = 0;  // 0: the whole cluster
  int top_k = 5;
  bool placement = true;
  bool pipeline = true;
  int exact_placement_max_nodes = 10;  // above this, heuristic placement with a reported gap
  bool dp_only = false;                // only mp = 1 (the pure-DP baseline)
};

struct SearchResult {
  std::vector<Plan> plans;              // best first, plans[i].predicted filled
  int64_t candidates_evaluated = 0;
  std::vector<std::string> notes;       // e.g. "placement mp=4: heuristic, gap to lower bound 3.1%"
  std::vector<std::string> infeasible;  // why rejected candidates did not fit (for exit 3)
};

// Throws InfeasibleError (naming what does not fit and by how much) when no candidate fits.
SearchResult search(const Problem& problem, const SearchOptions& options);

}  // namespace hybridplan
