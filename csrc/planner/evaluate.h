// evaluate(problem, plan): the full cost breakdown of any plan (from search, by hand, or from
// another tool). It never searches; search() ranks candidates by exactly this function.
#pragma once
#include "planner/plan.h"
#include "planner/problem.h"

namespace hybridplan {

// Returns the breakdown. An infeasible plan (memory) gets feasible=false and a reason; the
// ranking objective of an infeasible plan is +infinity.
Prediction evaluate(const Problem& problem, const Plan& plan);

// The objective search minimises: time_to_train_s with a convergence model, else 1/samples_per_s
// expressed as seconds per sample. +infinity when infeasible.
double objective(const Problem& problem, const Prediction& p);

}  // namespace hybridplan
