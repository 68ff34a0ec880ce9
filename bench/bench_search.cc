// bench_search: how fast the planner's search is (figures reported, not timed tests).
//   1. full search() of a 2,000-node chain on 4,096 devices (512 DGX-1 nodes x 8), one core:
//      wall time and peak RSS (getrusage); target < 1 s and < 1 GB. Then a 1,000-node chain
//      whose every fourth node splits by tensor parallelism (max_degree 8), so tp = 1, 2, 4, 8
//      are in the space (docs/tensor_parallel.md); the same targets. Both spaces hold the
//      pipelines spanning whole nodes (mp * tp a multiple of 8, up to mp = 64 ranks: search.cc
//      kMaxSpanningStages).
//   2. placement search of PipeDream's Inception-V3 profile (326 nodes) for every mp <= 8 on a
//      DGX-1: compute, lower bound, gap, evaluations; target < 5 s for all mp together.
// The profile folder comes from HYBRIDPLAN_PIPEDREAM_PROFILES (default
// ../shared/data/pipedream-profiles next to the source tree); part 2 is skipped without it.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "common/units.h"
#include "planner/cluster.h"
#include "planner/device_mapping.h"
#include "planner/evaluate.h"
#include "planner/pipedream_import.h"
#include "planner/placement_search.h"
#include "planner/search.h"

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
  Problem problem;
  problem.graph = chain_graph(n, tensor_parallel);
  problem.cluster = load_cluster("dgx1-v100");
  problem.cluster.num_nodes = 512;
  problem.job = default_job();
  problem.job.per_replica_batches = {8, 16, 32, 64};  // the search chooses the batch
  const auto t0 = Clock::now();
  const double cpu0_s = cpu_seconds();
  const SearchResult r = search(problem, SearchOptions{});
  const double wall_s = seconds_since(t0);
  const double cpu_s = cpu_seconds() - cpu0_s;
  std::printf("== full search: %d-node chain%s on %lld devices (512 x DGX-1 V100), batch chosen "
              "from 8, 16, 32, 64 ==\n",
              n, tensor_parallel ? " with tensor parallelism" : "",
              static_cast<long long>(problem.cluster.num_devices()));
  std::printf("wall %.3f s, cpu %.3f s (target < 1 s), peak RSS %s (target < 1 GB), "
              "%lld evaluations\n",
              wall_s, cpu_s, format_bytes(peak_rss_bytes()).c_str(),
              static_cast<long long>(r.candidates_evaluated));
  std::printf("%-4s %-5s %-3s %-3s %-5s %-10s %-5s %-4s %-5s %12s %14s\n", "rank", "dp", "mp", "tp",
              "b", "mode", "sched", "M", "shard", "step", "samples/s");
  for (size_t i = 0; i < r.plans.size(); ++i) {
    const Plan& p = r.plans[i];
    std::printf("%-4zu %-5lld %-3lld %-3lld %-5lld %-10s %-5s %-4lld %-5s %12s %14s\n", i + 1,
                static_cast<long long>(p.dp), static_cast<long long>(p.mp),
                static_cast<long long>(p.tp),
                static_cast<long long>(p.per_replica_batch), mode_name(p.mode),
                schedule_name(p.schedule), static_cast<long long>(p.num_microbatches),
                sharding_name(p.sharding),
                format_seconds(p.predicted.step_s).c_str(),
                format_count(p.predicted.samples_per_s).c_str());
  }
}

void bench_inception() {
  const char* env = std::getenv("HYBRIDPLAN_PIPEDREAM_PROFILES");
  const std::filesystem::path dir =
      env ? std::filesystem::path(env)
          : std::filesystem::path(HYBRIDPLAN_SOURCE_DIR) / ".." / "shared" / "data" /
                "pipedream-profiles";
  const auto path = dir / "inception_v3.graph.txt";
  std::printf("\n== placement search: PipeDream Inception-V3 profile on a DGX-1 V100 ==\n");
  if (!std::filesystem::exists(path)) {
    std::printf("skipped: %s not found (set HYBRIDPLAN_PIPEDREAM_PROFILES to a folder with "
                "PipeDream's profiler/*/profiles/<model>/graph.txt files)\n",
                path.string().c_str());
    return;
  }
  Problem problem;
  problem.graph = import_pipedream(path.string(), kPipeDreamDefaultBatchSize);
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

int main() {
  bench_chain(2000, false);
  std::printf("\n");
  bench_chain(1000, true);
  bench_inception();
  return 0;
}
