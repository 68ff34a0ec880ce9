// hybridplan evaluate: the cost breakdown of any plan file (from `plan --out`, by hand, or
// from another tool). It never searches.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/plan_table.h"
#include "cli/problem_options.h"
#include "common/error.h"
#include "planner/costs/evaluate.h"

namespace hybridplan::cli {
namespace {

struct EvaluateFlags {
  ProblemFlags problem;
  std::string plan_path;
  bool json = false;
};

void run_evaluate(const EvaluateFlags& flags) {
  const Problem problem = load_problem(flags.problem);
  // Hand-written plans may list nodes in any order; this reorders by node id and validates.
  Plan plan = load_plan(flags.plan_path, problem.graph, problem.cluster);
  plan.predicted = evaluate(problem, plan);
  if (flags.json) {
    std::cout << plan_to_json(plan, problem.graph, problem.cluster).dump(2) << "\n";
  } else {
    print_breakdown(std::cout, problem, plan);
  }
  if (!plan.predicted.feasible) {
    throw InfeasibleError(flags.plan_path + ": " + plan.predicted.infeasible_reason);
  }
}

}  // namespace

void add_evaluate_command(CLI::App& app) {
  auto flags = std::make_shared<EvaluateFlags>();
  CLI::App* cmd = app.add_subcommand("evaluate", "Cost breakdown of a plan (exit 3 if it does not fit)");
  add_problem_flags(*cmd, flags->problem);
  cmd->add_option("--plan,-p", flags->plan_path, "Plan JSON")->required();
  cmd->add_flag("--json", flags->json, "Print the plan with its fresh prediction as JSON");
  cmd->callback([flags] { run_evaluate(*flags); });
}

}  // namespace hybridplan::cli
