// hybridplan plan: search the DP x MP space and print the ranked plans.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/plan_table.h"
#include "cli/problem_options.h"
#include "common/error.h"
#include "common/json_io.h"
#include "common/units.h"
#include "planner/run/run_phases.h"
#include "planner/searches/search.h"

namespace hybridplan::cli {
namespace {

struct PlanFlags {
  ProblemFlags problem;
  int64_t devices = 0;
  int top_k = 5;
  std::string out_path;
  bool json = false;
  bool over_run = false;
  std::vector<std::string> shardings = {"none", "zero2", "zero3"};
  std::vector<std::string> schedules = {"gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv"};
  std::vector<int64_t> tensor_degrees;  // empty: every degree the graph and cluster allow
  std::string sequence_parallel = "auto";
  RunPhasesOptions run;
  std::string trainer;     // --for: search only what this trainer runs (Python's trainers)
  std::string config_out;  // --for: where the trainer's configuration goes
};

// --for TRAINER: what each trainer runs and how its configuration is written are defined once,
// in python/hybridplan/trainers, so this runs `python3 -m hybridplan plan --for TRAINER ...`
// with the problem's flags. The search-narrowing flags would fight the trainer's own rules.
[[noreturn]] void run_plan_for_trainer(const PlanFlags& flags, const CLI::App& cmd) {
  for (const char* name : {"--top", "--json", "--sharding", "--schedules", "--tp",
                           "--sequence-parallel", "--over-run", "--segments", "--switch-s"}) {
    if (cmd.count(name) > 0) {
      throw InputError(std::string("plan: --for searches what ") + flags.trainer +
                       " runs (its schedules, sharding kinds, tensor parallelism); " + name +
                       " cannot be combined with it");
    }
  }
  std::vector<std::string> args = {"--graph", flags.problem.graph_path, "--cluster",
                                   flags.problem.cluster, "--for", flags.trainer};
  if (!flags.problem.job_path.empty()) args.insert(args.end(), {"--job", flags.problem.job_path});
  if (flags.devices > 0) args.insert(args.end(), {"--devices", std::to_string(flags.devices)});
  if (!flags.out_path.empty()) args.insert(args.end(), {"--out", flags.out_path});
  if (!flags.config_out.empty()) args.insert(args.end(), {"--config-out", flags.config_out});
  run_python("plan", args);
}

std::string progress_range(const RunPhase& p) {
  return std::to_string(static_cast<int>(100 * p.progress_start + 0.5)) + "-" +
         std::to_string(static_cast<int>(100 * p.progress_end + 0.5)) + " %";
}

// --over-run: the plans over the run, phase by phase (run_phases.h).
void run_over_run(const PlanFlags& flags, const Problem& problem, const SearchOptions& options) {
  const RunPhases phases = plan_over_run(problem, options, flags.run);
  if (!flags.out_path.empty()) write_json_file(flags.out_path, run_phases_to_json(phases, problem));
  if (flags.json) {
    std::cout << run_phases_to_json(phases, problem).dump(2) << "\n";
    return;
  }
  std::cout << "run schedule for graph " << problem.graph.name << " on " << problem.cluster.name
            << " (" << phases.candidates << " candidate plans, a switch costs "
            << format_seconds(phases.switch_s) << ")\n";
  for (const RunPhase& p : phases.phases) {
    std::cout << "  progress " << progress_range(p) << ": " << plan_shape(p.plan) << ", batch "
              << p.plan.per_replica_batch << " per replica (" << p.plan.global_batch << " global), "
              << format_seconds(p.time_s) << " (" << p.epochs << " epochs)\n";
  }
  std::cout << "time to train " << format_seconds(phases.time_s) << " with " << phases.switches
            << " switch(es); best single plan " << plan_shape(phases.best_single) << " batch "
            << phases.best_single.per_replica_batch << ": "
            << format_seconds(phases.best_single_time_s) << " (schedule "
            << (phases.best_single_time_s / phases.time_s - 1) * 100 << " % faster)\n";
  if (!flags.out_path.empty()) std::cout << "schedule written to " << flags.out_path << "\n";
}

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
  options.shardings.clear();
  for (const std::string& name : flags.shardings) {
    options.shardings.push_back(*sharding_from_name(name));  // CLI11 checked the names
  }
  options.schedules.clear();
  for (const std::string& name : flags.schedules) options.schedules.push_back(*schedule_from_name(name));
  options.tensor_degrees = flags.tensor_degrees;  // search() checks them against graph and cluster
  options.sequence_parallel = *sequence_parallel_search_from_name(flags.sequence_parallel);  // CLI11 checked
  if (flags.over_run) {
    run_over_run(flags, problem, options);
    return;
  }
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
  cmd->add_option("--sharding", flags->shardings,
                  "Data-parallel sharding kinds the search may choose (docs/sharding.md), "
                  "comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember({"none", "zero2", "zero3"}))
      ->capture_default_str();
  cmd->add_option("--schedules", flags->schedules,
                  "Pipeline schedules the search may choose (docs/schedules.md), comma-separated")
      ->delimiter(',')
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv"}))
      ->capture_default_str();
  cmd->add_option("--tp", flags->tensor_degrees,
                  "Tensor-parallel degrees the search may choose (docs/tensor_parallel.md), "
                  "comma-separated: --tp 1 turns tensor parallelism off, --tp 4 fixes it "
                  "(default: 1 and every degree dividing devices_per_node and the max_degree of "
                  "at least one of the graph's nodes; the others run whole)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  cmd->add_option("--sequence-parallel", flags->sequence_parallel,
                  "Sequence parallelism on the tensor-parallel plans (docs/tensor_parallel.md "
                  "\"Sequence parallelism\"): auto tries each with and without where the graph "
                  "allows it, on only with (degrees that do not allow it are left out), off never")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_flag("--over-run", flags->over_run,
                "Plan the whole run in phases as the job's critical batch grows (a "
                "critical_batch trajectory); --out writes the schedule");
  cmd->add_option("--segments", flags->run.segments, "--over-run: phases may change at 1/K of the run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--switch-s", flags->run.switch_s,
                  "--over-run: seconds one change of plan costs (default: 30 s restart + "
                  "checkpoint of parameters and optimizer state at 1 GB/s)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--for", flags->trainer,
                  "Search only what this trainer runs and print its configuration (runs "
                  "`python3 -m hybridplan plan --for TRAINER ...`, which names the trainers "
                  "it knows; docs/trainers.md)");
  cmd->add_option("--config-out", flags->config_out,
                  "--for: write the trainer's configuration here (default: standard output)");
  cmd->callback([flags, cmd] {
    if (!flags->trainer.empty()) run_plan_for_trainer(*flags, *cmd);
    if (!flags->config_out.empty()) throw InputError("plan: --config-out needs --for TRAINER");
    run_plan(*flags);
  });
}

}  // namespace hybridplan::cli
