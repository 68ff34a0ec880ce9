// Multi-process executor tests: several C++ processes (build/bin/train_mlp, no Python
// interpreter) form a Gloo job on 127.0.0.1 the way torchrun would start them (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT, LOCAL_RANK), train an MLP under a plan, and must end with the
// parameters that single-process training on the same global batch produces (rtol 1e-5).
// A job whose ranks hold different plans must fail on every rank, with a message naming both
// ranks, well within the timeout. A rank SIGKILLed mid-training ends the other non-zero within
// the timeout, naming it. A checkpoint saved under one plan resumes under another and trains on
// as uninterrupted training (SGD with momentum and Adam).
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
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "catch.h"
#include "common/json_io.h"
#include "planner/documents/cluster.h"
#include "planner/documents/graph.h"
#include "planner/documents/plan.h"
#include "planner/model_fixtures.h"

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
                            const std::vector<std::string>& extra_args = {}, int steps = kSteps) const {
    std::vector<Proc> procs = start_job(name, num_ranks, plans, extra_args, steps, kRankTimeoutS);
    wait_all(procs, kJobDeadlineS);
    return procs;
  }

  // Starts them and returns at once (the caller waits: wait_all).
  std::vector<Proc> start_job(const std::string& name, int num_ranks, const std::vector<std::string>& plans,
                              const std::vector<std::string>& extra_args, int steps, int timeout_s) const {
    const int port = free_port();
    std::vector<Proc> procs;
    for (int r = 0; r < num_ranks; ++r) {
      std::vector<std::string> args{bin_dir() + "/train_mlp",
                                    "--plan", plans.size() > 1 ? plans[r] : plans[0],
                                    "--graph", (dir / "graph.json").string(),
                                    "--cluster", (dir / "cluster.json").string(),
                                    "--steps", std::to_string(steps),
                                    "--timeout-s", std::to_string(timeout_s),
                                    "--out", (dir / (name + ".rank" + std::to_string(r) + ".json")).string()};
      args.insert(args.end(), extra_args.begin(), extra_args.end());
      procs.push_back(spawn(args,
                            {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
                             "WORLD_SIZE=" + std::to_string(num_ranks), "MASTER_ADDR=127.0.0.1",
                             "MASTER_PORT=" + std::to_string(port)},
                            (dir / (name + ".rank" + std::to_string(r) + ".log")).string()));
    }
    return procs;
  }

  // Every rank succeeded; every parameter a rank trained equals the reference; together the
  // ranks trained every parameter.
  void check_matches_reference(const std::string& name, const std::vector<Proc>& procs) const {
    check_matches(name, procs, reference, kRtol, kAtol);
  }
  void check_matches(const std::string& name, const std::vector<Proc>& procs, const nlohmann::json& reference,
                     double rtol, double atol) const {
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
          worst = std::max(worst, std::abs(a - b) / (atol + rtol * std::abs(b)));
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

TEST_CASE("executor: a rank killed mid-training ends the other non-zero within the timeout, naming it",
          "[executor][distributed]") {
  Fixture& f = Fixture::get();
  constexpr int kTimeoutS = 10;  // train_mlp --timeout-s: the survivor must not need more
  struct Case {
    std::string name;
    std::string plan;
    int victim;
  };
  const std::string dp_plan = f.write_plan("killed_dp", MpMode::kPlacement, 2, 1, kOneDevice);
  const std::string pipe_plan = f.write_plan("killed_pipe", MpMode::kPipeline, 1, 2, kTwoStages, 2, Schedule::kGpipe);
  for (const Case& c : {Case{"killed_dp_victim1", dp_plan, 1}, Case{"killed_dp_victim0", dp_plan, 0},
                        Case{"killed_pipe_victim1", pipe_plan, 1}}) {
    SECTION(c.name) {
      // Far more steps than it can run: the job only ends because a rank is killed.
      std::vector<Proc> procs = f.start_job(c.name, 2, {c.plan}, {}, 100000000, kTimeoutS);
      const std::string marker = "rank " + std::to_string(c.victim) + " step 2 ";
      const auto wait_start = std::chrono::steady_clock::now();
      bool trained = false;
      while (!trained && std::chrono::steady_clock::now() - wait_start < std::chrono::seconds(kJobDeadlineS)) {
        trained = read_text(procs[c.victim].log).find(marker) != std::string::npos;
        if (!trained) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        int status = 0;
        if (!trained && waitpid(procs[c.victim].pid, &status, WNOHANG) == procs[c.victim].pid) {
          procs[c.victim].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          break;  // it ended on its own: reported below
        }
      }
      if (procs[c.victim].exit_code == -1) kill(procs[c.victim].pid, SIGKILL);
      const auto killed_at = std::chrono::steady_clock::now();
      wait_all(procs, kJobDeadlineS);  // reaps every process, killing what outlives the deadline
      const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
      const int survivor = 1 - c.victim;
      const std::string log = read_text(procs[survivor].log);
      INFO("victim log:\n" << read_text(procs[c.victim].log) << "\nsurvivor log:\n" << log);
      REQUIRE(trained);
      CHECK(procs[c.victim].exit_code == 128 + SIGKILL);
      CHECK(procs[survivor].exit_code == 1);
      CHECK_THAT(log, Catch::Matchers::Contains("rank " + std::to_string(c.victim) + " lost or timed out"));
      CHECK(std::regex_search(log, std::regex("hybridplan: step [0-9]+ failed on rank " + std::to_string(survivor) + ": ")));
      // within the timeout, plus the grace period for the others' reports and slack for a loaded machine
      CHECK(took_s < kTimeoutS + 3 + 10);
    }
  }
}

TEST_CASE("executor: a checkpoint saved under pipeline 1x2 resumes under DP 2x1 as uninterrupted training",
          "[executor][distributed][checkpoint]") {
  Fixture& f = Fixture::get();
  constexpr int kFirst = 3;  // steps before the checkpoint; kSteps - kFirst after it
  const std::string pipe_plan = f.write_plan("ckpt_pipe", MpMode::kPipeline, 1, 2, kTwoStages, 4, Schedule::kGpipe);
  const std::string dp_plan = f.write_plan("ckpt_dp", MpMode::kPlacement, 2, 1, kOneDevice);
  for (const std::string optimizer : {"sgd", "adam"}) {
    SECTION(optimizer) {
      // SGD: train_mlp's default lr and momentum, the fixture's reference; Adam: its own
      const std::vector<std::string> opt_args =
          optimizer == "sgd" ? std::vector<std::string>{"--optimizer", "sgd"}
                             : std::vector<std::string>{"--optimizer", "adam", "--lr", "0.01"};
      nlohmann::json reference = f.reference;
      if (optimizer == "adam") {
        std::vector<std::string> args{bin_dir() + "/train_mlp", "--reference", "--global-batch",
                                      std::to_string(kGlobalBatch), "--steps", std::to_string(kSteps),
                                      "--out", (f.dir / "reference_adam.json").string()};
        args.insert(args.end(), opt_args.begin(), opt_args.end());
        std::vector<Proc> ref{spawn(args, {}, (f.dir / "reference_adam.log").string())};
        wait_all(ref, kJobDeadlineS);
        INFO(read_text(ref[0].log));
        REQUIRE(ref[0].exit_code == 0);
        reference = nlohmann::json::parse(read_text((f.dir / "reference_adam.json").string())).at("params");
      }
      const std::string ckpt = (f.dir / ("ckpt_" + optimizer + ".pt")).string();
      std::vector<std::string> save_args(opt_args);
      save_args.insert(save_args.end(), {"--checkpoint", ckpt});
      auto saved = f.run_job("ckpt_save_" + optimizer, 2, {pipe_plan}, save_args, kFirst);
      for (const Proc& p : saved) {
        INFO(read_text(p.log));
        REQUIRE(p.exit_code == 0);
      }
      REQUIRE(fs::exists(ckpt));
      std::vector<std::string> resume_args(opt_args);
      resume_args.insert(resume_args.end(), {"--resume-from", ckpt});
      auto resumed = f.run_job("ckpt_resume_" + optimizer, 2, {dp_plan}, resume_args, kSteps - kFirst);
      for (const Proc& p : resumed) {
        CHECK_THAT(read_text(p.log), Catch::Matchers::Contains("resumed at step " + std::to_string(kFirst)));
      }
      // Adam divides by sqrt of tiny second moments: more reassociation noise than SGD
      f.check_matches("ckpt_resume_" + optimizer, resumed, reference, optimizer == "sgd" ? kRtol : 1e-4,
                      optimizer == "sgd" ? kAtol : 1e-6);
    }
  }
}
