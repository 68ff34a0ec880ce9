#include "planner/documents/problem.h"

#include "common/error.h"
#include "planner/costs/memory_cost.h"

namespace hybridplan {

void Problem::validate(const std::string& source) const {
  graph.validate(source + " (graph)");
  HP_INTERNAL_ASSERT(graph.topo_order.size() == graph.nodes.size(),
                     "Graph::finalize() was not called on graph " << graph.name);
  cluster.validate(source + " (cluster)");
  job.validate(source + " (job)");
  optimizer_state(job, graph, source + " (job)");  // mixed precision needs a 16-bit graph
}

Problem load_problem(const std::string& graph_path, const std::string& cluster_path_or_preset,
                     const std::string& job_path) {
  Problem problem{load_graph(graph_path), load_cluster(cluster_path_or_preset),
                  job_path.empty() ? default_job() : load_job(job_path)};
  problem.validate();
  return problem;
}

std::vector<int64_t> per_replica_batches_for(const Problem& problem, int64_t dp) {
  const Job& job = problem.job;
  if (!job.per_replica_batches.empty()) return job.per_replica_batches;
  if (job.global_batches.empty()) return {problem.graph.profiled.batch_size};
  std::vector<int64_t> out;
  for (int64_t global : job.global_batches)
    if (global % dp == 0) out.push_back(global / dp);
  return out;
}

}  // namespace hybridplan
