// Problem: everything the planner reads. evaluate() and search() both take one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/documents/cluster.h"
#include "planner/documents/graph.h"
#include "planner/documents/job.h"

namespace hybridplan {

struct Problem {
  Graph graph;
  Cluster cluster;
  Job job;

  // Validates graph, cluster and job (messages name `source` + the part, e.g.
  // "problem (graph): nodes[3].forward_s ...") and the job against the graph (mixed precision
  // needs a 16-bit graph); the graph must have been finalized.
  void validate(const std::string& source = "problem") const;
};

// Loads the three files (cluster may be a preset name; empty job path = default_job()) and
// validates the combination.
Problem load_problem(const std::string& graph_path, const std::string& cluster_path_or_preset,
                     const std::string& job_path = "");

// The per-replica batches the search may choose for `dp` replicas under the job's batch rule
// (formats.md, Job): the per_replica_batch candidates if given; else global / dp for every
// global_batch candidate that dp divides (empty when none does); else the graph's profiled batch.
std::vector<int64_t> per_replica_batches_for(const Problem& problem, int64_t dp);

}  // namespace hybridplan
