#include "cli/problem_options.h"

#include <filesystem>

#include "common/error.h"
#include "planner/documents/graph.h"
#include "planner/documents/job.h"
#include "planner/documents/presets.h"

namespace hybridplan::cli {

void add_problem_flags(CLI::App& cmd, ProblemFlags& flags, bool required) {
  auto* graph = cmd.add_option("--graph,-g", flags.graph_path,
                               "Graph JSON (from hybridplan.profile or import-pipedream)");
  auto* cluster = cmd.add_option("--cluster,-c", flags.cluster,
                                 "Cluster JSON file or preset name (see `hybridplan presets`)");
  cmd.add_option("--job,-j", flags.job_path,
                 "Job JSON (batch, optimizer, convergence); default: samples/s at the "
                 "graph's profiled batch");
  if (required) {
    graph->required();
    cluster->required();
  }
}

Cluster load_cluster_flag(const std::string& path_or_preset) {
  if (!std::filesystem::exists(path_or_preset) && preset_json_text(path_or_preset) == nullptr) {
    std::string names;
    for (const std::string& name : preset_names()) names += (names.empty() ? "" : ", ") + name;
    throw InputError("--cluster: '" + path_or_preset +
                     "' is neither a file nor a preset name (presets: " + names + ")");
  }
  return load_cluster(path_or_preset);
}

Problem load_problem(const ProblemFlags& flags) {
  Problem problem;
  problem.graph = load_graph(flags.graph_path);
  problem.cluster = load_cluster_flag(flags.cluster);
  problem.job = flags.job_path.empty() ? default_job() : load_job(flags.job_path);
  return problem;
}

}  // namespace hybridplan::cli
