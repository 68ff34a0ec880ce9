// hybridplan plan: search the DP x MP space and print the ranked plans.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/plan_table.h"
#include "cli/problem_options.h"
#include "common/error.h"
#include "planner/search.h"

namespace hybridplan::cli {
namespace {

struct PlanFlags {
  ProblemFlags problem;
  int64_t devices = 0;
  int top_k = 5;
  std::string out_path;
  bool json = false;
};

void run_plan(const PlanFlags& flags) {
  const Problem problem = load_problem(flags.problem);
  const int64_t cluster_devices = problem.cluster.num_devices();
  if (flags.devices > cluster_devices) {
    throw InputError("--devices must be <= " + std::to_string(cluster_devices) +
                     ", the devices of cluster '" + problem.cluster.name + "' (got " +
                     std::to_string(flags.devices) + ")");
  }
  SearchOptions options;
  options.devices = flags.devices;
  options.top_k = flags.top_k;
  const SearchResult result = search(problem, options);  // InfeasibleError -> exit 3
  HP_INTERNAL_ASSERT(!result.plans.empty(), "search returned no plan and no InfeasibleError");

  // Write the plan before printing so a failed write is reported before any output.
  if (!flags.out_path.empty()) save_plan(result.plans.front(), problem.graph, problem.cluster, flags.out_path);
  if (flags.json) {
    Json plans = Json::array();
    for (const Plan& p : result.plans) plans.push_back(plan_to_json(p, problem.graph, problem.cluster));
    std::cout << plans.dump(2) << "\n";
  } else {
    print_plan_table(std::cout, problem, result.plans);
    std::cout << result.candidates_evaluated << " candidates evaluated\n";
    for (const std::string& note : result.notes) std::cout << "note: " << note << "\n";
    if (!flags.out_path.empty()) std::cout << "best plan written to " << flags.out_path << "\n";
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto flags = std::make_shared<PlanFlags>();
  CLI::App* cmd = app.add_subcommand("plan", "Search DP x MP plans and print them ranked");
  add_problem_flags(*cmd, flags->problem);
  cmd->add_option("--devices,-n", flags->devices, "Devices to use (default: the whole cluster)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--top,-k", flags->top_k, "How many plans to list")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--out,-o", flags->out_path, "Write the best plan here (atomically)");
  cmd->add_flag("--json", flags->json, "Print the ranked plans as a JSON array");
  cmd->callback([flags] { run_plan(*flags); });
}

}  // namespace hybridplan::cli
