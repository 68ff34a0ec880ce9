#include "catch.h"
#include "common/json_io.h"
#include "model_fixtures.h"
#include "planner/documents/problem.h"

using namespace hybridplan;

TEST_CASE("load_problem reads graph, cluster preset or file, and job", "[problem]") {
  const Graph g = test::make_graph({{"a", 1, 1, 8, 8}}, {}, 16, "tiny");
  const std::string graph_path = (test::scratch_dir() / "tiny.graph.json").string();
  save_graph(g, graph_path);
  const Cluster c = test::make_cluster(1, 2);
  const std::string cluster_path = (test::scratch_dir() / "tiny.cluster.json").string();
  write_json_file(cluster_path, cluster_to_json(c));
  const std::string job_path = test::write_file(
      "tiny.job.json", R"({"schema_version": 1, "kind": "hybridplan.job", "global_batch": 64})");

  const Problem p = load_problem(graph_path, cluster_path, job_path);
  REQUIRE(graph_sha256(p.graph) == graph_sha256(g));
  REQUIRE(p.cluster.num_devices() == 2);
  REQUIRE(per_replica_batches_for(p, 4) == std::vector<int64_t>{16});  // global 64 / 4
  REQUIRE(per_replica_batches_for(p, 3).empty());                      // 3 does not divide 64

  const Problem defaults = load_problem(graph_path, cluster_path);
  REQUIRE(per_replica_batches_for(defaults, 3) == std::vector<int64_t>{16});  // the profiled batch
  Problem fixed = defaults;
  fixed.job.per_replica_batches = {8, 32};
  REQUIRE(per_replica_batches_for(fixed, 3) == std::vector<int64_t>{8, 32});
  Problem globals = defaults;
  globals.job.global_batches = {48, 64, 96};
  REQUIRE(per_replica_batches_for(globals, 3) == std::vector<int64_t>{16, 32});

  Problem broken = defaults;
  broken.job.per_replica_batches = {-1};
  REQUIRE(test::input_error_of([&] { broken.validate(); }) ==
          "problem (job): per_replica_batch must be >= 1 (got -1)");
}
