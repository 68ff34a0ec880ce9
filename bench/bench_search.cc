// bench_search: how fast the planner's search is (figures reported, not timed tests).
//   1. full search() of PipeDream's ResNet-50 profile (177 nodes) on 16 devices (two DGX-1
//      V100): the median (and the fastest) of 9 runs; target < 10 ms. PipeDream's own
//      optimizer plans the same profile in seconds (docs/performance.md).
//   2. full search() of a 2,000-node chain on 4,096 devices (512 DGX-1 nodes x 8), one core:
//      the median of 3 runs and the peak RSS (getrusage); target < 0.15 s and < 1 GB. Then a
//      1,000-node chain whose every fourth node splits by tensor parallelism (max_degree 8), so
//      tp = 1, 2, 4, 8 are in the space (docs/tensor_parallel.md); target < 1 s. Both spaces
//      hold the pipelines spanning whole nodes (mp * tp a multiple of 8, up to mp = 64 ranks:
//      search.cc kMaxSpanningStages).
//   3. full search() of MT-NLG 530B (105 layers, hidden 20480, 128 heads, sequence 2048;
//      Smith et al. 2022, https://arxiv.org/abs/2201.11990) at global batch 1,920 on 2,240,
//      2,800 and 3,360 A100-80GB (DGX A100 nodes); target < 1 s each. The graph comes from
//      hybridplan.profiler.from_config (Python): `--mtnlg-graph PATH` names its JSON, which
//      bench/run_all.py writes; the part is skipped without it.
//   4. placement search of PipeDream's Inception-V3 profile (326 nodes) for every mp <= 8 on a
//      DGX-1: compute, lower bound, gap, evaluations; target < 5 s for all mp together.
// The profile folder comes from HYBRIDPLAN_PIPEDREAM_PROFILES (default
// ../shared/data/pipedream-profiles next to the source tree); parts 1 and 4 are skipped
// without it. `--only resnet|chain|mtnlg|inception ...` runs those parts alone; `--plans DIR`
// writes each search's plans (plan JSON, best first) to DIR/<case>.json, so that two builds'
// plans can be compared byte for byte.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/units.h"
#include "planner/costs/evaluate.h"
#include "planner/documents/cluster.h"
#include "planner/documents/graph.h"
#include "planner/documents/job.h"
#include "planner/documents/pipedream_import.h"
#include "planner/searches/device_mapping.h"
#include "planner/searches/placement_search.h"
#include "planner/searches/search.h"

using namespace hybridplan;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// User + system CPU time of this process: the machine may be shared, so wall time overstates.
double cpu_seconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
}

double peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;  // ru_maxrss is KiB on Linux
}

std::string plans_dir;  // --plans: where each case's plans go (empty: nowhere)

// PipeDream's <model>.graph.txt, or nullopt (said why) when the profile folder lacks it.
std::optional<std::filesystem::path> pipedream_profile(const std::string& model) {
  const char* env = std::getenv("HYBRIDPLAN_PIPEDREAM_PROFILES");
  const std::filesystem::path dir =
      env ? std::filesystem::path(env)
          : std::filesystem::path(HYBRIDPLAN_SOURCE_DIR) / ".." / "shared" / "data" /
                "pipedream-profiles";
  const auto path = dir / (model + ".graph.txt");
  if (std::filesystem::exists(path)) return path;
  std::printf("skipped: %s not found (set HYBRIDPLAN_PIPEDREAM_PROFILES to a folder with "
              "PipeDream's profiler/*/profiles/<model>/graph.txt files)\n",
              path.string().c_str());
  return std::nullopt;
}

// The median of `values` (the mean of the middle two for an even count).
double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// Runs search() `repeats` times and prints the median and fastest wall and CPU times, the peak
// RSS and the plans; writes them to plans_dir/<name>.json when --plans is given.
void timed_search(const std::string& name, const Problem& problem, int repeats,
                  const char* target) {
  std::vector<double> wall_s, cpu_s;
  SearchResult r;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = Clock::now();
    const double cpu0_s = cpu_seconds();
    r = search(problem, SearchOptions{});
    wall_s.push_back(seconds_since(t0));
    cpu_s.push_back(cpu_seconds() - cpu0_s);
  }
  std::printf("wall %.4f s, cpu %.4f s (median of %d runs; fastest: wall %.4f s, cpu %.4f s; "
              "target < %s), peak RSS %s, %lld evaluations\n",
              median(wall_s), median(cpu_s), repeats,
              *std::min_element(wall_s.begin(), wall_s.end()),
              *std::min_element(cpu_s.begin(), cpu_s.end()), target,
              format_bytes(peak_rss_bytes()).c_str(),
              static_cast<long long>(r.candidates_evaluated));
  for (const std::string& note : r.notes) {  // how many points the bound left unsearched
    if (note.find("not searched") != std::string::npos) std::printf("%s\n", note.c_str());
  }
  std::printf("%-4s %-5s %-3s %-3s %-5s %-10s %-16s %-4s %-5s %14s %14s\n", "rank", "dp", "mp",
              "tp", "b", "mode", "sched", "M", "shard", "step", "samples/s");
  for (size_t i = 0; i < r.plans.size(); ++i) {
    const Plan& p = r.plans[i];
    std::printf("%-4zu %-5lld %-3lld %-3lld %-5lld %-10s %-16s %-4lld %-5s %14s %14s\n", i + 1,
                static_cast<long long>(p.dp), static_cast<long long>(p.mp),
                static_cast<long long>(p.tp), static_cast<long long>(p.per_replica_batch),
                mode_name(p.mode), schedule_name(p.schedule),
                static_cast<long long>(p.num_microbatches), sharding_name(p.sharding),
                format_seconds(p.predicted.step_s).c_str(),
                format_count(p.predicted.samples_per_s).c_str());
  }
  if (plans_dir.empty()) return;
  Json plans = Json::array();
  for (const Plan& p : r.plans) plans.push_back(plan_to_json(p, problem.graph, problem.cluster));
  std::filesystem::create_directories(plans_dir);
  std::ofstream(std::filesystem::path(plans_dir) / (name + ".json")) << plans.dump(1) << "\n";
}

void bench_resnet() {
  std::printf("== full search: PipeDream ResNet-50 profile on 16 devices (2 x DGX-1 V100) ==\n");
  const std::optional<std::filesystem::path> path = pipedream_profile("resnet50");
  if (!path) return;
  Problem problem;
  problem.graph = import_pipedream(path->string(), kPipeDreamDefaultBatchSize);
  problem.cluster = load_cluster("dgx1-v100");
  problem.cluster.num_nodes = 2;
  problem.job = default_job();
  timed_search("resnet50-16", problem, 9, "10 ms");
}

// A chain of n layers: 0.2-2 ms forward, twice that backward, up to 1 MiB of parameters and
// 4 MiB of activations each, profiled at batch 32 (seeded, so every run is the same problem).
// With `tensor_parallel`, every fourth layer is a column-wise split (max_degree 8) whose input
// gradient is all-reduced.
Graph chain_graph(int n, bool tensor_parallel = false) {
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> ms(0.2e-3, 2e-3);
  Graph g;
  g.name = "chain" + std::to_string(n);
  g.profiled.batch_size = 32;
  for (int i = 0; i < n; ++i) {
    Node node;
    node.id = i;
    node.name = "layer" + std::to_string(i);
    node.op = "linear";
    node.forward_s = ms(rng);
    node.backward_s = 2 * node.forward_s;
    node.param_bytes = static_cast<int64_t>(rng() % (1 << 20));  // ~1 GB model in all
    node.output_bytes = static_cast<int64_t>(rng() % (4 << 20));
    g.nodes.push_back(node);
    if (i > 0) g.edges.push_back({i - 1, i, g.nodes[i - 1].output_bytes});
    if (tensor_parallel && i % 4 == 0) {
      TensorParallel split;
      split.style = TpStyle::kColwise;
      split.max_degree = 8;
      split.split_param_bytes = node.param_bytes;
      split.activation_split = true;
      split.backward_collective = TpCollective{Collective::kAllReduce, node.output_bytes};
      g.nodes.back().tensor_parallel = split;
    }
  }
  g.finalize("chain");
  return g;
}

void bench_chain(int n, bool tensor_parallel) {
  std::printf("\n== full search: %d-node chain%s on 4096 devices (512 x DGX-1 V100), batch "
              "chosen from 8, 16, 32, 64 ==\n",
              n, tensor_parallel ? " with tensor parallelism" : "");
  Problem problem;
  problem.graph = chain_graph(n, tensor_parallel);
  problem.cluster = load_cluster("dgx1-v100");
  problem.cluster.num_nodes = 512;
  problem.job = default_job();
  problem.job.per_replica_batches = {8, 16, 32, 64};  // the search chooses the batch
  timed_search("chain" + std::to_string(n) + (tensor_parallel ? "-tp" : ""), problem, 3,
               tensor_parallel ? "1 s" : "0.15 s");
}

// MT-NLG 530B as Smith et al. 2022 trained it: global batch 1,920, mixed-precision Adam, on
// DGX A100 nodes (A100-80GB).
void bench_mtnlg(const std::string& graph_path) {
  std::printf("\n== full search: MT-NLG 530B at global batch 1920 on DGX A100 ==\n");
  if (graph_path.empty()) {
    std::printf("skipped: no --mtnlg-graph (bench/run_all.py writes it with "
                "hybridplan.profiler.from_config)\n");
    return;
  }
  Problem problem;
  problem.graph = load_graph(graph_path);
  problem.job = job_from_json(Json{{"schema_version", 1},
                                   {"kind", "hybridplan.job"},
                                   {"global_batch", 1920},
                                   {"optimizer", "adam"},
                                   {"mixed_precision", true}},
                              "bench_search MT-NLG job");
  for (int64_t gpus : {2240, 2800, 3360}) {
    problem.cluster = load_cluster("dgx-a100");
    problem.cluster.num_nodes = gpus / 8;
    std::printf("-- %lld GPUs (%lld nodes), %zu graph nodes --\n", static_cast<long long>(gpus),
                static_cast<long long>(gpus / 8), problem.graph.nodes.size());
    timed_search("mtnlg530b-" + std::to_string(gpus), problem, 1, "1 s");
  }
}

void bench_inception() {
  std::printf("\n== placement search: PipeDream Inception-V3 profile on a DGX-1 V100 ==\n");
  const std::optional<std::filesystem::path> path = pipedream_profile("inception_v3");
  if (!path) return;
  Problem problem;
  problem.graph = import_pipedream(path->string(), kPipeDreamDefaultBatchSize);
  problem.cluster = load_cluster("dgx1-v100");
  problem.job = default_job();
  const Evaluator evaluator(problem);
  std::printf("%zu nodes, %zu edges, batch %lld\n", problem.graph.nodes.size(),
              problem.graph.edges.size(), static_cast<long long>(problem.graph.profiled.batch_size));
  std::printf("%-3s %12s %12s %8s %8s %10s\n", "mp", "compute", "lower bnd", "gap", "evals",
              "wall");
  const auto t_all = Clock::now();
  const double cpu_all_s = cpu_seconds();
  for (int64_t mp : {1, 2, 4, 8}) {
    Plan base;
    base.dp = 1;
    base.mp = mp;
    base.world_size = mp;
    base.per_replica_batch = problem.graph.profiled.batch_size;
    base.global_batch = base.per_replica_batch;
    base.mesh = map_devices(problem.cluster, 1, mp).mesh;
    base.assignment.assign(problem.graph.nodes.size(), 0);
    const auto t0 = Clock::now();
    const PlacementOutcome o = search_placement(evaluator, base, PlacementSearchOptions{});
    std::printf("%-3lld %12s %12s %7.2f%% %8lld %9.3fs\n", static_cast<long long>(mp),
                format_seconds(o.predicted.compute_s).c_str(),
                format_seconds(o.lower_bound_compute_s).c_str(), 100 * o.gap,
                static_cast<long long>(o.evaluations), seconds_since(t0));
  }
  std::printf("all mp: wall %.3f s, cpu %.3f s (target < 5 s)\n", seconds_since(t_all),
              cpu_seconds() - cpu_all_s);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> parts = {"resnet", "chain", "mtnlg", "inception"};
  std::set<std::string> only;
  std::string mtnlg_graph;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mtnlg-graph" && i + 1 < argc) {
      mtnlg_graph = argv[++i];
    } else if (arg == "--plans" && i + 1 < argc) {
      plans_dir = argv[++i];
    } else if (arg == "--only") {
      while (i + 1 < argc && std::find(parts.begin(), parts.end(), argv[i + 1]) != parts.end())
        only.insert(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: bench_search [--only resnet|chain|mtnlg|inception ...] "
                   "[--mtnlg-graph PATH] [--plans DIR] (got %s)\n",
                   arg.c_str());
      return 2;
    }
  }
  const auto wanted = [&](const char* part) { return only.empty() || only.count(part) > 0; };
  if (wanted("resnet")) bench_resnet();
  if (wanted("chain")) {
    bench_chain(2000, false);
    bench_chain(1000, true);
  }
  if (wanted("mtnlg")) bench_mtnlg(mtnlg_graph);
  if (wanted("inception")) bench_inception();
  return 0;
}
