// Multi-process executor tests: several C++ processes (build/bin/train_mlp, no Python
// interpreter) form a Gloo job on 127.0.0.1 the way torchrun would start them (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, LOCAL_RANK), train an MLP under a plan, and must end with the
// parameters that single-process training on the same global batch produces (rtol 1e-5).
// A job whose ranks hold different plans must fail on every rank, with a message naming both
// ranks, well within the timeout.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "catch.h"
#include "common/json_io.h"
#include "planner/cluster.h"
#include "planner/graph.h"
#include "planner/model_fixtures.h"
#include "planner/plan.h"

extern char** environ;

using namespace hybridplan;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 5;
constexpr int kGlobalBatch = 16;
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-7;  // for values that end near zero
constexpr int kRankTimeoutS = 30;      // train_mlp --timeout-s: every wait inside a rank
constexpr int kJobDeadlineS = 120;     // the test kills a job that outlives this

std::string bin_dir() {
  const char* dir = std::getenv("HYBRIDPLAN_BIN_DIR");
  REQUIRE(dir != nullptr);  // set by CTest (cmake/torch.cmake)
  return dir;
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

struct Proc {
  pid_t pid = -1;
  std::string log;
  int exit_code = -1;
};

// Starts `args` with `extra_env` added to this process's environment, stdout+stderr to `log`.
Proc spawn(const std::vector<std::string>& args, const std::vector<std::string>& extra_env,
           const std::string& log) {
  std::vector<std::string> env_strings(extra_env);
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  std::vector<char*> envp, argv;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args_copy(args);
  for (auto& s : args_copy) argv.push_back(s.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  Proc p;
  p.log = log;
  int rc = posix_spawn(&p.pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  REQUIRE(rc == 0);
  return p;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Waits for all; kills what is left at the deadline. Returns the seconds the job took.
double wait_all(std::vector<Proc>& procs, int deadline_s) {
  const auto start = std::chrono::steady_clock::now();
  size_t running = procs.size();
  while (running > 0) {
    running = 0;
    for (Proc& p : procs) {
      if (p.exit_code != -1) continue;
      int status = 0;
      if (waitpid(p.pid, &status, WNOHANG) == p.pid) {
        p.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      } else {
        ++running;
      }
    }
    if (running > 0 && std::chrono::steady_clock::now() - start > std::chrono::seconds(deadline_s)) {
      for (Proc& p : procs) {
        if (p.exit_code == -1) {
          kill(p.pid, SIGKILL);
          waitpid(p.pid, nullptr, 0);
          p.exit_code = 999;  // killed at the deadline: a hang
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One temp folder per test run holding the model's graph (from train_mlp --write-graph, i.e. the
// C++ profiler), a 4-device loopback cluster and the single-process reference parameters.
struct Fixture {
  fs::path dir;
  Graph graph;
  Cluster cluster;
  nlohmann::json reference;

  Fixture() {
    char tmpl[] = "/tmp/hybridplan_executor_XXXXXX";
    REQUIRE(mkdtemp(tmpl) != nullptr);
    dir = tmpl;
    const std::string exe = bin_dir() + "/train_mlp";
    std::vector<Proc> setup{
        spawn({exe, "--write-graph", (dir / "graph.json").string(), "--global-batch", "16"}, {},
              (dir / "write_graph.log").string()),
        spawn({exe, "--reference", "--global-batch", std::to_string(kGlobalBatch), "--steps",
               std::to_string(kSteps), "--out", (dir / "reference.json").string()},
              {}, (dir / "reference.log").string())};
    wait_all(setup, kJobDeadlineS);
    for (const Proc& p : setup) {
      INFO(read_text(p.log));
      REQUIRE(p.exit_code == 0);
    }
    graph = load_graph((dir / "graph.json").string());
    reference = nlohmann::json::parse(read_text((dir / "reference.json").string())).at("params");
    cluster.name = "loopback-cpu-4";
    cluster.num_nodes = 1;
    cluster.devices_per_node = 4;
    cluster.device.name = "cpu";
    cluster.device.memory_bytes = int64_t{8} << 30;
    cluster.device.peak_flops = 1e11;
    cluster.intra_node = {1e9, 1e-5};
    cluster.inter_node = {1e9, 1e-5};
    write_json_file((dir / "cluster.json").string(), cluster_to_json(cluster));
  }

  static Fixture& get() {
    static Fixture fixture;
    return fixture;
  }

  // A plan over this graph: stage/device of node i = assignment[i].
  std::string write_plan(const std::string& name, MpMode mode, int64_t dp, int64_t mp,
                         std::vector<int32_t> assignment, int64_t num_microbatches = 1,
                         Schedule schedule = Schedule::kNone) const {
    const Plan p = test::make_plan(graph, cluster, dp, mp, mode, kGlobalBatch / dp,
                                   std::move(assignment), num_microbatches, schedule);
    const std::string path = (dir / (name + ".plan.json")).string();
    save_plan(p, graph, cluster, path);
    return path;
  }

  // Runs `num_ranks` train_mlp processes, rank r on plans[r] (or plans[0]).
  std::vector<Proc> run_job(const std::string& name, int num_ranks, const std::vector<std::string>& plans,
                            const std::vector<std::string>& extra_args = {}) const {
    const int port = free_port();
    std::vector<Proc> procs;
    for (int r = 0; r < num_ranks; ++r) {
      std::vector<std::string> args{bin_dir() + "/train_mlp",
                                    "--plan", plans.size() > 1 ? plans[r] : plans[0],
                                    "--graph", (dir / "graph.json").string(),
                                    "--cluster", (dir / "cluster.json").string(),
                                    "--steps", std::to_string(kSteps),
                                    "--timeout-s", std::to_string(kRankTimeoutS),
                                    "--out", (dir / (name + ".rank" + std::to_string(r) + ".json")).string()};
      args.insert(args.end(), extra_args.begin(), extra_args.end());
      procs.push_back(spawn(args,
                            {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
                             "WORLD_SIZE=" + std::to_string(num_ranks), "MASTER_ADDR=127.0.0.1",
                             "MASTER_PORT=" + std::to_string(port)},
                            (dir / (name + ".rank" + std::to_string(r) + ".log")).string()));
    }
    wait_all(procs, kJobDeadlineS);
    return procs;
  }

  // Every rank succeeded; every parameter a rank trained equals the reference; together the
  // ranks trained every parameter.
  void check_matches_reference(const std::string& name, const std::vector<Proc>& procs) const {
    std::set<std::string> covered;
    for (size_t r = 0; r < procs.size(); ++r) {
      INFO(name << " rank " << r << " log:\n" << read_text(procs[r].log));
      REQUIRE(procs[r].exit_code == 0);
      auto params = nlohmann::json::parse(
                        read_text((dir / (name + ".rank" + std::to_string(r) + ".json")).string()))
                        .at("params");
      for (const auto& [key, values] : params.items()) {
        covered.insert(key);
        const auto& expected = reference.at(key);
        REQUIRE(values.size() == expected.size());
        double worst = 0;
        for (size_t i = 0; i < values.size(); ++i) {
          const double a = values[i].get<double>(), b = expected[i].get<double>();
          worst = std::max(worst, std::abs(a - b) / (kAtol + kRtol * std::abs(b)));
        }
        INFO("parameter " << key << ": worst |a-b| / (atol + rtol |b|) = " << worst);
        CHECK(worst <= 1.0);
      }
    }
    CHECK(covered.size() == reference.size());
  }
};

// The MLP's blocks: 0 Linear(16,32), 1 ReLU, 2 Linear(32,32), 3 ReLU, 4 Linear(32,8).
const std::vector<int32_t> kOneDevice{0, 0, 0, 0, 0};
const std::vector<int32_t> kTwoStages{0, 0, 0, 1, 1};

}  // namespace

TEST_CASE("executor: DP-only plan (placement dp=2) trains like one process", "[executor][distributed]") {
  Fixture& f = Fixture::get();
  REQUIRE(f.graph.nodes.size() == kOneDevice.size());
  std::string plan = f.write_plan("dp2", MpMode::kPlacement, 2, 1, kOneDevice);
  // A 2000-byte cap packs the 7456 bytes of gradients, last parameter first, into 2 buckets:
  // {4.bias, 4.weight, 2.bias, 2.weight} (5280 B >= 2000 closes it), {0.bias, 0.weight} (2176 B).
  auto procs = f.run_job("dp2", 2, {plan}, {"--bucket-cap-bytes", "2000"});
  f.check_matches_reference("dp2", procs);
  CHECK_THAT(read_text(procs[0].log), Catch::Matchers::Contains("2 gradient buckets"));
}

TEST_CASE("executor: pipeline dp=1 x mp=2 (GPipe) trains like one process", "[executor][distributed]") {
  Fixture& f = Fixture::get();
  std::string plan = f.write_plan("pipe2", MpMode::kPipeline, 1, 2, kTwoStages, 4, Schedule::kGpipe);
  auto procs = f.run_job("pipe2", 2, {plan});
  f.check_matches_reference("pipe2", procs);
}

TEST_CASE("executor: hybrid dp=2 x mp=2 (1F1B) trains like one process", "[executor][distributed]") {
  Fixture& f = Fixture::get();
  std::string plan = f.write_plan("hybrid", MpMode::kPipeline, 2, 2, kTwoStages, 4, Schedule::k1F1B);
  auto procs = f.run_job("hybrid", 4, {plan}, {"--bucket-cap-bytes", "1024"});
  f.check_matches_reference("hybrid", procs);
}

TEST_CASE("executor: placement dp=2 x mp=2 trains like one process", "[executor][distributed]") {
  Fixture& f = Fixture::get();
  std::string plan = f.write_plan("placement", MpMode::kPlacement, 2, 2, {0, 0, 1, 1, 1});
  auto procs = f.run_job("placement", 2, {plan});
  f.check_matches_reference("placement", procs);
}

TEST_CASE("executor: ranks holding different plans all fail, naming both, within the timeout",
          "[executor][distributed]") {
  Fixture& f = Fixture::get();
  std::string dp_plan = f.write_plan("mismatch_a", MpMode::kPlacement, 2, 1, kOneDevice);
  std::string pipe_plan = f.write_plan("mismatch_b", MpMode::kPipeline, 1, 2, kTwoStages, 2, Schedule::kGpipe);
  const auto start = std::chrono::steady_clock::now();
  auto procs = f.run_job("mismatch", 2, {dp_plan, pipe_plan});
  const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t r = 0; r < procs.size(); ++r) {
    const std::string log = read_text(procs[r].log);
    INFO("rank " << r << " log:\n" << log);
    CHECK(procs[r].exit_code == 2);
    CHECK_THAT(log, Catch::Matchers::Contains("rank 0 and rank 1 hold different plans: rank 0 has "
                                              "placement dp=2 mp=1") &&
                        Catch::Matchers::Contains("rank 1 has pipeline dp=1 mp=2"));
  }
  CHECK(took_s < kRankTimeoutS);  // decided by the exchange, not by a timeout
}
