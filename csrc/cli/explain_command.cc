// hybridplan explain: a plan in words. With --graph it names the graph's nodes; with --graph
// and --cluster it also checks the plan against them, re-evaluates it and shows the cluster's
// memory and links. With --trace it also writes the predicted schedule as a Chrome trace-event
// JSON (Perfetto, chrome://tracing): that trace is the Python package's (hybridplan.trace, the
// same one `hybridplan validate` writes beside the measured schedule), so the command then runs
// `python3 -m hybridplan explain ARGS...`, which prints the same explanation.
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cli/commands.h"
#include "cli/problem_options.h"
#include "cli/subprocess.h"
#include "common/error.h"
#include "planner/costs/evaluate.h"
#include "planner/reports/explain.h"

namespace hybridplan::cli {
namespace {

struct ExplainFlags {
  std::string plan_path;
  ProblemFlags problem;
  std::string trace_path;
};

[[noreturn]] void run_python_explain(const ExplainFlags& flags) {
  const auto python = find_program(environment_program("python3"));
  if (!python) {
    throw InputError("explain --trace: python3 not found on PATH; the trace is written by the "
                     "Python package (python3 -m hybridplan explain ... --trace)");
  }
  std::vector<std::string> argv = {*python, "-m", "hybridplan", "explain", flags.plan_path};
  const std::pair<const char*, const std::string*> options[] = {
      {"--graph", &flags.problem.graph_path},
      {"--cluster", &flags.problem.cluster},
      {"--job", &flags.problem.job_path},
      {"--trace", &flags.trace_path}};
  for (const auto& [name, value] : options) {
    if (!value->empty()) {
      argv.push_back(name);
      argv.push_back(*value);
    }
  }
  exec_program(argv);
}

void run_explain(const ExplainFlags& flags) {
  if (!flags.trace_path.empty()) run_python_explain(flags);
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
  cmd->add_option("--trace", flags->trace_path,
                  "Also write the predicted schedule (one thread per rank) as a Chrome "
                  "trace-event JSON for ui.perfetto.dev or chrome://tracing; a pipeline plan "
                  "needs --graph and --cluster (runs `python3 -m hybridplan explain ARGS...`)");
  cmd->callback([flags] { run_explain(*flags); });
}

}  // namespace hybridplan::cli
