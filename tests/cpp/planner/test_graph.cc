#include <cmath>

#include "catch.h"
#include "common/json_io.h"
#include "model_fixtures.h"
#include "planner/documents/graph.h"

using namespace hybridplan;
using hybridplan::test::input_error_of;

namespace {

// a -> b -> d, a -> c -> d; ids deliberately not 0..n-1 and not in order.
Json valid_graph_json() {
  return Json::parse(R"({
    "schema_version": 1, "kind": "hybridplan.graph", "name": "diamond",
    "profiled": {"device": "cpu", "batch_size": 8, "dtype": "float32"},
    "nodes": [
      {"id": 10, "name": "a", "op": "conv2d", "forward_s": 0.001, "backward_s": 0.002,
       "param_bytes": 100, "output_bytes": 4000, "flops": 1.5e6},
      {"id": 7, "name": "b", "op": "relu", "forward_s": 0.0005, "backward_s": 0.0005,
       "param_bytes": 0, "output_bytes": 4000},
      {"id": 3, "name": "c", "op": "conv2d", "forward_s": 0.002, "backward_s": 0.004,
       "param_bytes": 200, "output_bytes": 2000},
      {"id": 4, "name": "d", "op": "add", "forward_s": 0, "backward_s": 0,
       "param_bytes": 0, "output_bytes": 2000}],
    "edges": [{"src": 10, "dst": 7}, {"src": 10, "dst": 3, "bytes": 1234},
              {"src": 7, "dst": 4}, {"src": 3, "dst": 4}]})");
}

std::string load_error(const Json& j) {
  return input_error_of([&] { graph_from_json(j, "graph.json"); });
}

}  // namespace

TEST_CASE("graph_from_json reads fields, defaults edge bytes and derives adjacency", "[graph]") {
  const Graph g = graph_from_json(valid_graph_json(), "graph.json");
  REQUIRE(g.name == "diamond");
  REQUIRE(g.profiled.batch_size == 8);
  REQUIRE(g.nodes.size() == 4);
  REQUIRE(g.nodes[0].id == 10);
  REQUIRE(g.nodes[0].flops == 1.5e6);
  REQUIRE(g.edges[0].src == 0);   // id 10 is index 0
  REQUIRE(g.edges[0].dst == 1);   // id 7 is index 1
  REQUIRE(g.edges[0].bytes == 4000);  // default: the source's output_bytes
  REQUIRE(g.edges[1].bytes == 1234);
  // Kahn, smallest index first: a(0); then b(1), c(2) ready -> b, c; then d(3).
  REQUIRE(g.topo_order == std::vector<NodeIndex>{0, 1, 2, 3});
  REQUIRE(g.preds[3] == std::vector<NodeIndex>{1, 2});
  REQUIRE(g.succs[0] == std::vector<NodeIndex>{1, 2});
  REQUIRE(g.in_edges[3] == std::vector<int32_t>{2, 3});
  REQUIRE(g.out_edges[0] == std::vector<int32_t>{0, 1});
}

TEST_CASE("topological order is Kahn with the smallest ready index first", "[graph]") {
  // 3 -> 0, 2 -> 1: ready at start {2, 3} -> 2 first, then 1 becomes ready (1 < 3).
  const Graph g = test::make_graph({{"n0"}, {"n1"}, {"n2"}, {"n3"}}, {{3, 0, 0}, {2, 1, 0}});
  REQUIRE(g.topo_order == std::vector<NodeIndex>{2, 1, 3, 0});
}

TEST_CASE("graph validation names the file, the JSON path and the rule", "[graph]") {
  Json j = valid_graph_json();

  SECTION("negative time") {
    j["nodes"][3]["forward_s"] = -1;
    REQUIRE(load_error(j) == "graph.json: nodes[3].forward_s must be finite and >= 0 (got -1)");
  }
  SECTION("negative bytes") {
    j["nodes"][1]["output_bytes"] = -5;
    REQUIRE(load_error(j) == "graph.json: nodes[1].output_bytes must be >= 0 (got -5)");
  }
  SECTION("wrong type") {
    j["nodes"][2]["param_bytes"] = "lots";
    REQUIRE(load_error(j) == "graph.json: nodes[2].param_bytes must be an integer (got \"lots\")");
  }
  SECTION("fractional integer") {
    j["nodes"][2]["param_bytes"] = 1.5;
    REQUIRE(load_error(j) == "graph.json: nodes[2].param_bytes must be an integer (got 1.5)");
  }
  SECTION("missing field") {
    j["nodes"][0].erase("backward_s");
    REQUIRE(load_error(j) == "graph.json: nodes[0].backward_s is required");
  }
  SECTION("smallest accepted batch above the profiled one") {
    j["profiled"]["min_batch_size"] = 64;
    REQUIRE(load_error(j) == "graph.json: profiled.min_batch_size must be >= 1 and <= "
                             "profiled.batch_size = 8 (the smallest batch the model accepts; "
                             "it ran at the profiled one) (got 64)");
  }
  SECTION("negative flops") {
    j["nodes"][0]["flops"] = -2.5;
    REQUIRE(load_error(j) == "graph.json: nodes[0].flops must be finite and >= 0 (got -2.5)");
  }
  SECTION("batch_times at the profiled batch") {
    j["nodes"][0]["batch_times"] = Json::parse(R"([{"batch_size": 8, "forward_s": 1, "backward_s": 2}])");
    REQUIRE(load_error(j) ==
            "graph.json: nodes[0].batch_times[0].batch_size must differ from "
            "profiled.batch_size (whose times are the node's forward_s and backward_s) (got 8)");
  }
  SECTION("batch_times not increasing") {
    j["nodes"][0]["batch_times"] = Json::parse(
        R"([{"batch_size": 4, "forward_s": 1, "backward_s": 2}, {"batch_size": 2, "forward_s": 1, "backward_s": 2}])");
    REQUIRE(load_error(j) ==
            "graph.json: nodes[0].batch_times[1].batch_size must be greater than the previous "
            "entry's 4 (strictly increasing) (got 2)");
  }
  SECTION("batch_times negative time") {
    j["nodes"][0]["batch_times"] = Json::parse(R"([{"batch_size": 1, "forward_s": -1, "backward_s": 2}])");
    REQUIRE(load_error(j) == "graph.json: nodes[0].batch_times[0].forward_s must be finite and >= 0 (got -1)");
  }
  SECTION("tied parameter on one node") {
    j["tied_params"] = Json::parse(R"([{"nodes": [10], "bytes": 8}])");
    REQUIRE(load_error(j) ==
            "graph.json: tied_params[0].nodes must name at least two nodes that share the "
            "parameter (got 1 nodes)");
  }
  SECTION("tied parameter of an unknown node") {
    j["tied_params"] = Json::parse(R"([{"nodes": [10, 99], "bytes": 8}])");
    REQUIRE(load_error(j) == "graph.json: tied_params[0].nodes[1] names no node (got 99)");
  }
  SECTION("negative saved bytes") {
    j["nodes"][0]["saved_bytes"] = -5;
    REQUIRE(load_error(j) == "graph.json: nodes[0].saved_bytes must be >= 0 (got -5)");
  }
  SECTION("cut_before not a boolean") {
    j["nodes"][1]["cut_before"] = 0;
    REQUIRE(load_error(j) == "graph.json: nodes[1].cut_before must be true or false (got 0)");
  }
  SECTION("pipeline_split without a reason") {
    j["pipeline_split"] = Json::parse(R"({"supported": false})");
    REQUIRE(load_error(j) ==
            "graph.json: pipeline_split.reason must say why the model cannot be split when "
            "supported is false (got \"\")");
  }
  SECTION("edge to a missing node") {
    j["edges"][2]["dst"] = 17;
    REQUIRE(load_error(j) == "graph.json: edges[2].dst names no node (got 17)");
  }
  SECTION("edge from a missing node") {
    j["edges"][0]["src"] = 99;
    REQUIRE(load_error(j) == "graph.json: edges[0].src names no node (got 99)");
  }
  SECTION("negative edge bytes") {
    j["edges"][1]["bytes"] = -1;
    REQUIRE(load_error(j) == "graph.json: edges[1].bytes must be >= 0 (got -1)");
  }
  SECTION("cycle") {
    j["edges"].push_back({{"src", 4}, {"dst", 10}});  // d -> a closes a -> b -> d
    REQUIRE(load_error(j) == "graph.json: edges form a cycle through nodes[0] \"a\"");
  }
  SECTION("cycle downstream of an acyclic part reports a node on the cycle") {
    j["edges"].push_back({{"src", 4}, {"dst", 3}});  // c -> d -> c; a is not on it
    REQUIRE(load_error(j) == "graph.json: edges form a cycle through nodes[2] \"c\"");
  }
  SECTION("self loop") {
    j["edges"].push_back({{"src", 7}, {"dst", 7}});
    REQUIRE(load_error(j) == "graph.json: edges[4] must not be a self loop (got node 7)");
  }
  SECTION("duplicate edge") {
    j["edges"].push_back({{"src", 10}, {"dst", 7}});
    REQUIRE(load_error(j) == "graph.json: edges[4] duplicates an earlier edge (got 10 -> 7)");
  }
  SECTION("duplicate id") {
    j["nodes"][2]["id"] = 7;
    REQUIRE(load_error(j) == "graph.json: nodes[2].id must be unique (also nodes[1]) (got 7)");
  }
  SECTION("duplicate name") {
    j["nodes"][3]["name"] = "b";
    REQUIRE(load_error(j) == "graph.json: nodes[3].name must be unique (also nodes[1]) (got \"b\")");
  }
  SECTION("empty name") {
    j["nodes"][3]["name"] = "";
    REQUIRE(load_error(j) == "graph.json: nodes[3].name must be non-empty (got \"\")");
  }
  SECTION("no nodes") {
    j["nodes"] = Json::array();
    j["edges"] = Json::array();
    REQUIRE(load_error(j) == "graph.json: nodes must list at least one node (got [])");
  }
  SECTION("nodes not an array") {
    j["nodes"] = 3;
    REQUIRE(load_error(j) == "graph.json: nodes must be a JSON array (got 3)");
  }
  SECTION("node not an object") {
    j["nodes"][1] = "b";
    REQUIRE(load_error(j) == "graph.json: nodes[1] must be a JSON object (got \"b\")");
  }
  SECTION("batch size") {
    j["profiled"]["batch_size"] = 0;
    REQUIRE(load_error(j) == "graph.json: profiled.batch_size must be >= 1 (got 0)");
  }
  SECTION("wrong schema version") {
    j["schema_version"] = 2;
    REQUIRE(load_error(j) == "graph.json: schema_version must be 1 (got 2)");
  }
  SECTION("missing schema version") {
    j.erase("schema_version");
    REQUIRE(load_error(j) == "graph.json: schema_version is required and must be 1");
  }
  SECTION("wrong kind") {
    j["kind"] = "hybridplan.plan";
    REQUIRE(load_error(j) ==
            "graph.json: kind must be \"hybridplan.graph\" (got \"hybridplan.plan\")");
  }
  SECTION("top level not an object") {
    REQUIRE(load_error(Json::array({1, 2})) ==
            "graph file graph.json: expected a JSON object (got [1,2])");
  }
}

TEST_CASE("batch curves, stage cuts and splittability round-trip; old graphs keep their hash",
          "[graph]") {
  Json j = valid_graph_json();
  const Graph plain = graph_from_json(j, "graph.json");
  const Json canonical = graph_to_json(plain);
  REQUIRE(canonical.find("pipeline_split") == canonical.end());
  REQUIRE(canonical["nodes"][0].find("batch_times") == canonical["nodes"][0].end());
  REQUIRE(canonical["nodes"][0].find("cut_before") == canonical["nodes"][0].end());
  REQUIRE(plain.pipeline_split.supported);
  REQUIRE(plain.nodes[1].cut_before);

  j["nodes"][0]["batch_times"] = Json::parse(
      R"([{"batch_size": 1, "forward_s": 0.0002, "backward_s": 0.0004},
          {"batch_size": 4, "forward_s": 0.0006, "backward_s": 0.0011}])");
  j["nodes"][1]["cut_before"] = false;
  j["tied_params"] = Json::parse(R"([{"nodes": [10, 4], "bytes": 100}])");
  j["pipeline_split"] = {{"supported", false}, {"reason", "torch.export failed in 'enc': data-dependent control flow"}};
  const Graph g = graph_from_json(j, "graph.json");
  REQUIRE(g.nodes[0].batch_times.size() == 2);
  REQUIRE(g.nodes[0].batch_times[1].batch_size == 4);
  REQUIRE(g.nodes[0].batch_times[1].backward_s == 0.0011);
  REQUIRE_FALSE(g.nodes[1].cut_before);
  REQUIRE_FALSE(g.pipeline_split.supported);
  REQUIRE(g.tied_params.size() == 1);
  REQUIRE(g.tied_params[0].nodes == std::vector<NodeIndex>{0, 3});
  REQUIRE(graph_to_json(g)["tied_params"] == Json::parse(R"([{"nodes": [10, 4], "bytes": 100}])"));
  REQUIRE(graph_to_json(graph_from_json(graph_to_json(g), "again")) == graph_to_json(g));
  REQUIRE(graph_sha256(g) != graph_sha256(plain));

  REQUIRE(canonical["profiled"].find("min_batch_size") == canonical["profiled"].end());
  j["profiled"]["min_batch_size"] = 2;
  REQUIRE(graph_from_json(j, "graph.json").profiled.min_batch_size == 2);
  REQUIRE(graph_to_json(graph_from_json(j, "graph.json"))["profiled"]["min_batch_size"] == 2);
}

TEST_CASE("Graph::validate applies the same rules to graphs built in code", "[graph]") {
  Graph g = test::make_graph({{"a", 1, 1}, {"b", 1, 1}}, {{0, 1, 8}});
  g.nodes[1].backward_s = std::nan("");
  REQUIRE(input_error_of([&] { g.validate("code"); }) ==
          "code: nodes[1].backward_s must be finite and >= 0 (got nan)");
  g.nodes[1].backward_s = 1;
  g.edges.push_back({1, 5, 0});
  REQUIRE(input_error_of([&] { g.validate("code"); }) ==
          "code: edges[1].dst names no node (node index) (got 5)");
}

TEST_CASE("save and load round-trip to the same canonical JSON and sha256", "[graph]") {
  const Graph g = graph_from_json(valid_graph_json(), "graph.json");
  const std::string path = (test::scratch_dir() / "diamond.graph.json").string();
  save_graph(g, path);
  const Graph again = load_graph(path);
  REQUIRE(graph_to_json(again) == graph_to_json(g));
  REQUIRE(graph_sha256(again) == graph_sha256(g));
  REQUIRE(graph_sha256(g).size() == 64);

  // The hash is over graph_to_json(g).dump(): sorted keys, no spaces.
  const std::string canonical = graph_to_json(g).dump();
  REQUIRE(canonical.rfind(R"({"edges":[{"bytes":4000,"dst":7,"src":10})", 0) == 0);

  // The saved file is exactly the canonical text plus a newline (no tmp file left behind).
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(text == canonical + "\n");
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    REQUIRE(entry.path().string().find(path + ".tmp") == std::string::npos);
  }

  // Any change to a cost changes the hash.
  Graph changed = g;
  changed.nodes[2].forward_s = 0.0021;
  REQUIRE(graph_sha256(changed) != graph_sha256(g));
}

TEST_CASE("load_graph reports missing files and JSON syntax errors with the file name",
          "[graph]") {
  REQUIRE(input_error_of([] { load_graph("/nonexistent/g.json"); }) ==
          "/nonexistent/g.json: cannot open file (No such file or directory)");
  const std::string path = test::write_file("broken.graph.json", "{\n  \"name\": \"x\",\n  oops\n}\n");
  const std::string message = input_error_of([&] { load_graph(path); });
  REQUIRE(message.rfind(path + ": invalid JSON: parse error at line 3, column", 0) == 0);
}
