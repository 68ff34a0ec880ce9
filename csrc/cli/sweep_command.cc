// hybridplan sweep: best pure-DP plan vs best hybrid plan for N = 1, 2, 4, ... devices, the
// end-to-end speedup of each over one device, optionally as CSV and as a plot (the paper's
// scaling figure, drawn by python/hybridplan/plot.py).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>
#include <unistd.h>

#include "cli/commands.h"
#include "cli/problem_options.h"
#include "cli/subprocess.h"
#include "common/error.h"
#include "common/json_io.h"
#include "common/units.h"
#include "planner/searches/sweep.h"

namespace hybridplan::cli {
namespace {

struct SweepFlags {
  ProblemFlags problem;
  int64_t max_devices = 0;
  std::string csv_path;
  std::string plot_path;
  bool json = false;
};

// Seconds per unit of training progress, lower is better: time-to-train with a convergence
// model, else seconds per sample. Speedups are ratios of this against one device.
double cost_of(const Plan& p) {
  const Prediction& q = p.predicted;
  return q.time_to_train_s > 0 ? q.time_to_train_s : 1.0 / q.samples_per_s;
}

std::string speedup_text(const std::optional<Plan>& plan, double base_cost) {
  if (!plan || base_cost <= 0) return "-";
  std::ostringstream os;
  os.precision(3);
  os << base_cost / cost_of(*plan) << "x";
  return os.str();
}

std::string describe(const std::optional<Plan>& plan, bool convergence) {
  if (!plan) return "does not fit";
  const Prediction& q = plan->predicted;
  std::string s = "dp=" + std::to_string(plan->dp) + " mp=" + std::to_string(plan->mp);
  if (plan->mp > 1) s += std::string(" ") + mode_name(plan->mode);
  s += " B=" + std::to_string(plan->global_batch) + " step " + format_seconds(q.step_s);
  s += convergence ? " ttt " + format_seconds(q.time_to_train_s)
                   : " " + format_count(q.samples_per_s) + " samples/s";
  return s;
}

// The point speedups are measured against: one device, or the fewest devices where a plan
// fits when the model does not fit on one (plot.py makes the same choice).
const SweepPoint& base_point(const std::vector<SweepPoint>& points) {
  for (const SweepPoint& p : points) {
    if (p.best) return p;
  }
  HP_INTERNAL_ASSERT(false, "base_point called on a sweep where nothing fits");
}

void print_sweep(const Problem& problem, const std::vector<SweepPoint>& points) {
  const bool convergence = problem.job.convergence.model != Convergence::Model::kNone;
  const SweepPoint& base = base_point(points);
  const double base_cost = cost_of(*base.best);
  std::cout << "graph " << problem.graph.name << " on " << problem.cluster.name
            << "; speedup = " << (convergence ? "time to train" : "samples/s")
            << " relative to " << base.devices << " device" << (base.devices > 1 ? "s" : "")
            << "\n";
  for (const SweepPoint& p : points) {
    std::cout << "N=" << p.devices << "\n"
              << "  DP only: " << describe(p.dp_only, convergence) << "  speedup "
              << speedup_text(p.dp_only, base_cost) << "\n"
              << "  best:    " << describe(p.best, convergence) << "  speedup "
              << speedup_text(p.best, base_cost) << "\n";
  }
}

void plot_sweep(const Json& sweep_json, const std::string& plot_path, const std::string& title) {
  const char* python_env = std::getenv("HYBRIDPLAN_PYTHON");
  const std::string python =
      (python_env && *python_env) ? python_env : environment_program("python3");
  if (!find_program(python)) {
    throw InputError("--plot: " + python + " not found on PATH; the plot is drawn by "
                     "`python3 -m hybridplan.plot` with matplotlib (use --csv or --json instead)");
  }
  // The data goes through a file next to the plot, removed afterwards.
  const std::string data_path = plot_path + ".sweep-" + std::to_string(::getpid()) + ".json";
  write_file_atomic(data_path, sweep_json.dump() + "\n");
  int status = 0;
  try {
    status = run_program({python, "-m", "hybridplan.plot", data_path, "--out", plot_path,
                          "--title", title});
  } catch (...) {
    std::filesystem::remove(data_path);
    throw;
  }
  std::filesystem::remove(data_path);
  if (status != 0) {
    throw InputError("--plot " + plot_path + ": `" + python + " -m hybridplan.plot` failed (exit " +
                     std::to_string(status) + "; its message is above; is matplotlib installed?)");
  }
}

void run_sweep(const SweepFlags& flags) {
  const Problem problem = load_problem(flags.problem);
  const std::vector<SweepPoint> points = sweep(problem, flags.max_devices);
  const Json sweep_json = sweep_to_json(points);
  const bool anything_fits =
      std::any_of(points.begin(), points.end(), [](const SweepPoint& p) { return p.best.has_value(); });
  if (!anything_fits) {
    if (flags.json) std::cout << sweep_json.dump(2) << "\n";
    throw InfeasibleError("nothing fits on any device count up to " +
                          std::to_string(flags.max_devices) + "; at " +
                          std::to_string(points.back().devices) + ": " + points.back().best_infeasible);
  }
  if (!flags.csv_path.empty()) write_file_atomic(flags.csv_path, sweep_to_csv(points));
  if (!flags.plot_path.empty()) {
    plot_sweep(sweep_json, flags.plot_path, problem.graph.name + " on " + problem.cluster.name);
  }
  if (flags.json) {
    std::cout << sweep_json.dump(2) << "\n";
  } else {
    print_sweep(problem, points);
  }
}

}  // namespace

void add_sweep_command(CLI::App& app) {
  auto flags = std::make_shared<SweepFlags>();
  CLI::App* cmd = app.add_subcommand(
      "sweep", "Best DP-only vs best hybrid plan for N = 1, 2, 4, ... devices");
  add_problem_flags(*cmd, flags->problem);
  cmd->get_option("--job")->required();
  cmd->add_option("--max-devices,-n", flags->max_devices, "Largest device count")
      ->required()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--csv", flags->csv_path, "Write one row per device count here");
  cmd->add_option("--plot", flags->plot_path,
                  "Draw speedup over 1 device vs N (DP alone and best hybrid) to this PNG "
                  "(needs python3 with matplotlib)");
  cmd->add_flag("--json", flags->json,
                "Print [{devices, dp_only, best}, ...] as JSON instead of the table");
  cmd->callback([flags] { run_sweep(*flags); });
}

}  // namespace hybridplan::cli
