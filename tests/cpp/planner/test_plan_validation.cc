// Every plan validation message, from the table that tests/python/test_plan_validation.py checks
// with the same text through hybridplan._C (tests/data/plan_validation.json): the rules live in
// Plan::validate_structure / validate (plan.h), and Python has none of its own.
#include "catch.h"
#include "common/json_io.h"
#include "model_fixtures.h"
#include "planner/documents/cluster.h"
#include "planner/documents/graph.h"
#include "planner/documents/plan.h"

using namespace hybridplan;
using hybridplan::test::source_dir;

namespace {

// The case's plan: `plan` with the case's top-level fields replaced and the graph hash filled in.
Json case_plan(const Json& table, const Json& c, const std::string& sha256) {
  Json plan = table.at("plan");
  for (const auto& [key, value] : c.at("set").items()) plan[key] = value;
  if (plan.at("graph").at("sha256") == "$GRAPH_SHA256") plan["graph"]["sha256"] = sha256;
  return plan;
}

// The case's graph: the table's, with the case's optional `tensor_parallel` objects set on the
// nodes it names.
Graph case_graph(const Json& table, const Json& c) {
  Json graph = read_json_file((source_dir() / table.at("graph").get<std::string>()).string());
  if (c.contains("tensor_parallel")) {
    for (Json& node : graph.at("nodes")) {
      const auto name = node.at("name").get<std::string>();
      if (c.at("tensor_parallel").contains(name)) node["tensor_parallel"] = c.at("tensor_parallel").at(name);
    }
  }
  return graph_from_json(graph, "graph");
}

}  // namespace

TEST_CASE("every plan validation message, as the Python side sees it", "[plan]") {
  const Json table = read_json_file((source_dir() / "tests/data/plan_validation.json").string());
  const Graph table_graph = case_graph(table, Json::object());
  const Cluster cluster = load_cluster(table.at("cluster").get<std::string>());
  const std::string table_sha256 = graph_sha256(table_graph);

  Plan valid = plan_from_json(case_plan(table, Json{{"set", Json::object()}}, table_sha256), "plan");
  align_assignment_to_graph(valid, table_graph, "plan");
  CHECK_NOTHROW(valid.validate("plan", table_graph, cluster));

  for (const Json& c : table.at("cases")) {
    const Graph graph = c.contains("tensor_parallel") ? case_graph(table, c) : table_graph;
    const std::string sha256 = graph_sha256(graph);
    const Json plan = case_plan(table, c, sha256);
    INFO("case " << c.at("set").dump());
    const std::string message = test::input_error_of([&] {
      Plan p = plan_from_json(plan, "plan");
      if (c.at("against_graph").get<bool>()) {
        align_assignment_to_graph(p, graph, "plan");
        p.validate("plan", graph, cluster);
      }
    });
    std::string expected = c.at("message").get<std::string>();
    if (const size_t at = expected.find("$GRAPH_SHA256"); at != std::string::npos) {
      expected.replace(at, std::string("$GRAPH_SHA256").size(), sha256);
    }
    CHECK(message == expected);
  }
}
