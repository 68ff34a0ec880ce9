// The pruned partition DPs against plain ones: on chains long enough for the pruning to act
// (up to 160 positions, up to 40 stages), with every memory term (recompute kinds, receive
// buffers, workspaces, tied copies, the first and last stages' bytes, forbidden cuts),
// least_memory_partition (narrowed by the split at equal shares and the end windows) and
// optimal_partition (narrowed by the end windows under its memory limit) return the very split,
// kinds and value of a DP that scans every state. The lower bound by which search() leaves
// points out against every split of small random problems. And search() against its exhaustive
// form (SearchOptions::exhaustive) where memory binds and steps accumulate.
#include <algorithm>
#include <limits>
#include <optional>
#include <random>
#include <tuple>
#include <utility>

#include "catch.h"
#include "common/error.h"
#include "partition_fixtures.h"
#include "planner/costs/evaluate.h"
#include "planner/documents/plan.h"
#include "planner/searches/pipeline_partition.h"
#include "planner/searches/pipeline_search.h"
#include "planner/searches/search.h"
#include "random_problems.h"

using namespace hybridplan;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

PartitionCosts random_memory_costs(std::mt19937_64& rng, int64_t n, int k) {
  std::uniform_real_distribution<double> t(0.0, 1.0);
  PartitionCosts c;
  const auto prefix = [&](double scale) {
    std::vector<double> p(n + 1, 0.0);
    for (int64_t i = 0; i < n; ++i) p[i + 1] = p[i] + scale * t(rng);
    return p;
  };
  c.prefix_compute_s = prefix(1.0);
  c.boundary_s.assign(k - 1, std::vector<double>(n + 1, 0.0));
  for (auto& row : c.boundary_s)
    for (auto& x : row) x = 0.3 * t(rng) * t(rng);
  c.prefix_static_bytes = prefix(100.0);
  c.prefix_activation_bytes = prefix(50.0);
  c.activation_multiplier.resize(k);
  for (int s = 0; s < k; ++s) c.activation_multiplier[s] = k - s;  // 1F1B-like in flight
  testing::add_random_memory_terms(rng, c, 8, 200, 20);
  if (rng() % 2 == 0) c.tied_copies.push_back({{0, n - 1}, 300 * t(rng)});
  if (rng() % 3 == 0) {
    c.cut_before.assign(n + 1, 1);
    for (int64_t p = 1; p < n; ++p) c.cut_before[p] = rng() % 5 != 0;
  }
  return c;
}

// A DP over every state: best[s][j] = min over allowed i of max(best[s-1][i], cost(s, i, j)),
// each state taking the latest start of its least value (the pruned DPs' rule), then the split
// walked back. `cost` returns (value, kind); +infinity where the stage is not allowed.
template <typename Cost>
std::optional<Partition> plain_dp(const PartitionCosts& c, Cost cost) {
  const int64_t n = c.num_positions();
  const int k = c.num_stages();
  if (n < k) return std::nullopt;
  std::vector<std::vector<double>> best(k, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int64_t>> arg(k, std::vector<int64_t>(n + 1, -1));
  std::vector<std::vector<StageRecompute>> kind(k, std::vector<StageRecompute>(n + 1, 0));
  for (int64_t j = 1; j <= n; ++j) std::tie(best[0][j], kind[0][j]) = cost(0, 0, j);
  for (int s = 1; s < k; ++s) {
    for (int64_t j = s + 1; j <= n; ++j) {
      for (int64_t i = j - 1; i >= s; --i) {
        if (!c.cut_allowed(i) || best[s - 1][i] == kInf) continue;
        const auto [v, r] = cost(s, i, j);
        const double cand = std::max(best[s - 1][i], v);
        if (cand < best[s][j]) best[s][j] = cand, arg[s][j] = i, kind[s][j] = r;
      }
    }
  }
  if (best[k - 1][n] == kInf) return std::nullopt;
  Partition p;
  p.stage_starts.assign(k + 1, 0);
  p.recompute.assign(k, 0);
  p.stage_starts[k] = n;
  int64_t end = n;
  for (int s = k - 1; s >= 1; --s) {
    p.recompute[s] = kind[s][end];
    end = arg[s][end];
    p.stage_starts[s] = end;
  }
  p.recompute[0] = kind[0][end];
  p.bottleneck_s = best[k - 1][n];
  return p;
}

}  // namespace

TEST_CASE("search pruning: the least-memory split equals the plain DP's", "[search_pruning]") {
  std::mt19937_64 rng(20261206);
  int compared = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t n = 20 + static_cast<int64_t>(rng() % 141);
    const int k = 2 + static_cast<int>(rng() % std::min<int64_t>(n / 2, 39));
    const PartitionCosts c = random_memory_costs(rng, n, k);
    INFO("trial " << trial << ": " << n << " positions, " << k << " stages");
    const auto plain = plain_dp(c, [&](int s, int64_t i, int64_t j) { return testing::least_kind(c, s, i, j); });
    const auto pruned = least_memory_partition(c);
    REQUIRE(static_cast<bool>(plain) == static_cast<bool>(pruned));
    if (!plain) continue;
    ++compared;
    CHECK(pruned->stage_starts == plain->stage_starts);
    CHECK(pruned->recompute == plain->recompute);
    CHECK(pruned->fullest_bytes == plain->bottleneck_s);
  }
  CHECK(compared > 40);
}

TEST_CASE("search pruning: under a memory limit the time DP equals the plain DP",
          "[search_pruning]") {
  std::mt19937_64 rng(20261207);
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t n = 20 + static_cast<int64_t>(rng() % 141);
    const int k = 2 + static_cast<int>(rng() % std::min<int64_t>(n / 2, 39));
    PartitionCosts c = random_memory_costs(rng, n, k);
    // a capacity around the least-memory split's need: often binding, sometimes too small
    const auto least = least_memory_partition(c);
    REQUIRE(least);
    std::uniform_real_distribution<double> t(0.0, 1.0);
    c.memory_capacity_bytes = least->fullest_bytes * (0.9 + 0.6 * t(rng));
    INFO("trial " << trial << ": " << n << " positions, " << k << " stages");
    const auto plain = plain_dp(c, [&](int s, int64_t i, int64_t j) {
      const PartitionCosts::Choice choice = c.choose(s, i, j, c.workspace_max(i, j));
      return std::make_pair(choice.time_s, choice.recompute);
    });
    const auto pruned = optimal_partition(c);
    // no split fits exactly when the least-memory split does not (what the search screens by)
    CHECK(static_cast<bool>(pruned) == (least->fullest_bytes <= c.memory_capacity_bytes));
    REQUIRE(static_cast<bool>(plain) == static_cast<bool>(pruned));
    if (!plain) {
      ++infeasible;
      continue;
    }
    ++feasible;
    CHECK(pruned->bottleneck_s == plain->bottleneck_s);
    CHECK(pruned->stage_starts == plain->stage_starts);
    CHECK(pruned->recompute == plain->recompute);
  }
  CHECK(feasible > 20);
  CHECK(infeasible > 5);
}

TEST_CASE("search pruning: a pipeline point's step lower bound holds for every split",
          "[search_pruning]") {
  // step_lower_bound_s, by which search() leaves points out, against the evaluated step of
  // every contiguous split (unsharded and, where allowed, zero2) of every pipeline point of
  // random problems, every schedule: the fill and drain added to the work spread over the
  // ranks.
  std::mt19937_64 rng(20261208);
  int checked = 0, with_fill = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const Problem problem = testing::random_problem(rng, trial);
    const Evaluator ev(problem);
    const auto n = static_cast<int64_t>(problem.graph.nodes.size());
    for (const SearchSpacePoint& point : search_space(problem, SearchOptions{}, nullptr)) {
      if (point.mode != MpMode::kPipeline) continue;
      Plan plan = plan_skeleton(problem, point, "");
      const double bound = step_lower_bound_s(ev, plan);
      const auto m = static_cast<double>(plan.num_microbatches);
      const double spread =
          ev.node_times(static_cast<double>(plan.per_replica_batch) / m, ev.compute_slowdown(plan),
                        plan.tp, plan.sequence_parallel)
                  .total_s() * m / static_cast<double>(plan.mp) +
          2 * m * problem.cluster.runtime.action_s_for(schedule_name(plan.schedule)) +
          problem.cluster.runtime.step_overhead_s(plan.dp);
      CHECK(bound >= spread * (1 - 1e-9));
      with_fill += bound > spread * 1.01;
      double least = kInf;
      for_each_contiguous_partition(n, static_cast<int>(plan.num_stages()), [&](const std::vector<int64_t>& s) {
        for (size_t k = 1; k + 1 < s.size(); ++k)
          if (!problem.graph.nodes[problem.graph.topo_order[s[k]]].cut_before) return;
        plan.assignment = stages_from_split(problem.graph, s);
        for (const Sharding kind : {Sharding::kNone, Sharding::kZero2}) {
          if (kind == Sharding::kZero2 && plan.dp < 2) continue;
          plan.sharding = kind;
          least = std::min(least, ev.evaluate(plan).step_s);
        }
        plan.sharding = Sharding::kNone;
      });
      INFO("trial " << trial << ": dp=" << plan.dp << " mp=" << plan.mp << " "
                    << schedule_name(plan.schedule) << " M=" << plan.num_microbatches);
      CHECK(bound <= least);
      ++checked;
    }
  }
  CHECK(checked > 100);
  CHECK(with_fill > 20);
}

TEST_CASE("search pruning: where memory binds and steps accumulate, the pruned search returns "
          "the exhaustive search's plans",
          "[search_pruning][accumulation]") {
  // Random small problems whose job asks for a global batch on devices with little memory, so
  // that many points fit only in more accumulation steps, and chains from several points meet
  // at one point (b halved with M kept from one, the micro-batch size kept from another).
  // search() leaves points out by their lower bound and prices a point that several chains reach
  // once; SearchOptions::exhaustive prices every point on every arrival. Both return the same
  // top k: objectives and points, no plan twice.
  std::mt19937_64 rng(20261209);
  int compared = 0, accumulated = 0, infeasible = 0, fewer = 0, met = 0;
  int64_t evaluations = 0, exhaustive_evaluations = 0;
  for (int trial = 0; trial < 60; ++trial) {
    Problem problem = testing::random_problem(rng, trial);
    const int64_t world = problem.cluster.num_devices();
    problem.job.per_replica_batches.clear();
    problem.job.accumulation_steps.clear();
    problem.job.global_batches = {world * (int64_t{2} << (rng() % 3))};
    problem.cluster.device.memory_bytes = static_cast<int64_t>(32 + rng() % 224) << 20;
    SearchOptions options;
    if (trial % 5 == 4) options.devices = problem.cluster.devices_per_node;
    SearchOptions every = options;
    every.exhaustive = true;
    INFO("trial " << trial << ": " << problem.graph.nodes.size() << " nodes, "
                  << problem.cluster.num_nodes << "x" << problem.cluster.devices_per_node
                  << ", global batch " << problem.job.global_batches[0] << ", memory "
                  << (problem.cluster.device.memory_bytes >> 20) << " MiB");
    SearchResult reference;
    try {
      reference = search(problem, every);
    } catch (const InfeasibleError&) {
      ++infeasible;
      CHECK_THROWS_AS(search(problem, options), InfeasibleError);
      continue;
    }
    const SearchResult r = search(problem, options);
    ++compared;
    evaluations += r.candidates_evaluated;
    exhaustive_evaluations += reference.candidates_evaluated;
    fewer += r.candidates_evaluated < reference.candidates_evaluated;
    REQUIRE(r.plans.size() == reference.plans.size());
    for (size_t i = 0; i < r.plans.size(); ++i) {
      const Plan& a = r.plans[i];
      const Plan& b = reference.plans[i];
      INFO("rank " << i + 1);
      CHECK(objective(problem, a.predicted) == Approx(objective(problem, b.predicted)).epsilon(1e-12));
      // the point itself where no other plan of the list ties with it
      const auto ties = [&](const std::vector<Plan>& plans) {
        return std::count_if(plans.begin(), plans.end(), [&](const Plan& p) {
          return objective(problem, p.predicted) == objective(problem, b.predicted);
        });
      };
      if (ties(reference.plans) == 1) {
        CHECK(std::tie(a.dp, a.mp, a.tp, a.mode, a.schedule, a.num_microbatches,
                       a.per_replica_batch, a.accumulation_steps, a.sharding) ==
              std::tie(b.dp, b.mp, b.tp, b.mode, b.schedule, b.num_microbatches,
                       b.per_replica_batch, b.accumulation_steps, b.sharding));
        CHECK(a.assignment == b.assignment);
        CHECK(a.recompute == b.recompute);
      }
    }
    accumulated += std::any_of(r.plans.begin(), r.plans.end(),
                               [](const Plan& p) { return p.accumulation_steps > 1; });
    // a point that several chains reach is listed once (before search() kept ranked_points,
    // the top k of these problems held 23 such pairs: one plan per chain that reached it)
    for (size_t i = 0; i < r.plans.size(); ++i) {
      for (size_t j = i + 1; j < r.plans.size(); ++j) {
        const Plan& a = r.plans[i];
        const Plan& b = r.plans[j];
        met += a.accumulation_steps > 1 &&
               std::tie(a.dp, a.mp, a.tp, a.mode, a.schedule, a.num_microbatches,
                        a.per_replica_batch, a.accumulation_steps) ==
                   std::tie(b.dp, b.mp, b.tp, b.mode, b.schedule, b.num_microbatches,
                            b.per_replica_batch, b.accumulation_steps);
      }
    }
  }
  INFO(compared << " compared, " << accumulated << " with accumulated plans, " << met
                << " plans listed twice, " << infeasible
                << " with nothing that fits; evaluations " << evaluations << " against "
                << exhaustive_evaluations);
  CHECK(compared >= 30);
  CHECK(accumulated >= 10);  // memory bound and the steps accumulated
  CHECK(infeasible >= 2);
  CHECK(met == 0);
  CHECK(fewer >= 10);
  CHECK(evaluations < exhaustive_evaluations);
}
