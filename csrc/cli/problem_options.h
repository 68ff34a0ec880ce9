// The --graph/--cluster/--job flags several subcommands share, and loading them into a Problem.
#pragma once
#include <string>

#include <CLI/CLI.hpp>

#include "planner/documents/cluster.h"
#include "planner/documents/problem.h"

namespace hybridplan::cli {

struct ProblemFlags {
  std::string graph_path;
  std::string cluster;   // a file or a preset name
  std::string job_path;  // empty: default_job() (objective samples/s at the profiled batch)
};

// Adds --graph, --cluster and --job to `cmd`; `required` makes --graph and --cluster mandatory.
void add_problem_flags(CLI::App& cmd, ProblemFlags& flags, bool required = true);

// A cluster file, else a preset; neither: InputError listing the presets.
Cluster load_cluster_flag(const std::string& path_or_preset);

Problem load_problem(const ProblemFlags& flags);

}  // namespace hybridplan::cli
