// hybridplan explain: a plan in words. With --graph it names the graph's nodes; with --graph
// and --cluster it also checks the plan against them, re-evaluates it and shows the cluster's
// memory and links.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/problem_options.h"
#include "planner/evaluate.h"
#include "planner/explain.h"

namespace hybridplan::cli {
namespace {

struct ExplainFlags {
  std::string plan_path;
  ProblemFlags problem;
};

void run_explain(const ExplainFlags& flags) {
  Plan plan = load_plan(flags.plan_path);
  if (flags.problem.graph_path.empty()) {
    std::cout << explain(plan);
    return;
  }
  if (flags.problem.cluster.empty()) {
    std::cout << explain(plan, load_graph(flags.problem.graph_path));
    return;
  }
  const Problem problem = load_problem(flags.problem);
  plan.validate(flags.plan_path, problem.graph, problem.cluster);
  plan.predicted = evaluate(problem, plan);
  std::cout << explain(problem, plan);
}

}  // namespace

void add_explain_command(CLI::App& app) {
  auto flags = std::make_shared<ExplainFlags>();
  CLI::App* cmd = app.add_subcommand("explain", "Describe a plan in words");
  cmd->add_option("plan", flags->plan_path, "Plan JSON")->required();
  add_problem_flags(*cmd, flags->problem, /*required=*/false);
  cmd->get_option("--cluster")->needs("--graph");
  cmd->get_option("--job")->needs("--cluster");
  cmd->callback([flags] { run_explain(*flags); });
}

}  // namespace hybridplan::cli
