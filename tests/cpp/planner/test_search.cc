// search() against brute force: on random small graphs and clusters the best plan's objective
// equals the minimum of objective(evaluate(plan)) over EVERY plan of the search space (all
// dp x mp, all m^n placements, all contiguous pipeline splits, all micro-batch counts, both
// schedules, every data-parallel sharding kind, and a global batch in more accumulation steps
// where no plan of a point fits: search.h next_accumulation_point).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>

#include "catch.h"
#include "common/error.h"
#include "model_fixtures.h"
#include "planner/costs/evaluate.h"
#include "planner/searches/pipeline_partition.h"
#include "planner/searches/search.h"
#include "random_problems.h"

using namespace hybridplan;
using hybridplan::testing::random_cluster;
using hybridplan::testing::random_graph;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The minimum objective over every plan of one point (its mesh from plan_skeleton).
double brute_force_point(const Problem& problem, const SearchSpacePoint& point) {
  const Evaluator ev(problem);
  Plan plan = plan_skeleton(problem, point, "");
  const auto n = static_cast<int64_t>(problem.graph.nodes.size());
  double best = kInf;
  // Every data-parallel sharding kind the point allows (plan.h's rules).
  std::vector<Sharding> kinds = {Sharding::kNone};
  if (point.dp >= 2 && (point.mode == MpMode::kPipeline || point.mp == 1)) kinds.push_back(Sharding::kZero2);
  if (point.dp >= 2 && point.mode == MpMode::kPlacement && point.mp == 1) kinds.push_back(Sharding::kZero3);
  const auto consider = [&]() {
    for (Sharding kind : kinds) {
      plan.sharding = kind;
      // every shard group size the search tries (HSDP across nodes)
      for (int64_t degree : kind == Sharding::kNone ? std::vector<int64_t>{0} : shard_degrees(plan, problem.cluster)) {
        plan.dp_shard = degree;
        best = std::min(best, objective(problem, ev.evaluate(plan)));
      }
      plan.dp_shard = 0;
    }
  };
  if (point.mode == MpMode::kPlacement) {
    // Every assignment in mp^n, as an n-digit base-mp counter.
    std::fill(plan.assignment.begin(), plan.assignment.end(), 0);
    while (true) {
      consider();
      int64_t i = 0;
      while (i < n && ++plan.assignment[i] == point.mp) plan.assignment[i++] = 0;
      if (i == n) break;
    }
  } else {
    for_each_contiguous_partition(n, static_cast<int>(plan.num_stages()), [&](const std::vector<int64_t>& s) {
      for (size_t k = 1; k + 1 < s.size(); ++k)  // a stage may begin only where the graph allows
        if (!problem.graph.nodes[problem.graph.topo_order[s[k]]].cut_before) return;
      for (int64_t k = 0; k + 1 < static_cast<int64_t>(s.size()); ++k)
        for (int64_t p = s[k]; p < s[k + 1]; ++p)
          plan.assignment[problem.graph.topo_order[p]] = static_cast<int32_t>(k);
      consider();
    });
  }
  return best;
}

// A 3-node graph profiled at batch 12 on a 2-node x 4-device cluster, the default job.
Problem three_nodes_on_two_by_four() {
  std::mt19937_64 rng(3);
  Problem problem;
  testing::RandomGraphOptions go;
  go.num_nodes = 3;
  go.profiled_batch = 12;
  problem.graph = random_graph(rng, go);
  testing::RandomClusterOptions co;
  co.num_nodes = 2;
  co.devices_per_node = 4;
  problem.cluster = random_cluster(rng, co);
  problem.job = default_job();
  return problem;
}

}  // namespace

TEST_CASE("search: best plan equals brute force over the whole space", "[search]") {
  std::mt19937_64 rng(7);
  int feasible = 0, infeasible = 0, multi_device_winners = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const Problem problem = testing::random_problem(rng, trial);
    SearchOptions options;
    options.top_k = 3;
    if (trial % 5 == 4) options.devices = problem.cluster.devices_per_node;  // part of the cluster
    INFO("trial " << trial << ": " << problem.graph.nodes.size() << " nodes, "
                  << problem.cluster.num_nodes << "x" << problem.cluster.devices_per_node
                  << (problem.cluster.bandwidth_matrix.empty() ? " uniform" : " matrix"));
    std::vector<double> per_point;  // each point's best objective, brute force
    for (const SearchSpacePoint& first : search_space(problem, options, nullptr)) {
      // and a job's global batch in more accumulation steps while memory binds (search.h)
      for (std::optional<SearchSpacePoint> point = first; point;
           point = next_accumulation_point(problem, *point)) {
        const double b = brute_force_point(problem, *point);
        if (std::isinf(b)) continue;  // nothing fits: the next accumulation step count
        per_point.push_back(b);
        break;
      }
    }
    std::sort(per_point.begin(), per_point.end());
    const double brute = per_point.empty() ? kInf : per_point.front();
    if (std::isinf(brute)) {
      ++infeasible;
      CHECK_THROWS_AS(search(problem, options), InfeasibleError);
      continue;
    }
    ++feasible;
    const SearchResult r = search(problem, options);
    REQUIRE(!r.plans.empty());
    const Plan& best = r.plans.front();
    CHECK(objective(problem, best.predicted) == Approx(brute).epsilon(1e-9));
    // The top k are the k best points (the search skips points by a lower bound: never these).
    REQUIRE(r.plans.size() == std::min<size_t>(3, per_point.size()));
    for (size_t i = 0; i < r.plans.size(); ++i)
      CHECK(objective(problem, r.plans[i].predicted) == Approx(per_point[i]).epsilon(1e-9));
    if (best.mp > 1) ++multi_device_winners;
    // Every returned plan is ranked by, and carries, its evaluate() breakdown; best first.
    double previous = 0;
    for (const Plan& p : r.plans) {
      const double obj = objective(problem, evaluate(problem, p));
      CHECK(obj == Approx(objective(problem, p.predicted)).epsilon(1e-12));
      CHECK(obj >= previous);
      previous = obj;
      CHECK_NOTHROW(p.validate("search", problem.graph, problem.cluster));
    }
  }
  CHECK(feasible >= 15);  // both outcomes and MP winners were exercised
  CHECK(infeasible >= 2);
  CHECK(multi_device_winners >= 1);
}

TEST_CASE("search: search space on a 2x4 cluster", "[search]") {
  Problem problem = three_nodes_on_two_by_four();
  std::vector<std::string> skipped;
  const auto points = search_space(problem, SearchOptions{}, &skipped);
  // mp=1 (dp=8) placement; mp=2 (dp=4) placement + pipeline M in {1,2,4,12} (12 = profiled
  // batch: the powers of two dividing it and itself), GPipe for each and 1F1B for M >= 2
  // stages; mp=4 (dp=2) placement only: 3 nodes < 4 stages; no pipeline spanning both nodes
  // (mp = 8) either.
  REQUIRE(points.size() == 1 + 1 + 7 + 1);
  CHECK(points[0].dp == 8);
  CHECK(points[0].mp == 1);
  CHECK(points[2].mode == MpMode::kPipeline);
  CHECK(points[2].num_microbatches == 1);
  CHECK(points[2].schedule == Schedule::kGpipe);
  CHECK(points[3].schedule == Schedule::kGpipe);  // M = 2
  CHECK(points[4].schedule == Schedule::k1F1B);
  CHECK(points[6].num_microbatches == 4);
  CHECK(points[6].schedule == Schedule::k1F1B);
  CHECK(points[7].num_microbatches == 12);  // micro-batches of one sample
  CHECK(points[8].schedule == Schedule::k1F1B);
  CHECK(points[9].mp == 4);
  CHECK(points[9].per_replica_batch == 12);
  REQUIRE(skipped.size() == 2);
  CHECK(skipped[0] == "dp=2 mp=4 pipeline: needs at least 4 nodes for 4 stages (graph has 3)");
  CHECK(skipped[1] == "pipelines spanning nodes: only mp <= 3 (64 at most; the graph has 3 "
                      "nodes and 2 places where a stage may begin)");

  // A fixed global batch divides by dp; 6 devices allow mp in {1, 2} only.
  problem.job.global_batches = {24};
  problem.job.num_microbatches = {2, 5};
  SearchOptions six;
  six.devices = 6;
  skipped.clear();
  const auto p6 = search_space(problem, six, &skipped);
  REQUIRE(p6.size() == 1 + 1 + 2);
  CHECK(p6[0].per_replica_batch == 4);   // 24 / 6
  CHECK(p6[1].per_replica_batch == 8);   // 24 / 3
  CHECK(p6[2].num_microbatches == 2);    // 5 does not divide 8
  problem.job.global_batches = {25};
  skipped.clear();
  CHECK(search_space(problem, six, &skipped).empty());
  CHECK(skipped[0] == "dp=6 mp=1: no global batch of the job (25) is divisible by dp=6");

  // Candidate batches multiply the points; the search chooses among them.
  problem.job.global_batches = {24, 48};
  CHECK(search_space(problem, six, nullptr).size() == 2 * 4);

  SearchOptions bad;
  bad.devices = 9;
  CHECK_THROWS_WITH(search_space(problem, bad, nullptr),
                    "search options: devices must be in 1..8 (the devices of cluster "
                    "\"random-cluster\") (got 9)");
}

TEST_CASE("search: plans are complete and survive save/load", "[search]") {
  std::mt19937_64 rng(11);
  Problem problem;
  testing::RandomGraphOptions go;
  go.num_nodes = 14;  // above exact_placement_max_nodes: heuristic placement, DP pipeline
  problem.graph = random_graph(rng, go);
  testing::RandomClusterOptions co;
  co.num_nodes = 2;
  co.devices_per_node = 4;
  co.bandwidth_matrix = true;
  co.memory_bytes = 64LL << 30;
  problem.cluster = random_cluster(rng, co);
  problem.job = default_job();
  SearchOptions options;
  options.top_k = 4;
  const SearchResult r = search(problem, options);
  REQUIRE(r.plans.size() == 4);
  CHECK(r.candidates_evaluated > 10);
  bool heuristic_note = false, dp_note = false;
  for (const std::string& note : r.notes) {
    heuristic_note |= note.find("placement: heuristic") != std::string::npos &&
                      note.find("gap") != std::string::npos;
    dp_note |= note.find("bottleneck DP") != std::string::npos;
  }
  CHECK(heuristic_note);
  CHECK(dp_note);
  const auto path = std::filesystem::temp_directory_path() / "hybridplan_test_search_plan.json";
  for (const Plan& p : r.plans) {
    CHECK(p.graph_name == problem.graph.name);
    CHECK(p.graph_sha256 == graph_sha256(problem.graph));
    CHECK(p.cluster_name == problem.cluster.name);
    CHECK(p.world_size == 8);
    CHECK(!p.device_mapping_note.empty());
    save_plan(p, problem.graph, problem.cluster, path.string());
    const Plan loaded = load_plan(path.string(), problem.graph, problem.cluster);
    CHECK(loaded.assignment == p.assignment);
    CHECK(loaded.mesh == p.mesh);
  }
  std::filesystem::remove(path);
}

namespace {

// A chain n0 -> n1 -> n2 of 1 ms nodes, each with these bytes; edges carry the output.
Graph chain_of_three(const std::string& name, int64_t param_bytes, int64_t output_bytes,
                     int64_t saved_bytes) {
  Graph g;
  g.name = name;
  g.profiled.batch_size = 1;
  for (int i = 0; i < 3; ++i) {
    Node n;
    n.id = i;
    n.name = "n" + std::to_string(i);
    n.op = "linear";
    n.forward_s = n.backward_s = 1e-3;
    n.param_bytes = param_bytes;
    n.output_bytes = output_bytes;
    n.saved_bytes = saved_bytes;
    g.nodes.push_back(n);
    if (i > 0) g.edges.push_back({i - 1, i, output_bytes});
  }
  g.finalize(name);
  return g;
}

}  // namespace

TEST_CASE("search: nothing fits names the need and the device", "[search]") {
  Problem problem;
  // 1 GiB of parameters per node: with sgd 2 GiB per node on its device
  problem.graph = chain_of_three("too_big", 1LL << 30, 0, -1);
  testing::RandomClusterOptions co;
  co.devices_per_node = 2;
  co.memory_bytes = 3LL << 30;  // 3 GiB: two nodes on one device need 4 GiB
  std::mt19937_64 rng(1);
  problem.cluster = random_cluster(rng, co);
  problem.job = default_job();
  // mp=2 splits 2 + 1 nodes: the least memory is 4 GiB on the fuller device.
  std::string message;
  try {
    search(problem, SearchOptions{});
  } catch (const InfeasibleError& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("no plan fits on 2 devices") != std::string::npos);
  CHECK(message.find("smallest per-device memory need is 4.00 GiB at dp=1 mp=2") !=
        std::string::npos);
  CHECK(message.find("device has 3.00 GiB (over by 1.00 GiB)") != std::string::npos);
  co.memory_bytes = 4LL << 30;
  problem.cluster = random_cluster(rng, co);
  const SearchResult r = search(problem, SearchOptions{});
  CHECK(r.plans.front().mp == 2);
  CHECK(!r.infeasible.empty());  // dp=2 mp=1 needed 6 GiB
}

TEST_CASE("search: a point that fits only with recompute recomputes where memory binds",
          "[search][recompute]") {
  // A chain whose activations (saved 1.25 GiB per node) do not fit one 3.5 GiB device, but do
  // when each node keeps only its 1 MiB input and one node's are rebuilt at a time.
  Problem problem;
  problem.graph = chain_of_three("activations", 1 << 20, 1 << 20, 5LL << 28);
  const Graph& g = problem.graph;
  problem.cluster = test::make_cluster(1, 1, 1e9, 0, 1e8, 0, 3584LL << 20);
  problem.job = default_job();
  const SearchResult result = search(problem, SearchOptions{});
  REQUIRE(!result.plans.empty());
  const Plan& best = result.plans.front();
  REQUIRE(best.recompute == std::vector<uint8_t>{1, 1, 1});
  REQUIRE(best.predicted.feasible);
  const Evaluator evaluator(problem);
  Plan without = best;
  without.recompute.clear();
  REQUIRE_FALSE(evaluator.evaluate(without).feasible);  // 3.75 GiB of activations
  bool noted = false;
  for (const std::string& note : result.notes) noted |= note.find("only with recompute") != std::string::npos;
  REQUIRE(noted);
  // Saved as JSON and read back, the plan keeps its recompute flags.
  const Plan back = plan_from_json(plan_to_json(best, g), "plan.json");
  REQUIRE(back.recompute == best.recompute);
}

TEST_CASE("search: a point that fits only with its parameter state sharded is sharded",
          "[search][sharding]") {
  // Three 1 GiB nodes under Adam: 12 GiB replicated, 8 GiB on the fuller stage of a two-stage
  // pipeline, 8.5 GiB as zero2 (3 gathered + 4.5 of shards + 1 unsharded gradient), 7.5 GiB as
  // zero3 (4.5 of shards + 3 units in flight); the devices hold 7.75 GiB.
  Problem problem;
  problem.graph = chain_of_three("parameters", 1LL << 30, 1 << 10, 1 << 10);
  problem.cluster = test::make_cluster(1, 2, 1e9, 0, 1e8, 0, 7936LL << 20);
  problem.job = default_job();
  problem.job.optimizer = Optimizer::kAdam;
  const SearchResult result = search(problem, SearchOptions{});
  REQUIRE(!result.plans.empty());
  const Plan& best = result.plans.front();
  REQUIRE(best.sharding == Sharding::kZero3);
  REQUIRE(best.dp == 2);
  REQUIRE(best.predicted.feasible);
  REQUIRE(best.recompute.empty());
  bool noted = false;
  for (const std::string& note : result.notes) noted |= note.find("best sharded") != std::string::npos;
  REQUIRE(noted);
  // Saved as JSON and read back, the plan keeps its sharding.
  REQUIRE(plan_from_json(plan_to_json(best, problem.graph), "plan.json").sharding == Sharding::kZero3);
  // Without sharding nothing fits.
  SearchOptions unsharded;
  unsharded.shardings = {Sharding::kNone};
  REQUIRE_THROWS_AS(search(problem, unsharded), InfeasibleError);
}

TEST_CASE("search: a pipeline stage recomputes selectively only where every node measured it",
          "[search][recompute]") {
  // Four nodes saving 1 GiB each at micro-batch 1, 1 MiB between them; n0-n2 measured selective
  // recompute (64 MiB kept), n3 did not. A 2-stage GPipe pipeline of 4 micro-batches holds 8 GiB
  // of activations per stage, more than the 3 GiB devices: every stage recomputes, and the one
  // holding n3 fully (plan validation refuses "selective" on it). Data parallelism rebuilds
  // 4 GiB at batch 4 and does not fit.
  Problem problem;
  problem.graph = chain_of_three("mixed", 0, 1 << 20, 1LL << 30);
  Node n3 = problem.graph.nodes[2];
  n3.id = 3;
  n3.name = "n3";
  problem.graph.nodes.push_back(n3);
  problem.graph.edges.push_back({2, 3, 1 << 20});
  for (int v = 0; v < 3; ++v) {
    problem.graph.nodes[v].selective_saved_bytes = 64 << 20;
    problem.graph.nodes[v].selective_recompute_fraction = 0.3;
  }
  problem.graph.finalize("mixed");
  problem.cluster = test::make_cluster(1, 2, 1e9, 0, 1e8, 0, 3LL << 30);
  problem.job = default_job();
  problem.job.per_replica_batches = {4};
  problem.job.num_microbatches = {4};
  SearchOptions options;
  options.schedules = {Schedule::kGpipe};
  options.top_k = 10;
  const SearchResult result = search(problem, options);
  REQUIRE(!result.plans.empty());
  int mixed_stages = 0;
  for (const Plan& plan : result.plans) {
    CHECK_NOTHROW(plan.validate("plan", problem.graph, problem.cluster));
    REQUIRE(plan.mode == MpMode::kPipeline);
    REQUIRE(plan.recompute.size() == 4);
    for (int32_t s = 0; s < plan.num_stages(); ++s) {
      bool some_measured = false, some_not = false;
      for (size_t v = 0; v < 4; ++v) {
        if (plan.assignment[v] != s) continue;
        (problem.graph.nodes[v].has_selective() ? some_measured : some_not) = true;
      }
      mixed_stages += some_measured && some_not;
      for (size_t v = 0; v < 4; ++v) {
        if (plan.assignment[v] != s) continue;
        CHECK(plan.recompute[v] == (some_not ? kRecomputeFull : kRecomputeSelective));
      }
    }
  }
  CHECK(mixed_stages > 0);  // a stage held measured and unmeasured nodes
}

TEST_CASE("search: a pipeline that fits only with recompute is split for recompute",
          "[search][recompute][pipeline]") {
  // Twelve equal layers (1 ms forward, 2 ms backward, 256 MiB of parameters, 1 GiB kept per
  // micro-batch, 1 MiB between them) on 5 GiB devices: a replica's 6 GiB of parameters and
  // gradients do not fit one device, two stages of six layers do not either (3 + 6 GiB
  // rebuilt). On four stages of 1F1B with four micro-batches (in flight 4, 3, 2, 1), a stage of
  // k layers keeping its activations holds 0.5 k + (4 - s) k GiB: the first stages fit one
  // layer, and no split of the twelve fits. Three layers a stage, recomputing (Megatron-LM's
  // layout: even stages, activation checkpointing), fits: 1.5 + 3 GiB rebuilt at once. The
  // search once split the stages for keeping (the least-memory split: the first stages short,
  // the last long) and then recomputed that split, whose long stages did not fit even
  // recomputing: nothing was found. The partition now chooses each stage's recompute with
  // its split.
  std::vector<test::NodeSpec> nodes;
  std::vector<test::EdgeSpec> edges;
  for (int i = 0; i < 12; ++i) {
    nodes.push_back({"layer" + std::to_string(i), 1e-3, 2e-3, 256LL << 20, 1 << 20});
    if (i > 0) edges.push_back({i - 1, i, 1 << 20});
  }
  Problem problem;
  problem.graph = test::make_graph(nodes, edges, 1, "layers12");
  for (Node& node : problem.graph.nodes) node.saved_bytes = 1LL << 30;
  problem.graph.finalize("layers12");
  problem.cluster = test::make_cluster(1, 4, 1e9, 0, 1e8, 0, 5LL << 30);
  problem.job = default_job();
  problem.job.per_replica_batches = {4};
  problem.job.num_microbatches = {4};
  SearchOptions options;
  options.placement = false;
  options.shardings = {Sharding::kNone};
  options.schedules = {Schedule::k1F1B};
  options.top_k = 1;
  REQUIRE(problem.graph.nodes.size() > static_cast<size_t>(options.exact_placement_max_nodes));

  // The hand layout: three layers a stage, every stage recomputing.
  std::vector<int32_t> even(12);
  for (int v = 0; v < 12; ++v) even[v] = v / 3;
  Plan hand = test::make_plan(problem.graph, problem.cluster, 1, 4, MpMode::kPipeline, 4, even, 4,
                              Schedule::k1F1B);
  hand.recompute.assign(12, kRecomputeFull);
  const Prediction hand_pred = evaluate(problem, hand);
  REQUIRE(hand_pred.feasible);
  Plan kept = hand;
  kept.recompute.clear();
  REQUIRE_FALSE(evaluate(problem, kept).feasible);

  const SearchResult result = search(problem, options);
  REQUIRE(!result.plans.empty());
  const Plan& best = result.plans.front();
  CHECK(best.predicted.feasible);
  REQUIRE(best.mp == 4);
  CHECK(best.predicted.step_s <= hand_pred.step_s * (1 + 1e-9));
  CHECK_NOTHROW(best.validate("search", problem.graph, problem.cluster));
  // a stage recomputes as a whole; the first (four micro-batches in flight) recomputes, the
  // last (one) keeps
  REQUIRE(best.recompute.size() == 12);
  for (int v = 1; v < 12; ++v) {
    if (best.assignment[v] == best.assignment[v - 1]) CHECK(best.recompute[v] == best.recompute[v - 1]);
  }
  CHECK(best.recompute[0] == kRecomputeFull);
  CHECK(best.recompute[11] == kRecomputeNone);
}

TEST_CASE("search: no replica or micro-batch gets fewer samples than the model accepts",
          "[search]") {
  // The problem of "search space on a 2x4 cluster", whose mp=2 pipelines run
  // M in {1, 2, 4, 12} at per-replica batch 12: with min_batch_size 4 (say, a model whose
  // forward fails below 4 samples), M = 4 (3 samples) and M = 12 (1 sample) are gone.
  Problem problem = three_nodes_on_two_by_four();
  problem.graph.profiled.min_batch_size = 4;
  const auto points = search_space(problem, SearchOptions{}, nullptr);
  for (const SearchSpacePoint& p : points) {
    CHECK(p.per_replica_batch / p.num_microbatches >= 4);
  }
  // M in {1, 2}: GPipe at both, 1F1B at 2 (M >= 2 stages)
  CHECK(std::count_if(points.begin(), points.end(), [](const SearchSpacePoint& p) {
          return p.mode == MpMode::kPipeline;
        }) == 3);

  // A replica batch below it is skipped, with the reason.
  problem.job.global_batches = {16};
  std::vector<std::string> skipped;
  const auto eight = search_space(problem, SearchOptions{}, &skipped);
  CHECK(std::none_of(eight.begin(), eight.end(),
                     [](const SearchSpacePoint& p) { return p.dp == 8; }));
  CHECK(std::find(skipped.begin(), skipped.end(),
                  "dp=8 mp=1 b=2: below the smallest batch the model accepts (graph "
                  "profiled.min_batch_size = 4)") != skipped.end());

  // A plan that would give a micro-batch fewer samples is refused where every plan is checked.
  problem.job = default_job();
  SearchSpacePoint point;
  point.dp = 4;
  point.mp = 2;
  point.mode = MpMode::kPipeline;
  point.per_replica_batch = 12;
  point.num_microbatches = 12;
  point.schedule = Schedule::kGpipe;
  const Plan plan = plan_skeleton(problem, point, "");
  CHECK_THROWS_WITH(plan.validate_fit("p.json", problem.graph, problem.cluster),
                    Catch::Matchers::Contains(
                        "p.json: num_microbatches must leave each forward at least graph") &&
                        Catch::Matchers::Contains("profiled.min_batch_size = 4 samples") &&
                        Catch::Matchers::Contains("(got 12)"));
}
