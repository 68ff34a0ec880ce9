// PipeDream graph.txt import: a hand-written profile with every rule checked, error messages
// with file and line, and the six published profiles.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <unistd.h>

#include "catch.h"
#include "common/error.h"
#include "planner/documents/pipedream_import.h"

using namespace hybridplan;
namespace fs = std::filesystem;

namespace {

fs::path write_temp(const std::string& file_name, const std::string& text) {
  const fs::path dir = fs::temp_directory_path() / ("hp-pipedream-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path path = dir / file_name;
  std::ofstream(path) << text;
  return path;
}

std::string import_error(const std::string& text) {
  const fs::path path = write_temp("bad.graph.txt", text);
  try {
    import_pipedream(path.string(), 64);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

const char* const kTiny =
    "node1 -- Input0 -- forward_compute_time=12.500, backward_compute_time=0.000, "
    "activation_size=1000.0, parameter_size=0.000\n"
    "node3 -- LSTM(1024, 1024) -- forward_compute_time=2.500, backward_compute_time=4.000, "
    "activation_size=[600.0; 20.0; 20.0], parameter_size=4096.000\n"
    "node2 -- Conv2d(3, 64, kernel_size=(11, 11)) -- forward_compute_time=1.000, "
    "backward_compute_time=2.000, activation_size=500.000, parameter_size=256.000\n"
    "\tnode1 -- node2\n"
    "\tnode2 -- node3\n";

}  // namespace

TEST_CASE("pipedream import: fields, units and edges of a hand-written profile") {
  const Graph g = import_pipedream(write_temp("tiny.graph.txt", kTiny).string(), 32);
  CHECK(g.name == "tiny");  // file name up to its first '.'
  CHECK(g.profiled.batch_size == 32);
  REQUIRE(g.nodes.size() == 3);
  // nodes in id order: node1, node2, node3
  CHECK(g.nodes[0].name == "node1");
  CHECK(g.nodes[0].op == "input");
  CHECK(g.nodes[0].forward_s == 0);  // PipeDream's data-loading time is not compute
  CHECK(g.nodes[1].id == 2);
  CHECK(g.nodes[1].op == "conv2d");
  CHECK(g.nodes[1].forward_s == Approx(1e-3));   // 1.000 ms
  CHECK(g.nodes[1].backward_s == Approx(2e-3));  // 2.000 ms
  CHECK(g.nodes[1].param_bytes == 256);
  CHECK(g.nodes[2].op == "lstm");
  CHECK(g.nodes[2].output_bytes == 640);  // 600 + 20 + 20
  REQUIRE(g.edges.size() == 2);
  CHECK(g.edges[0].src == 0);
  CHECK(g.edges[0].dst == 1);
  CHECK(g.edges[0].bytes == 1000);  // the source's output
  CHECK(g.edges[1].bytes == 500);

  const Graph named = import_pipedream(write_temp("tiny.graph.txt", kTiny).string(), 64, "mine");
  CHECK(named.name == "mine");
}

TEST_CASE("pipedream import: errors name the file and line") {
  const std::string bad_number = import_error(
      "node1 -- Input0 -- forward_compute_time=0, backward_compute_time=0, activation_size=1, "
      "parameter_size=0\n"
      "node2 -- ReLU -- forward_compute_time=abc, backward_compute_time=0, activation_size=1, "
      "parameter_size=0\n");
  CHECK_THAT(bad_number, Catch::Matchers::Contains("bad.graph.txt:2: forward_compute_time must be a number"));
  CHECK_THAT(bad_number, Catch::Matchers::Contains("abc"));

  const std::string negative = import_error(
      "node1 -- ReLU -- forward_compute_time=-1, backward_compute_time=0, activation_size=1, "
      "parameter_size=0\n");
  CHECK_THAT(negative, Catch::Matchers::Contains(":1: forward_compute_time must be a finite number >= 0"));

  const std::string undefined = import_error(
      "node1 -- ReLU -- forward_compute_time=0, backward_compute_time=0, activation_size=1, "
      "parameter_size=0\n\tnode1 -- node7\n");
  CHECK_THAT(undefined, Catch::Matchers::Contains(":2: edge names an undefined node (got 'node7')"));

  const std::string twice = import_error(
      "node1 -- ReLU -- forward_compute_time=0, backward_compute_time=0, activation_size=1, "
      "parameter_size=0\n"
      "node1 -- ReLU -- forward_compute_time=0, backward_compute_time=0, activation_size=1, "
      "parameter_size=0\n");
  CHECK_THAT(twice, Catch::Matchers::Contains(":2: node1 is defined twice (first on line 1)"));

  const std::string missing_field = import_error("node1 -- ReLU -- forward_compute_time=0\n");
  CHECK_THAT(missing_field, Catch::Matchers::Contains(":1: node line lacks backward_compute_time"));

  CHECK_THAT(import_error(""), Catch::Matchers::EndsWith("bad.graph.txt is empty") &&
                                  Catch::Matchers::StartsWith("PipeDream profile "));
  CHECK_THAT(import_error("\n  \n"), Catch::Matchers::EndsWith("bad.graph.txt is empty"));
  CHECK_THAT(import_error("\tnode1 -- node2\n"), Catch::Matchers::Contains("has no node lines"));
  CHECK_THROWS_WITH(import_pipedream("/nonexistent/graph.txt", 64),
                    Catch::Matchers::Contains("/nonexistent/graph.txt: cannot open"));
}

// The published profiles, from $HYBRIDPLAN_PIPEDREAM_PROFILES or ../shared/data/pipedream-profiles
// next to the repository. Node counts are those of the folder's README.
TEST_CASE("pipedream import: the six published profiles") {
  const char* env = std::getenv("HYBRIDPLAN_PIPEDREAM_PROFILES");
  const fs::path dir = (env && *env) ? fs::path(env)
                                     : fs::path(HYBRIDPLAN_SOURCE_DIR) / "../shared/data/pipedream-profiles";
  if (!fs::exists(dir / "vgg16.graph.txt")) {
    WARN("SKIPPED: no PipeDream profiles at " << dir.string()
         << " (set HYBRIDPLAN_PIPEDREAM_PROFILES; they come from PipeDream's repository, "
            "msr-fiddle/pipedream, profiler/*/profiles/<model>/graph.txt)");
    return;
  }
  const std::map<std::string, size_t> expected_nodes = {
      {"inception_v3", 326}, {"resnet50", 177}, {"vgg16", 41},
      {"alexnet", 23},       {"gnmt", 48},      {"gnmt_large", 96}};
  for (const auto& [model, nodes] : expected_nodes) {
    INFO(model);
    const Graph g = import_pipedream((dir / (model + ".graph.txt")).string(), 64);
    CHECK(g.name == model);
    CHECK(g.nodes.size() == nodes);
    CHECK(g.topo_order.size() == nodes);  // a DAG
    double compute_s = 0;
    int64_t param_bytes = 0;
    for (const Node& n : g.nodes) {
      compute_s += n.forward_s + n.backward_s;
      param_bytes += n.param_bytes;
    }
    CHECK(compute_s > 0.001);       // tens of ms per mini-batch on one GPU
    CHECK(compute_s < 2.0);
    CHECK(param_bytes > 1000000);   // millions of parameters
  }
}
