// The `hybridplan` binary end to end (path from $HYBRIDPLAN_CLI, set by ctest): every
// subcommand's happy path, exit 2 for bad input and exit 3 for infeasible requests with their
// messages, and --out never leaving a partial file.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <vector>

#include "catch.h"
#include "common/json_io.h"
#include "model_fixtures.h"
#include "planner/documents/plan.h"

using namespace hybridplan;
using hybridplan::test::source_dir;
namespace fs = std::filesystem;
using Catch::Matchers::Contains;

namespace {

struct CliResult {
  int status = -1;     // exit status
  std::string output;  // stdout and stderr together
};

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += (c == '\'') ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string cli_path() {
  const char* env = std::getenv("HYBRIDPLAN_CLI");
  return env ? env : "";
}

// Runs `[env_prefix] hybridplan args...` through the shell, capturing both streams.
CliResult run_cli(const std::vector<std::string>& args, const std::string& env_prefix = "") {
  std::string command = env_prefix + " " + quote(cli_path());
  for (const std::string& a : args) command += " " + quote(a);
  command += " 2>&1";
  CliResult r;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) r.output.append(buffer, n);
  const int status = ::pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

// A fresh directory per test case, removed when the test binary exits.
fs::path temp_dir(const std::string& name) {
  struct Cleanup {
    std::vector<fs::path> dirs;
    ~Cleanup() {
      for (const auto& dir : dirs) {
        std::error_code ignored;
        fs::remove_all(dir, ignored);
      }
    }
  };
  static Cleanup cleanup;
  const fs::path dir = fs::temp_directory_path() /
                       ("hp-cli-" + std::to_string(::getpid()) + "-" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  cleanup.dirs.push_back(dir);
  return dir;
}

std::string write(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
  return path.string();
}

const std::string kGraph = (source_dir() / "examples/graph-tiny.json").string();
const std::string kJob = (source_dir() / "examples/job-imagenet.json").string();

// Two nodes of four devices: small enough to search in milliseconds.
std::string four_device_cluster(const fs::path& dir, int64_t memory_bytes = 17179869184) {
  return write(dir / "cluster.json",
               R"({"schema_version": 1, "kind": "hybridplan.cluster", "name": "two_by_two",
                   "num_nodes": 2, "devices_per_node": 2,
                   "device": {"name": "test", "memory_bytes": )" +
                   std::to_string(memory_bytes) + R"(, "peak_flops": 1e12},
                   "intra_node": {"bandwidth_bytes_per_s": 1e10, "latency_s": 5e-06},
                   "inter_node": {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-05}})");
}

}  // namespace

TEST_CASE("cli: the binary is there") {
  INFO("HYBRIDPLAN_CLI=" << cli_path());
  REQUIRE(!cli_path().empty());
  REQUIRE(fs::exists(cli_path()));
  const CliResult r = run_cli({"--help"});
  CHECK(r.status == 0);
  for (const char* sub : {"plan", "evaluate", "explain", "sweep", "presets", "import-pipedream", "probe",
                          "calibrate", "validate"}) {
    CHECK_THAT(r.output, Contains(sub));
  }
}

TEST_CASE("cli presets") {
  const CliResult r = run_cli({"presets"});
  REQUIRE(r.status == 0);
  CHECK_THAT(r.output, Contains("dgx1-v100") && Contains("hybrid cube-mesh"));
  const CliResult j = run_cli({"presets", "--json"});
  REQUIRE(j.status == 0);
  const Json presets = Json::parse(j.output);
  REQUIRE(presets.is_array());
  CHECK(presets.size() >= 6);
  for (const Json& p : presets) {
    CHECK(!p["name"].get<std::string>().empty());
    CHECK(!p["description"].get<std::string>().empty());
    CHECK(p["devices"].get<int64_t>() >= 1);
  }
}

TEST_CASE("cli plan, evaluate, explain: happy path") {
  const fs::path dir = temp_dir("plan");
  const std::string cluster = four_device_cluster(dir);
  const std::string out = (dir / "best.json").string();

  const CliResult table = run_cli({"plan", "--graph", kGraph, "--cluster", cluster, "--job", kJob,
                                   "--top", "3", "--out", out});
  INFO(table.output);
  REQUIRE(table.status == 0);
  for (const char* column : {"rank", "dp", "mp", "mode", "schedule", "global batch", "step",
                             "compute", "all-reduce", "bubble", "max mem/device", "epochs",
                             "time-to-train"}) {
    CHECK_THAT(table.output, Contains(column));
  }
  REQUIRE(fs::exists(out));
  const Plan best = load_plan(out);
  CHECK(best.world_size == 4);

  const CliResult json = run_cli({"plan", "--graph", kGraph, "--cluster", cluster, "--job", kJob,
                                  "--top", "3", "--json"});
  REQUIRE(json.status == 0);
  const Json plans = Json::parse(json.output);
  REQUIRE(plans.is_array());
  REQUIRE(!plans.empty());
  CHECK(plans.size() <= 3);
  CHECK(plans[0]["kind"] == "hybridplan.plan");
  CHECK(plans[0]["dp"] == best.dp);
  CHECK(plans[0]["mp"] == best.mp);
  for (size_t i = 1; i < plans.size(); ++i) {  // ranked: time to train never decreases
    CHECK(plans[i]["predicted"]["time_to_train_s"].get<double>() >=
          plans[i - 1]["predicted"]["time_to_train_s"].get<double>());
  }

  // --devices restricts the world size
  const CliResult two = run_cli({"plan", "--graph", kGraph, "--cluster", cluster, "--devices", "2",
                                 "--json"});
  REQUIRE(two.status == 0);
  for (const Json& p : Json::parse(two.output)) CHECK(p["world_size"] == 2);

  // evaluate re-derives the same prediction search ranked by
  const CliResult eval = run_cli({"evaluate", "--graph", kGraph, "--cluster", cluster, "--job",
                                  kJob, "--plan", out, "--json"});
  REQUIRE(eval.status == 0);
  const Json evaluated = Json::parse(eval.output);
  CHECK(evaluated["predicted"]["step_s"].get<double>() ==
        Approx(plans[0]["predicted"]["step_s"].get<double>()));
  CHECK(evaluated["predicted"]["time_to_train_s"].get<double>() ==
        Approx(plans[0]["predicted"]["time_to_train_s"].get<double>()));
  const CliResult breakdown = run_cli({"evaluate", "--graph", kGraph, "--cluster", cluster,
                                       "--job", kJob, "--plan", out});
  REQUIRE(breakdown.status == 0);
  CHECK_THAT(breakdown.output, Contains("step") && Contains("all-reduce") &&
                                   Contains("time to train") && Contains("feasible: yes"));

  const CliResult plain = run_cli({"explain", out});
  INFO(plain.output);
  CHECK(plain.status == 0);
  CHECK_THAT(plain.output, Contains("stem.conv"));
  const CliResult full = run_cli({"explain", out, "--graph", kGraph, "--cluster", cluster});
  CHECK(full.status == 0);
  CHECK_THAT(full.output, Contains("stem.conv"));
}

TEST_CASE("cli sweep --json") {
  const fs::path dir = temp_dir("sweep");
  const std::string cluster = four_device_cluster(dir);
  const std::string csv = (dir / "sweep.csv").string();
  const CliResult r = run_cli({"sweep", "--graph", kGraph, "--cluster", cluster, "--job", kJob,
                               "--max-devices", "4", "--json", "--csv", csv});
  INFO(r.output);
  REQUIRE(r.status == 0);
  const Json points = Json::parse(r.output);
  REQUIRE(points.size() == 3);
  int64_t expected_devices = 1;
  for (const Json& point : points) {
    CHECK(point["devices"] == expected_devices);
    for (const char* which : {"dp_only", "best"}) {
      const Json& s = point[which];
      REQUIRE(s.is_object());
      for (const char* field : {"dp", "mp", "mode", "global_batch", "step_s", "time_to_train_s",
                                "samples_per_s"}) {
        INFO(which << "." << field);
        CHECK(s.contains(field));
      }
      CHECK(s["dp"].get<int64_t>() * s["mp"].get<int64_t>() == expected_devices);
    }
    CHECK(point["dp_only"]["dp"] == expected_devices);
    CHECK(point["dp_only"]["mp"] == 1);
    CHECK(point["best"]["time_to_train_s"].get<double>() <=
          point["dp_only"]["time_to_train_s"].get<double>() * (1 + 1e-12));
    expected_devices *= 2;
  }
  REQUIRE(fs::exists(csv));
  std::ifstream in(csv);
  std::string header;
  std::getline(in, header);
  CHECK(header.rfind("devices,dp_only_dp,", 0) == 0);

  const CliResult table = run_cli({"sweep", "--graph", kGraph, "--cluster", cluster, "--job", kJob,
                                   "--max-devices", "2"});
  REQUIRE(table.status == 0);
  CHECK_THAT(table.output, Contains("N=2") && Contains("DP only") && Contains("speedup"));
}

TEST_CASE("cli sweep --plot") {
  const fs::path dir = temp_dir("plot");
  const std::string cluster = four_device_cluster(dir);
  const std::string png = (dir / "speedup.png").string();
  const std::vector<std::string> args = {"sweep", "--graph", kGraph, "--cluster", cluster, "--job",
                                         kJob, "--max-devices", "4", "--plot", png};

  // No python: exit 2 saying what is missing.
  const CliResult no_python = run_cli(args, "env HYBRIDPLAN_PYTHON=/nonexistent/python3");
  CHECK(no_python.status == 2);
  CHECK_THAT(no_python.output, Contains("--plot: /nonexistent/python3 not found"));

  // No matplotlib: a stand-in package that fails to import shadows the real one.
  fs::create_directories(dir / "fake/matplotlib");
  write(dir / "fake/matplotlib/__init__.py", "raise ImportError('no matplotlib here')\n");
  const CliResult no_matplotlib =
      run_cli(args, "env PYTHONPATH=" + quote((dir / "fake").string()) + ":\"$PYTHONPATH\"");
  CHECK(no_matplotlib.status == 2);
  CHECK_THAT(no_matplotlib.output, Contains("matplotlib is not installed"));
  CHECK(!fs::exists(png));

  const CliResult ok = run_cli(args);
  INFO(ok.output);
  REQUIRE(ok.status == 0);
  REQUIRE(fs::exists(png));
  std::ifstream in(png, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  CHECK(std::string(magic + 1, 3) == "PNG");
  // the temporary sweep data is cleaned up
  for (const auto& entry : fs::directory_iterator(dir)) {
    CHECK(entry.path().filename().string().find(".sweep-") == std::string::npos);
  }
}

TEST_CASE("cli import-pipedream") {
  const fs::path dir = temp_dir("import");
  const std::string profile = write(
      dir / "toy.graph.txt",
      "node1 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, "
      "activation_size=602112.0, parameter_size=0.000\n"
      "node2 -- Conv2d(3, 64) -- forward_compute_time=2.000, backward_compute_time=4.000, "
      "activation_size=3211264.0, parameter_size=7168.000\n"
      "node3 -- Linear(in_features=64, out_features=10) -- forward_compute_time=0.500, "
      "backward_compute_time=1.000, activation_size=2560.0, parameter_size=2600.000\n"
      "\tnode1 -- node2\n\tnode2 -- node3\n");
  const std::string out = (dir / "toy.json").string();
  const CliResult r = run_cli({"import-pipedream", profile, "--out", out, "--batch-size", "32",
                               "--name", "toy_model"});
  INFO(r.output);
  REQUIRE(r.status == 0);
  const Json g = read_json_file(out);
  CHECK(g["kind"] == "hybridplan.graph");
  CHECK(g["name"] == "toy_model");
  CHECK(g["profiled"]["batch_size"] == 32);
  CHECK(g["nodes"].size() == 3);

  const CliResult bad = run_cli({"import-pipedream", (dir / "missing.txt").string(), "--out", out});
  CHECK(bad.status == 2);
  CHECK_THAT(bad.output, Contains("missing.txt: cannot open"));
  const CliResult help = run_cli({"import-pipedream", "--help"});
  CHECK_THAT(help.output, Contains("do not state"));
}

TEST_CASE("cli: bad input exits 2 naming the file, JSON path and rule") {
  const fs::path dir = temp_dir("bad");
  const std::string cluster = four_device_cluster(dir);
  Json graph = read_json_file(kGraph);
  graph["nodes"][3]["forward_s"] = -1;
  const std::string bad_graph = write(dir / "bad-graph.json", graph.dump());
  const std::string out = (dir / "plan.json").string();

  const CliResult r = run_cli({"plan", "--graph", bad_graph, "--cluster", cluster, "--out", out});
  CHECK(r.status == 2);
  CHECK_THAT(r.output, Contains("bad-graph.json") && Contains("nodes[3].forward_s"));
  CHECK_THAT(r.output, !Contains("terminate") && !Contains("Aborted"));
  CHECK(!fs::exists(out));

  const CliResult preset = run_cli({"plan", "--graph", kGraph, "--cluster", "dgx9-z100"});
  CHECK(preset.status == 2);
  CHECK_THAT(preset.output, Contains("'dgx9-z100' is neither a file nor a preset name") &&
                                Contains("dgx1-v100"));

  const CliResult syntax = run_cli({"plan", "--graph", write(dir / "syntax.json", "{\"nodes\": ["),
                                    "--cluster", cluster});
  CHECK(syntax.status == 2);
  CHECK_THAT(syntax.output, Contains("syntax.json"));

  const CliResult missing_flag = run_cli({"plan", "--graph", kGraph});
  CHECK(missing_flag.status == 2);
  CHECK_THAT(missing_flag.output, Contains("--cluster"));

  const CliResult too_many = run_cli({"plan", "--graph", kGraph, "--cluster", cluster, "--devices", "64"});
  CHECK(too_many.status == 2);
  CHECK_THAT(too_many.output, Contains("--devices must be <= 4") && Contains("(got 64)"));

  const CliResult unknown_sub = run_cli({"frobnicate"});
  CHECK(unknown_sub.status == 2);

  // A plan made for another graph is rejected by evaluate.
  const std::string plan_out = (dir / "good.json").string();
  REQUIRE(run_cli({"plan", "--graph", kGraph, "--cluster", cluster, "--out", plan_out}).status == 0);
  Json other = read_json_file(kGraph);
  other["nodes"][1]["forward_s"] = 0.5;
  const CliResult wrong_graph = run_cli({"evaluate", "--graph", write(dir / "other.json", other.dump()),
                                         "--cluster", cluster, "--plan", plan_out});
  CHECK(wrong_graph.status == 2);
  CHECK_THAT(wrong_graph.output, Contains("good.json"));
}

TEST_CASE("cli plan --sequence-parallel: searched, written, explained") {
  const fs::path dir = temp_dir("sp");
  const std::string cluster = four_device_cluster(dir);
  // ln (per-token) -> fc1 (colwise) -> fc2 (rowwise) -> head (gathers), all splitting in two
  Graph g = test::make_graph({{"ln", 1e-3, 2e-3, 1024, 1 << 20},
                              {"fc1", 4e-3, 8e-3, 1 << 20, 1 << 20},
                              {"fc2", 4e-3, 8e-3, 1 << 20, 1 << 20},
                              {"head", 1e-3, 2e-3, 1024, 1 << 20}},
                             {{0, 1, 1 << 20}, {1, 2, 1 << 20}, {2, 3, 1 << 20}}, 8, "sp_chain");
  const auto sp = [](SpRole role, std::vector<TpCollective> forward, std::vector<TpCollective> backward) {
    SequenceParallel s;
    s.role = role;
    s.max_degree = 2;
    s.forward_collectives = std::move(forward);
    s.backward_collectives = std::move(backward);
    return s;
  };
  const TpCollective gather{Collective::kAllGather, 1 << 20}, scatter{Collective::kReduceScatter, 1 << 20};
  for (const NodeIndex v : {1, 2}) {
    TensorParallel tp;
    tp.style = v == 1 ? TpStyle::kColwise : TpStyle::kRowwise;
    tp.max_degree = 2;
    tp.split_param_bytes = 1 << 20;
    tp.activation_split = true;
    (v == 1 ? tp.backward_collective : tp.forward_collective) = TpCollective{Collective::kAllReduce, 1 << 20};
    g.nodes[v].tensor_parallel = tp;
  }
  g.nodes[0].sequence_parallel = sp(SpRole::kPerToken, {}, {{Collective::kAllReduce, 1024}});
  g.nodes[1].sequence_parallel = sp(SpRole::kColwise, {gather}, {scatter});
  g.nodes[2].sequence_parallel = sp(SpRole::kRowwise, {scatter}, {gather});
  g.nodes[3].sequence_parallel = sp(SpRole::kGather, {gather}, {scatter});
  g.finalize("sp_chain");
  const std::string graph = (dir / "sp.json").string();
  save_graph(g, graph);
  const std::string out = (dir / "plan.json").string();

  const CliResult on = run_cli({"plan", "--graph", graph, "--cluster", cluster, "--tp", "2",
                                "--sequence-parallel", "on", "--out", out});
  INFO(on.output);
  REQUIRE(on.status == 0);
  CHECK_THAT(on.output, Contains("2 sp"));
  CHECK(read_json_file(out)["sequence_parallel"] == true);
  const CliResult json = run_cli({"plan", "--graph", graph, "--cluster", cluster, "--tp", "2",
                                  "--sequence-parallel", "off", "--json"});
  REQUIRE(json.status == 0);
  for (const Json& p : Json::parse(json.output)) CHECK(!p.contains("sequence_parallel"));
  const CliResult eval = run_cli({"evaluate", "--graph", graph, "--cluster", cluster, "--plan", out});
  CHECK(eval.status == 0);
  CHECK_THAT(eval.output, Contains("x tp=2 sp") && Contains("sequence-parallel"));
  const CliResult text = run_cli({"explain", out, "--graph", graph, "--cluster", cluster});
  CHECK(text.status == 0);
  CHECK_THAT(text.output, Contains("x tp 2 sp") && Contains("sequence parallel"));

  const CliResult bad = run_cli({"plan", "--graph", graph, "--cluster", cluster, "--sequence-parallel", "maybe"});
  CHECK(bad.status == 2);
  CHECK_THAT(bad.output, Contains("--sequence-parallel"));
  const CliResult none = run_cli({"plan", "--graph", kGraph, "--cluster", cluster, "--sequence-parallel", "on"});
  CHECK(none.status == 2);
  CHECK_THAT(none.output, Contains("sequence_parallel must be \"auto\" or \"off\""));
}

TEST_CASE("cli: infeasible exits 3 saying what does not fit; --out is left alone") {
  const fs::path dir = temp_dir("infeasible");
  const std::string tiny_memory = four_device_cluster(dir, 1000000);  // 1 MB per device
  const std::string out = (dir / "plan.json").string();
  const CliResult r = run_cli({"plan", "--graph", kGraph, "--cluster", tiny_memory, "--job", kJob,
                               "--out", out});
  INFO(r.output);
  CHECK(r.status == 3);
  CHECK_THAT(r.output, Contains("infeasible"));
  CHECK_THAT(r.output, Contains("MiB") || Contains("KiB") || Contains("GiB"));  // by how much
  // no partial or temporary file is left behind
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);  // cluster.json

  // evaluate of a plan that fits 16 GiB but not 1 MB
  const std::string roomy = four_device_cluster(temp_dir("roomy"));
  const std::string plan_path = (dir / "roomy-plan.json").string();
  REQUIRE(run_cli({"plan", "--graph", kGraph, "--cluster", roomy, "--out", plan_path}).status == 0);
  const CliResult eval = run_cli({"evaluate", "--graph", kGraph, "--cluster", tiny_memory,
                                  "--plan", plan_path});
  CHECK(eval.status == 3);
  CHECK_THAT(eval.output, Contains("feasible: no"));
}

TEST_CASE("cli probe and calibrate without torchrun, validate without python, exit 2") {
  for (const char* sub : {"probe", "calibrate"}) {
    const CliResult r = run_cli({sub, "--nproc-per-node", "2"}, "env PATH=/nonexistent");
    CHECK(r.status == 2);
    CHECK_THAT(r.output, Contains("torchrun not found on PATH"));
  }
  const CliResult v = run_cli({"validate"}, "env PATH=/nonexistent");
  CHECK(v.status == 2);
  CHECK_THAT(v.output, Contains("python3 not found on PATH"));
}

// Every published PipeDream profile imports and plans on a DGX-1 V100 cluster.
TEST_CASE("cli: PipeDream profiles plan on dgx1-v100") {
  const char* env = std::getenv("HYBRIDPLAN_PIPEDREAM_PROFILES");
  const fs::path profiles = (env && *env) ? fs::path(env)
                                          : source_dir() / "../shared/data/pipedream-profiles";
  if (!fs::exists(profiles / "vgg16.graph.txt")) {
    WARN("SKIPPED: no PipeDream profiles at " << profiles.string()
         << " (set HYBRIDPLAN_PIPEDREAM_PROFILES; they come from PipeDream's repository, "
            "msr-fiddle/pipedream, profiler/*/profiles/<model>/graph.txt)");
    return;
  }
  const fs::path dir = temp_dir("pipedream");
  for (const char* model : {"alexnet", "vgg16", "resnet50", "inception_v3", "gnmt", "gnmt_large"}) {
    INFO(model);
    const std::string graph = (dir / (std::string(model) + ".json")).string();
    const CliResult imported = run_cli(
        {"import-pipedream", (profiles / (std::string(model) + ".graph.txt")).string(), "--out", graph});
    REQUIRE(imported.status == 0);
    const CliResult planned = run_cli({"plan", "--graph", graph, "--cluster", "dgx1-v100",
                                       "--job", kJob, "--top", "3"});
    INFO(planned.output);
    CHECK(planned.status == 0);
    CHECK_THAT(planned.output, Contains("rank"));
  }
}

TEST_CASE("cli sweep: exit 3 when nothing fits on any device count") {
  const fs::path dir = temp_dir("sweep-infeasible");
  const std::string tiny_memory = four_device_cluster(dir, 1000000);
  const CliResult r = run_cli({"sweep", "--graph", kGraph, "--cluster", tiny_memory, "--job", kJob,
                               "--max-devices", "4"});
  CHECK(r.status == 3);
  CHECK_THAT(r.output, Contains("nothing fits on any device count up to 4") && Contains("over by"));
}

// The documented flags (docs/design.md "Interfaces"): renaming one breaks users' scripts.
TEST_CASE("cli: documented flags are accepted") {
  const std::map<std::string, std::vector<std::string>> flags = {
      {"plan", {"--graph", "--cluster", "--job", "--devices", "--top", "--out", "--json", "--tp",
                "--sequence-parallel"}},
      {"evaluate", {"--graph", "--cluster", "--job", "--plan", "--json"}},
      {"explain", {"--graph", "--cluster", "--job"}},
      {"sweep", {"--graph", "--cluster", "--job", "--max-devices", "--csv", "--plot", "--json"}},
      {"presets", {"--json"}},
      {"import-pipedream", {"--out", "--batch-size", "--name"}},
      {"probe", {"--nproc-per-node"}},
      {"calibrate", {"--nproc-per-node"}}};
  for (const auto& [sub, names] : flags) {
    const CliResult help = run_cli({sub, "--help"});
    INFO(sub << "\n" << help.output);
    CHECK(help.status == 0);
    for (const std::string& name : names) CHECK_THAT(help.output, Contains(name));
  }
  const CliResult job_alone = run_cli({"explain", "plan.json", "--job", kJob});
  CHECK(job_alone.status == 2);
  CHECK_THAT(job_alone.output, Contains("--job requires --cluster"));
}

// ---- mutated documents: a clear error, never a crash -----------------------------------------
// N seeded random mutations of a Graph, Cluster, Job or Plan file (text-level: truncation, byte
// deletion/insertion/duplication; JSON-level: a value replaced by an extreme or wrong-typed one,
// a member or element removed or doubled). Mutated graph/cluster/job files go through `plan`,
// mutated plans through `evaluate` and `explain`. Each call must end with exit 0, 2 (bad input,
// and then its message names the mutated file) or 3 (infeasible: the CLI's answer when, say,
// memory_bytes shrank below the model), within a timeout, and never with a signal, exit 1,
// "internal error" or "unexpected error". Run under build-asan/ by `make test-asan` too.

namespace {

// Every value's JSON pointer (containers included), in document order.
void collect_pointers(const Json& j, const Json::json_pointer& at, std::vector<Json::json_pointer>& out) {
  out.push_back(at);
  if (j.is_object()) {
    for (const auto& [key, value] : j.items()) collect_pointers(value, at / key, out);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) collect_pointers(j[i], at / i, out);
  }
}

Json extreme_value(std::mt19937& rng) {
  const std::vector<Json> values = {
      Json(-1), Json(0), Json(1), Json(2), Json(-0.0), Json(0.5), Json(1e308), Json(-1e308),
      Json(5e-324), Json(1e19), Json(INT64_MAX), Json(INT64_MIN), Json(UINT64_MAX), Json(1e9),
      Json("x"), Json(""), Json(nullptr), Json::array(), Json::object(), Json(true),
      Json::array({0, 1}), Json("pipeline"), Json("1f1b"), Json("node0")};
  return values[std::uniform_int_distribution<size_t>(0, values.size() - 1)(rng)];
}

std::string mutate_json(const Json& doc, std::mt19937& rng) {
  Json j = doc;
  std::vector<Json::json_pointer> pointers;
  collect_pointers(j, Json::json_pointer(), pointers);
  const Json::json_pointer at =
      pointers[std::uniform_int_distribution<size_t>(1, pointers.size() - 1)(rng)];
  Json& parent = j[at.parent_pointer()];
  switch (std::uniform_int_distribution<int>(0, 3)(rng)) {
    case 0:
    case 1:
      j[at] = extreme_value(rng);
      break;
    case 2:  // remove the member / element
      if (parent.is_object()) {
        parent.erase(at.back());
      } else {
        parent.erase(static_cast<size_t>(std::stoul(at.back())));
      }
      break;
    default:  // double it (an array element; an object member gets a neighbour's value)
      if (parent.is_array()) {
        parent.insert(parent.begin() + static_cast<std::ptrdiff_t>(std::stoul(at.back())), j[at]);
      } else {
        j[at] = parent;  // nests the parent inside itself once
      }
  }
  return j.dump(1);
}

std::string mutate_text(const std::string& text, std::mt19937& rng) {
  std::string s = text;
  auto pos = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n)(rng); };
  static const std::string kBytes = "{}[]:,\"0123456789-+.eE \n\t\\nul\x01\xff";
  switch (std::uniform_int_distribution<int>(0, 5)(rng)) {
    case 0: s.resize(pos(s.size())); break;                                   // truncated
    case 1: { const size_t a = pos(s.size()); s.erase(a, pos(16)); break; }  // bytes deleted
    case 2: s.insert(pos(s.size()), 1, kBytes[pos(kBytes.size() - 1)]); break;
    case 3: { const size_t a = pos(s.size()); s.insert(a, s.substr(a, pos(64))); break; }
    case 4: if (!s.empty()) s[pos(s.size() - 1)] = kBytes[pos(kBytes.size() - 1)]; break;
    default: {
      static const char* const kWhole[] = {"", " \n", "null", "[]", "0", "\"graph\"", "{}"};
      s = kWhole[pos(6)];
    }
  }
  return s;
}

}  // namespace

TEST_CASE("cli: 200 randomly mutated documents never crash, hang or report an internal error") {
  const fs::path dir = temp_dir("mutations");
  const std::string cluster = four_device_cluster(dir);
  const std::string plan = (dir / "plan.json").string();
  const CliResult planned = run_cli({"plan", "--graph", kGraph, "--cluster", cluster, "--job", kJob,
                                     "--top", "1", "--out", plan});
  INFO(planned.output);
  REQUIRE(planned.status == 0);
  const std::map<std::string, std::string> originals = {
      {"graph", kGraph}, {"cluster", cluster}, {"job", kJob}, {"plan", plan}};
  const char* const kinds[] = {"graph", "cluster", "job", "plan"};

  constexpr int kMutations = 200;
  constexpr uint32_t kSeed = 13;
  std::mt19937 rng(kSeed);
  std::map<int, int> exits;  // exit status -> calls
  for (int i = 0; i < kMutations; ++i) {
    const std::string kind = kinds[i % 4];
    const std::string original_text = [&] {
      std::ifstream in(originals.at(kind));
      std::stringstream ss;
      ss << in.rdbuf();
      return ss.str();
    }();
    const std::string text = std::uniform_int_distribution<int>(0, 1)(rng) == 0
                                 ? mutate_json(Json::parse(original_text), rng)
                                 : mutate_text(original_text, rng);
    const std::string mutated = write(dir / ("mutated-" + std::to_string(i) + "." + kind + ".json"), text);
    std::map<std::string, std::string> files = originals;
    files[kind] = mutated;

    std::vector<std::vector<std::string>> calls;
    if (kind == "plan") {
      calls.push_back({"evaluate", "--graph", files["graph"], "--cluster", files["cluster"], "--job",
                       files["job"], "--plan", mutated});
      calls.push_back({"explain", mutated, "--graph", files["graph"], "--cluster", files["cluster"],
                       "--job", files["job"]});
    } else {
      calls.push_back({"plan", "--graph", files["graph"], "--cluster", files["cluster"], "--job",
                       files["job"], "--top", "1"});
    }
    for (const auto& args : calls) {
      // timeout(1) exits 124 when the call overruns (a hang), 137 after its KILL.
      const CliResult r = run_cli(args, "timeout -k 5 60");
      INFO("mutation " << i << " of the " << kind << " (seed " << kSeed << "): " << args[0]
                       << "\n--- document ---\n" << text.substr(0, 2000) << "\n--- output ---\n"
                       << r.output);
      exits[r.status]++;
      CHECK((r.status == 0 || r.status == 2 || r.status == 3));
      CHECK_THAT(r.output, !Contains("internal error") && !Contains("unexpected error"));
      if (r.status == 2) CHECK_THAT(r.output, Contains(mutated));
    }
  }
  // The mutations must exercise both outcomes, or they test nothing.
  CHECK(exits[0] > 10);
  CHECK(exits[2] > 50);
  std::ostringstream summary;
  for (const auto& [status, n] : exits) summary << " exit " << status << ": " << n;
  WARN("mutated documents:" << summary.str());
}
