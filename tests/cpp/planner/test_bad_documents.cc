// Documents that are not documents: an empty, whitespace-only, `null` or non-object
// file is reported saying WHICH kind of document it is, for every loader; and the inputs the
// fuzzer (tests/fuzz, `make fuzz`) found, kept here as regressions.
#include <sstream>
#include <string>

#include "catch.h"
#include "common/json_io.h"
#include "model_fixtures.h"
#include "planner/documents/cluster.h"
#include "planner/documents/graph.h"
#include "planner/documents/job.h"
#include "planner/documents/pipedream_import.h"
#include "planner/documents/plan.h"
#include "planner/documents/problem.h"
#include "planner/searches/search.h"

using namespace hybridplan;
using hybridplan::test::input_error_of;
using hybridplan::test::write_file;
using Catch::Matchers::Contains;

namespace {

struct Loader {
  const char* document;
  std::function<void(const std::string&)> load;
};

const Loader kLoaders[] = {
    {"graph", [](const std::string& p) { load_graph(p); }},
    {"cluster", [](const std::string& p) { load_cluster(p); }},
    {"job", [](const std::string& p) { load_job(p); }},
    {"plan", [](const std::string& p) { load_plan(p); }},
};

}  // namespace

TEST_CASE("bad documents: an empty or whitespace-only file names its kind") {
  for (const Loader& loader : kLoaders) {
    for (const char* text : {"", "  \n\t\r\n"}) {
      const std::string path = write_file(std::string("empty-") + loader.document + ".json", text);
      INFO(loader.document << " <- '" << text << "'");
      CHECK(input_error_of([&] { loader.load(path); }) ==
            std::string(loader.document) + " file " + path + " is empty");
    }
  }
}

TEST_CASE("bad documents: null or a non-object names its kind") {
  for (const Loader& loader : kLoaders) {
    for (const auto& [text, shown] : std::vector<std::pair<std::string, std::string>>{
             {"null", "null"}, {"[1, 2]", "[1,2]"}, {"3", "3"}, {"\"graph\"", "\"graph\""}}) {
      const std::string path = write_file(std::string("scalar-") + loader.document + ".json", text);
      INFO(loader.document << " <- " << text);
      CHECK(input_error_of([&] { loader.load(path); }) ==
            std::string(loader.document) + " file " + path + ": expected a JSON object (got " +
                shown + ")");
    }
  }
}

TEST_CASE("bad documents: a document parsed from text under a bare name reads naturally") {
  // Python passes text with the source "graph"; that must not read "graph file graph".
  CHECK(input_error_of([] { graph_from_json(Json(nullptr), "graph"); }) ==
        "graph: expected a JSON object (got null)");
  CHECK(input_error_of([] { cluster_from_json(Json::array(), "cluster"); }) ==
        "cluster: expected a JSON object (got [])");
}

TEST_CASE("bad documents: a syntax error still names the file, line and column") {
  const std::string path = write_file("truncated-graph.json", "{\"schema_version\": 1,\n");
  CHECK_THAT(input_error_of([&] { load_graph(path); }),
             Contains(path + ": invalid JSON: parse error at line 2, column 1"));
}

// ---- PipeDream importer: numbers that overflow (found by fuzzing) ----------------------------

namespace {

std::string pipedream_error(const std::string& text) {
  std::istringstream in(text);
  return input_error_of([&] { import_pipedream(in, "fuzz.graph.txt", 64); });
}

std::string node_line(const std::string& node, const std::string& activation = "1.0",
                      const std::string& forward = "1.0") {
  return node + " -- ReLU -- forward_compute_time=" + forward +
         ", backward_compute_time=0, activation_size=" + activation + ", parameter_size=0\n";
}

}  // namespace

TEST_CASE("pipedream import: a node number beyond 64 bits is bad input, not a crash") {
  // std::stoll threw std::out_of_range here, which the CLI reported as an unexpected error.
  CHECK(pipedream_error(node_line("node99999999999999999999")) ==
        "fuzz.graph.txt:1: node number must fit in a 64-bit integer (got 'node99999999999999999999')");
  CHECK(pipedream_error(node_line("node1") + "\tnode1 -- node123456789012345678901234\n") ==
        "fuzz.graph.txt:2: node number must fit in a 64-bit integer (got 'node123456789012345678901234')");
  // The largest int64 is still a valid node number.
  std::istringstream ok(node_line("node9223372036854775807"));
  CHECK(import_pipedream(ok, "ok.graph.txt", 64).nodes.at(0).id == INT64_MAX);
}

TEST_CASE("pipedream import: sizes and times that overflow are bad input") {
  // llround(1e300) is undefined (FE_INVALID, an arbitrary int64): now rejected with the rule.
  CHECK(pipedream_error(node_line("node1", "1e300")) ==
        "fuzz.graph.txt:1: activation_size must be at most 2^53 bytes (got '1e300')");
  CHECK(pipedream_error(node_line("node1", "[9e15; 9e15]")) ==
        "fuzz.graph.txt:1: activation_size must be at most 2^53 bytes (got '[9e15; 9e15]')");
  CHECK(pipedream_error(node_line("node1", "1.0", "1e999")) ==
        "fuzz.graph.txt:1: forward_compute_time must be a finite number >= 0 (got '1e999')");
  CHECK(pipedream_error(node_line("node1", "1.0", "inf")) ==
        "fuzz.graph.txt:1: forward_compute_time must be a finite number >= 0 (got 'inf')");
  CHECK(pipedream_error(node_line("node1", "1.0", "1.0x")) ==
        "fuzz.graph.txt:1: forward_compute_time must be a number (got '1.0x')");
  // A lone '[' is not a list (t.back() == '[' is both ends).
  CHECK(pipedream_error(node_line("node1", "[")) ==
        "fuzz.graph.txt:1: activation_size list must end with ']' (got '[')");
}

// ---- sizes that overflowed the planner's int64 arithmetic (found reading the loaders for
// this issue; before the bounds, `hybridplan plan` with the job below never returned, and a plan
// with dp = mp = 2^40 and world_size 0 passed the dp * mp check): bounded by common/limits.h -

namespace {

Json example(const std::string& name) {
  return read_json_file((hybridplan::test::source_dir() / "examples" / name).string());
}

Json four_device_cluster_json() {
  return Json::parse(R"({"schema_version": 1, "kind": "hybridplan.cluster", "name": "c",
      "num_nodes": 2, "devices_per_node": 2, "device": {"name": "d", "memory_bytes": 17179869184},
      "intra_node": {"bandwidth_bytes_per_s": 1e10, "latency_s": 5e-06},
      "inter_node": {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-05}})");
}

}  // namespace

TEST_CASE("limits: batch sizes beyond 2^24 are bad input") {
  // {"min": 1, "max": 2^63-1} doubled a batch past INT64_MAX (signed overflow, then no end).
  Json job = example("job-imagenet.json");
  job.erase("global_batch");
  job["per_replica_batch"] = {{"min", 1}, {"max", INT64_MAX}};
  CHECK(input_error_of([&] { job_from_json(job, "job.json"); }) ==
        "job.json: per_replica_batch.max must be at most 16777216 (2^24 samples) (got 9223372036854775807)");
  job["per_replica_batch"] = {{"min", 1}, {"max", 16777216}};
  CHECK(job_from_json(job, "job.json").per_replica_batches.back() == 16777216);

  Json graph = example("graph-tiny.json");
  graph["profiled"]["batch_size"] = int64_t{1} << 40;
  CHECK(input_error_of([&] { graph_from_json(graph, "graph.json"); }) ==
        "graph.json: profiled.batch_size must be at most 16777216 (2^24 samples) (got 1099511627776)");
}

TEST_CASE("limits: device counts beyond 2^20 are bad input, checked before multiplying") {
  Json cluster = four_device_cluster_json();
  // 2^40 nodes: num_devices() = num_nodes * devices_per_node could overflow, and the search
  // would build meshes for that many devices.
  cluster["num_nodes"] = int64_t{1} << 40;
  CHECK(input_error_of([&] { cluster_from_json(cluster, "c.json"); }) ==
        "c.json: num_nodes must be at most 1048576 (2^20 devices) (got 1099511627776)");
  cluster["num_nodes"] = 1 << 19;
  cluster["devices_per_node"] = 4;
  CHECK(input_error_of([&] { cluster_from_json(cluster, "c.json"); }) ==
        "c.json: num_nodes * devices_per_node must be at most 1048576 (2^20 devices) (got 2097152)");

  // dp * mp of 2^40 * 2^40 overflowed int64 in validate_structure (wrapping to 0).
  const std::string plan_path = (hybridplan::test::source_dir() / "tests/fuzz/seeds/plan/tiny-dgx1-7.json").string();
  Json plan = read_json_file(plan_path);
  plan["dp"] = int64_t{1} << 40;
  plan["mp"] = int64_t{1} << 40;
  CHECK(input_error_of([&] { plan_from_json(plan, "plan.json"); }) ==
        "plan.json: dp must be at most 1048576 (2^20 devices) (got 1099511627776)");
  plan["dp"] = 2;
  plan["per_replica_batch"] = INT64_MAX;
  CHECK(input_error_of([&] { plan_from_json(plan, "plan.json"); }) ==
        "plan.json: mp must be at most 1048576 (2^20 devices) (got 1099511627776)");
  plan["mp"] = 2;
  CHECK(input_error_of([&] { plan_from_json(plan, "plan.json"); }) ==
        "plan.json: per_replica_batch must be at most 16777216 (2^24 samples) (got 9223372036854775807)");
}

// Found by probing of the ASan/UBSan CLI (extreme values in every field):
// signed overflow summing param_bytes (evaluate.cc) and in memory_cost, steps_per_epoch adding a
// batch to INT64_MAX samples, and a heap read of an empty optional in the placement search when
// node times of 1e308 s made every contiguous split's cost infinite.
TEST_CASE("limits: bytes, samples and seconds beyond the documented bounds are bad input") {
  Json graph = example("graph-tiny.json");
  graph["nodes"][1]["param_bytes"] = INT64_MAX;
  CHECK(input_error_of([&] { graph_from_json(graph, "graph.json"); }) ==
        "graph.json: nodes[1].param_bytes must be at most 1125899906842624 (2^50 bytes) (got 9223372036854775807)");
  graph = example("graph-tiny.json");
  for (Json& node : graph["nodes"]) node["param_bytes"] = int64_t{1} << 49;  // each fine, the sum not
  CHECK(input_error_of([&] { graph_from_json(graph, "graph.json"); }) ==
        "graph.json: the nodes' total param_bytes must be at most 1125899906842624 (2^50 bytes) (got 1688849860263936)");
  graph = example("graph-tiny.json");
  graph["nodes"][2]["forward_s"] = 1e308;
  CHECK(input_error_of([&] { graph_from_json(graph, "graph.json"); }) ==
        "graph.json: nodes[2].forward_s must be at most 1e9 s (got 1e+308)");

  Json cluster = four_device_cluster_json();
  cluster["device"]["memory_bytes"] = INT64_MAX;
  CHECK(input_error_of([&] { cluster_from_json(cluster, "c.json"); }) ==
        "c.json: device.memory_bytes must be at most 1125899906842624 (2^50 bytes) (got 9223372036854775807)");

  Json job = example("job-imagenet.json");
  job["samples_per_epoch"] = INT64_MAX;
  CHECK(input_error_of([&] { job_from_json(job, "job.json"); }) ==
        "job.json: samples_per_epoch must be at most 1125899906842624 (2^50 samples) (got 9223372036854775807)");
}

TEST_CASE("limits: the largest allowed sizes plan without overflow (run under UBSan by make test-asan)") {
  // Every node at the bounds at once: 1e9 s, and bytes whose totals reach 2^50.
  Json graph = example("graph-tiny.json");
  const auto n = static_cast<int64_t>(graph["nodes"].size());
  for (Json& node : graph["nodes"]) {
    node["forward_s"] = 1e9;
    node["backward_s"] = 1e9;
    node["param_bytes"] = (int64_t{1} << 50) / n;
    node["output_bytes"] = (int64_t{1} << 50) / n;
  }
  Problem problem;
  problem.graph = graph_from_json(graph, "graph.json");
  problem.cluster = cluster_from_json(four_device_cluster_json(), "c.json");
  problem.job = job_from_json(example("job-imagenet.json"), "job.json");
  SearchOptions options;
  options.top_k = 3;
  // Nothing fits 16 GiB devices: the search says so (InfeasibleError) or returns infeasible
  // plans; it must not overflow, read out of bounds or report an internal error.
  try {
    const SearchResult result = search(problem, options);
    for (const Plan& p : result.plans) CHECK(!p.predicted.feasible);
  } catch (const InfeasibleError&) {
    SUCCEED("infeasible, as expected");
  }
}
