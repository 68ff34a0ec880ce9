// torch.compile per block, priced: Graph nodes[].compile_speedup (read, written, validated),
// a Job with "compile" dividing each node's times by it, and the plans carrying "compile".
#include <string>

#include "catch.h"
#include "model_fixtures.h"
#include "planner/costs/evaluate.h"
#include "planner/searches/search.h"

using namespace hybridplan;

namespace {

// a -> b, forward 1 s and backward 2 s each at the profiled batch 1, on one device.
Problem ab_problem() {
  Problem p;
  p.graph = test::make_graph({{"a", 1, 2, 100, 10}, {"b", 1, 2, 100, 10}}, {{0, 1, 10}}, 1, "ab");
  p.cluster = test::make_cluster(1, 1);
  return p;
}

}  // namespace

TEST_CASE("compile: the graph's per-node speed-up, read and written", "[compile][graph]") {
  Problem p = ab_problem();
  p.graph.nodes[0].compile_forward_speedup = 2;
  p.graph.nodes[0].compile_backward_speedup = 1.25;
  const Json j = graph_to_json(p.graph);
  CHECK(j["nodes"][0]["compile_speedup"] == Json({{"forward", 2.0}, {"backward", 1.25}}));
  CHECK_FALSE(j["nodes"][1].contains("compile_speedup"));  // absent: not measured
  const Graph back = graph_from_json(j, "g.json");
  CHECK(back.nodes[0].compile_forward_speedup == 2);
  CHECK(back.nodes[0].compile_backward_speedup == 1.25);
  CHECK_FALSE(back.nodes[1].has_compile_speedup());
  Json bad = j;
  bad["nodes"][0]["compile_speedup"]["backward"] = 0;
  CHECK(test::input_error_of([&] { graph_from_json(bad, "g.json"); }) ==
        "g.json: nodes[0].compile_speedup.backward must be finite and > 0 (eager time / "
        "compiled time) (got 0)");
  bad["nodes"][0]["compile_speedup"] = {{"forward", 2}};
  CHECK_THROWS_AS(graph_from_json(bad, "g.json"), InputError);
}

TEST_CASE("compile: a compiled job's nodes run at their measured speed-up", "[compile]") {
  Problem problem = ab_problem();
  problem.graph.nodes[0].compile_forward_speedup = 2;    // a: forward 1 -> 0.5 s
  problem.graph.nodes[0].compile_backward_speedup = 4;   //    backward 2 -> 0.5 s
  // b not measured: priced eager (1 + 2 s)
  Plan plan = test::make_plan(problem.graph, problem.cluster, 1, 1, MpMode::kPlacement, 1, {0, 0});
  const Prediction eager = evaluate(problem, plan);
  CHECK(eager.compute_s == 6);
  problem.job.compile = true;
  CHECK(test::input_error_of([&] { evaluate(problem, plan); }) ==
        "plan: compile must be the job's compile = true (a plan is priced and applied compiled "
        "or eager as the job it was planned for says) (got false)");
  plan.compile = true;
  const Prediction compiled = evaluate(problem, plan);
  CHECK(compiled.compute_s == Approx(0.5 + 0.5 + 1 + 2));
  // the search prices the same and marks its plans
  const SearchResult r = search(problem, SearchOptions{});
  REQUIRE(!r.plans.empty());
  CHECK(r.plans.front().compile);
  CHECK(r.plans.front().predicted.compute_s == Approx(4));
  const Json j = plan_to_json(r.plans.front(), problem.graph);
  CHECK(j["compile"] == true);
  CHECK(plan_from_json(j, "p.json").compile);
}

TEST_CASE("compile: blocks the executor runs eager are priced eager", "[compile]") {
  // a -> b -> c -> d, one node per stage of a two-stages-per-rank schedule on 2 ranks, every
  // node measured 2x faster compiled. The executor runs every block of a schedule that splits
  // the backward eager (executor/compiling.py eager_reason), and a block recomputed
  // selectively eager under any schedule (compiled_names): the planner prices what it runs.
  Problem problem;
  problem.graph = test::make_graph({{"a", 1, 2, 100, 10}, {"b", 1, 2, 100, 10},
                                    {"c", 1, 2, 100, 10}, {"d", 1, 2, 100, 10}},
                                   {{0, 1, 10}, {1, 2, 10}, {2, 3, 10}}, 2, "abcd");
  problem.cluster = test::make_cluster(1, 2, 100, 0);
  for (Node& n : problem.graph.nodes) {
    n.compile_forward_speedup = 2;
    n.compile_backward_speedup = 2;
  }
  const auto compute_s = [&](Schedule schedule, bool compile) {
    Problem p = problem;
    p.job.compile = compile;
    Plan plan = test::make_plan(p.graph, p.cluster, 1, 2, MpMode::kPipeline, 4, {0, 1, 2, 3}, 2,
                                schedule);
    plan.virtual_stages = 2;
    plan.compile = compile;
    return evaluate(p, plan).compute_s;
  };
  CHECK(blocks_run_eager(test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline,
                                         4, {0, 1, 2, 3}, 2, Schedule::kZBV)));
  CHECK_FALSE(blocks_run_eager(test::make_plan(problem.graph, problem.cluster, 1, 2,
                                               MpMode::kPipeline, 4, {0, 1, 2, 3}, 2,
                                               Schedule::kInterleaved1F1B)));
  for (Schedule zero_bubble : {Schedule::kZBV, Schedule::kInterleavedZB}) {
    CHECK(compute_s(zero_bubble, true) == Approx(compute_s(zero_bubble, false)));
  }
  CHECK(compute_s(Schedule::kInterleaved1F1B, true) <
        0.75 * compute_s(Schedule::kInterleaved1F1B, false));

  // placement on one device: a recomputed selectively (its cheap half), b in full
  Problem two = ab_problem();
  for (Node& n : two.graph.nodes) {
    n.compile_forward_speedup = 2;
    n.compile_backward_speedup = 2;
    n.selective_recompute_fraction = 0.5;
    n.selective_saved_bytes = 0;
    n.selective_ops = 1;
  }
  const auto placement_s = [&](bool compile) {
    Problem p = two;
    p.job.compile = compile;
    Plan plan = test::make_plan(p.graph, p.cluster, 1, 1, MpMode::kPlacement, 1, {0, 0});
    plan.compile = compile;
    plan.recompute = {kRecomputeSelective, kRecomputeFull};
    return evaluate(p, plan).compute_s;
  };
  // eager: a 1 + 2 + 0.5 recomputed (+ the dispatch), b 1 + 2 + 1; compiled: b at half
  CHECK(placement_s(false) - placement_s(true) == Approx((1 + 2 + 1) / 2.0));
}
