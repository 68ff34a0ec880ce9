#include "catch.h"
#include "common/json_io.h"
#include "model_fixtures.h"
#include "planner/documents/plan.h"

using namespace hybridplan;
using hybridplan::test::input_error_of;

namespace {

// a -> b -> c -> d, plus a -> c (a skip connection).
Graph chain() {
  return test::make_graph({{"a", 1, 2, 10, 8}, {"b", 1, 2, 10, 8}, {"c", 1, 2, 10, 8}, {"d", 1, 2, 10, 8}},
                          {{0, 1, 8}, {1, 2, 8}, {2, 3, 8}, {0, 2, 8}}, 4, "chain");
}

Plan pipeline_plan(const Graph& g, const Cluster& c) {
  Plan p = test::make_plan(g, c, 2, 2, MpMode::kPipeline, 8, {0, 0, 1, 1}, 4, Schedule::k1F1B);
  p.cluster_num_nodes = c.num_nodes;
  p.cluster_devices_per_node = c.devices_per_node;
  return p;
}

std::string validate_error(const Plan& p, const Graph& g, const Cluster& c) {
  return input_error_of([&] { p.validate("plan.json", g, c); });
}

std::string load_error(const Json& j) {
  return input_error_of([&] { plan_from_json(j, "plan.json"); });
}

}  // namespace

TEST_CASE("plan JSON round-trips and carries node names", "[plan]") {
  const Graph g = chain();
  const Cluster c = test::make_cluster(1, 4);
  Plan p = pipeline_plan(g, c);
  p.device_mapping_note = "consecutive devices";
  p.predicted.step_s = 0.5;
  p.predicted.memory_bytes = {100, 200};
  const Json j = plan_to_json(p, g, c);
  REQUIRE(j["assignment"][2] == Json::parse(R"({"node": 2, "name": "c", "device": 1})"));
  REQUIRE(j["cluster"] == Json::parse(R"({"name": "test-cluster", "num_nodes": 1, "devices_per_node": 4})"));
  REQUIRE(j["mode"] == "pipeline");
  REQUIRE(j["schedule"] == "1f1b");

  const std::string path = (test::scratch_dir() / "chain.plan.json").string();
  save_plan(p, g, c, path);
  const Plan loaded = load_plan(path, g, c);
  REQUIRE(plan_to_json(loaded, g, c) == j);
  REQUIRE(loaded.assignment_names == std::vector<std::string>{"a", "b", "c", "d"});
  REQUIRE(loaded.predicted.memory_bytes == std::vector<int64_t>{100, 200});
  REQUIRE(loaded.num_processes() == 4);
}

TEST_CASE("load_plan(path, graph, cluster) accepts assignment entries in any order", "[plan]") {
  const Graph g = chain();
  const Cluster c = test::make_cluster(1, 4);
  Json j = plan_to_json(pipeline_plan(g, c), g, c);
  std::swap(j["assignment"][0], j["assignment"][3]);
  const std::string path = test::write_file("shuffled.plan.json", j.dump());
  REQUIRE(load_plan(path, g, c).assignment == std::vector<int32_t>{0, 0, 1, 1});
  // Without the graph the file order is kept, and validate explains the rule.
  REQUIRE(input_error_of([&] { load_plan(path).validate(path, g, c); }) ==
          path + ": assignment[0].node must be node id 0 (\"a\"): entries follow the graph's node "
                 "order (load_plan(path, graph, cluster) reorders them) (got 3)");

  j["assignment"].erase(1);
  const std::string missing = test::write_file("missing.plan.json", j.dump());
  REQUIRE(input_error_of([&] { load_plan(missing, g, c); }) ==
          missing + ": assignment misses node 1 \"b\" (got 3 entries for 4 nodes)");
  j["assignment"].push_back(j["assignment"][0]);
  const std::string twice = test::write_file("twice.plan.json", j.dump());
  REQUIRE(input_error_of([&] { load_plan(twice, g, c); }) ==
          twice + ": assignment[3].node assigns a node a second time (got 3)");
  j["assignment"][3]["node"] = 42;
  const std::string unknown = test::write_file("unknown.plan.json", j.dump());
  REQUIRE(input_error_of([&] { load_plan(unknown, g, c); }) ==
          unknown + ": assignment[3].node names no node of graph \"chain\" (got 42)");
}

TEST_CASE("Plan::validate rejects plans that do not fit their graph or cluster", "[plan]") {
  const Graph g = chain();
  const Cluster c = test::make_cluster(1, 4);
  Plan p = pipeline_plan(g, c);
  REQUIRE(validate_error(p, g, c) == "no error");

  SECTION("graph hash") {
    Graph other = g;
    other.nodes[0].forward_s = 3;
    REQUIRE(validate_error(p, other, c) ==
            "plan.json: graph.sha256 does not match the graph it is applied to (\"chain\" has "
            "sha256 " + graph_sha256(other) + ") (got \"" + p.graph_sha256 + "\")");
  }
  SECTION("cluster name") {
    Cluster other = c;
    other.name = "elsewhere";
    REQUIRE(validate_error(p, g, other) ==
            "plan.json: cluster.name does not match the cluster it is applied to (\"elsewhere\") "
            "(got \"test-cluster\")");
  }
  SECTION("cluster shape") {
    const Cluster bigger = test::make_cluster(2, 4);
    REQUIRE(validate_error(p, g, bigger) ==
            "plan.json: cluster.num_nodes does not match the cluster it is applied to (2) (got 1)");
  }
  SECTION("world size beyond the cluster") {
    const Cluster small = test::make_cluster(1, 2);
    p.cluster_devices_per_node = 0;
    REQUIRE(validate_error(p, g, small) == "plan.json: world_size exceeds the cluster's 2 devices (got 4)");
  }
  SECTION("world size arithmetic") {
    p.world_size = 8;
    REQUIRE(validate_error(p, g, c) == "plan.json: world_size must equal dp * mp = 4 (got 8)");
  }
  SECTION("global batch") {
    p.global_batch = 10;
    REQUIRE(validate_error(p, g, c) ==
            "plan.json: global_batch must equal dp * per_replica_batch = 16 (got 10)");
  }
  SECTION("not monotone along edges") {
    p.assignment = {0, 1, 0, 1};  // b (stage 1) -> c (stage 0)
    REQUIRE(validate_error(p, g, c) ==
            "plan.json: assignment[2].device must not be an earlier stage than its input \"b\" on "
            "stage 1 (edges[1]): pipeline stages never decrease along an edge (got 0)");
  }
  SECTION("empty stage") {
    p.assignment = {0, 0, 0, 0};
    REQUIRE(validate_error(p, g, c) ==
            "plan.json: assignment must give every pipeline stage 0..mp-1 a node (got stage 1 empty)");
  }
  SECTION("assignment range") {
    p.assignment = {0, 0, 2, 1};
    REQUIRE(validate_error(p, g, c) == "plan.json: assignment[2].device must be in 0..mp-1 = 0..1 (got 2)");
  }
  SECTION("assignment size") {
    p.assignment = {0, 1};
    REQUIRE(validate_error(p, g, c) ==
            "plan.json: assignment must have one entry per graph node (4) (got 2 entries)");
  }
  SECTION("mesh shape") {
    p.mesh[1] = {2};
    REQUIRE(validate_error(p, g, c) == "plan.json: mesh[1] must have mp = 2 devices (got 1 devices)");
  }
  SECTION("mesh reuses a device") {
    p.mesh[1] = {1, 3};
    REQUIRE(validate_error(p, g, c) ==
            "plan.json: mesh[1][0] must not reuse a device (also mesh[0][1]) (got 1)");
  }
  SECTION("mesh device outside the cluster") {
    p.mesh[1] = {2, 9};
    REQUIRE(validate_error(p, g, c) ==
            "plan.json: mesh[1][1] names no device of cluster \"test-cluster\" (0..3) (got 9)");
  }
  SECTION("pipeline without a schedule") {
    p.schedule = Schedule::kNone;
    REQUIRE(validate_error(p, g, c) ==
            "plan.json: schedule must be \"gpipe\", \"1f1b\", \"interleaved-1f1b\", \"interleaved-zb\" or \"zbv\" for a pipeline plan (got \"none\")");
  }
  SECTION("more micro-batches than samples") {
    p.num_microbatches = 9;
    REQUIRE(validate_error(p, g, c) ==
            "plan.json: num_microbatches must be in 1..per_replica_batch = 8 (got 9)");
  }
  SECTION("placement with micro-batches") {
    p.mode = MpMode::kPlacement;
    p.schedule = Schedule::kNone;
    REQUIRE(validate_error(p, g, c) == "plan.json: num_microbatches must be 1 for a placement plan (got 4)");
    p.num_microbatches = 1;
    p.assignment = {1, 0, 1, 0};  // placement needs no monotone order
    REQUIRE(validate_error(p, g, c) == "no error");
  }
}

TEST_CASE("plan_from_json checks structure and types", "[plan]") {
  const Graph g = chain();
  const Cluster c = test::make_cluster(1, 4);
  Json j = plan_to_json(pipeline_plan(g, c), g, c);
  REQUIRE(load_error(j) == "no error");
  SECTION("mode") {
    j["mode"] = "tensor";
    REQUIRE(load_error(j) == "plan.json: mode must be \"placement\" or \"pipeline\" (got \"tensor\")");
  }
  SECTION("schedule") {
    j["schedule"] = "interleaved";
    REQUIRE(load_error(j) ==
            "plan.json: schedule must be \"none\", \"gpipe\", \"1f1b\", \"interleaved-1f1b\", \"interleaved-zb\" or \"zbv\" (got \"interleaved\")");
  }
  SECTION("mesh entry type") {
    j["mesh"][0][1] = "gpu1";
    REQUIRE(load_error(j) == "plan.json: mesh[0][1] must be an integer (got \"gpu1\")");
  }
  SECTION("missing graph hash") {
    j["graph"].erase("sha256");
    REQUIRE(load_error(j) == "plan.json: graph.sha256 is required");
  }
  SECTION("assignment device") {
    j["assignment"][1]["device"] = 5;
    REQUIRE(load_error(j) == "plan.json: assignment[1].device must be in 0..mp-1 = 0..1 (got 5)");
  }
  SECTION("predicted type") {
    j["predicted"]["feasible"] = "yes";
    REQUIRE(load_error(j) == "plan.json: predicted.feasible must be true or false (got \"yes\")");
  }
  SECTION("dp") {
    j["dp"] = 0;
    REQUIRE(load_error(j) == "plan.json: dp must be >= 1 (got 0)");
  }
  SECTION("kind") {
    j.erase("kind");
    REQUIRE(load_error(j) == "plan.json: kind is required and must be \"hybridplan.plan\"");
  }
}
