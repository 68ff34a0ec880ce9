// Human-readable output of plans: the ranked table of `plan` and the breakdown of `evaluate`.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "planner/documents/plan.h"
#include "planner/documents/problem.h"

namespace hybridplan::cli {

// One row per plan, best first: rank, dp, mp, mode, schedule, M (micro-batches), global batch,
// step, compute, exposed all-reduce, bubble, max memory per device, epochs, and time-to-train
// (with a convergence model) or samples/s (without).
void print_plan_table(std::ostream& os, const Problem& problem, const std::vector<Plan>& plans);

// Every term of one plan's prediction, with the memory limit it is checked against.
void print_breakdown(std::ostream& os, const Problem& problem, const Plan& plan);

// "dp=8 x mp=4 pipeline 1f1b M=8"
std::string plan_shape(const Plan& plan);

}  // namespace hybridplan::cli
