// Gradient accumulation as a plan axis (Plan::accumulation_steps, Job::accumulation_steps):
// the step of K micro-steps priced against its formula (evaluate.h "accumulation"), the
// field's validation, and the search choosing K > 1 where memory binds and K = 1 where not.
#include <algorithm>
#include <cmath>
#include <string>

#include "catch.h"
#include "model_fixtures.h"
#include "planner/costs/evaluate.h"
#include "planner/documents/job.h"
#include "planner/searches/search.h"

using namespace hybridplan;

namespace {

// test::diamond_graph with the model's input 10 bytes per sample; one node of 4 devices,
// 100 B/s, 0.5 s latency (test_evaluate.cc's).
Problem diamond_problem() {
  Problem p;
  p.graph = test::diamond_graph();
  p.graph.profiled.input_bytes = 10;
  p.graph.finalize("diamond");
  p.cluster = test::make_cluster(1, 4, 100, 0.5);
  p.cluster.runtime.step_s = 0.25;
  p.cluster.device.memory_bandwidth_bytes_per_s = 100;
  return p;
}

Plan with_steps(Plan plan, int64_t k) {
  plan.accumulation_steps = k;
  plan.global_batch = plan.dp * plan.per_replica_batch * k;
  return plan;
}

}  // namespace

TEST_CASE("accumulation: a step of K micro-steps is K computes, one synchronisation",
          "[accumulation]") {
  const Problem problem = diamond_problem();
  const Plan one = test::make_plan(problem.graph, problem.cluster, 4, 1, MpMode::kPlacement, 3,
                                   {0, 0, 0, 0});
  const Prediction p1 = evaluate(problem, one);
  // test_evaluate.cc "pure data parallelism": compute (7 + 14) * 3 = 63, 7.5 s exposed
  REQUIRE(p1.compute_s == 63);
  REQUIRE(p1.allreduce_s == 7.5);
  for (const int64_t k : {2, 3, 8}) {
    INFO("K = " << k);
    const Plan plan = with_steps(one, k);
    const Prediction p = evaluate(problem, plan);
    // step_s = K * compute + allreduce (the last micro-step's backward overlaps it) + optimizer
    // + the runtime's per-step cost, each once
    CHECK(p.compute_s == k * 63.0);
    CHECK(p.allreduce_s == 7.5);
    CHECK(p.optimizer_s == p1.optimizer_s);
    CHECK(p.overhead_s == 0.25);
    CHECK(p.step_s == Approx(k * 63.0 + 7.5 + p1.optimizer_s + 0.25).epsilon(1e-12));
    CHECK(p.samples_per_s == Approx(static_cast<double>(4 * 3 * k) / p.step_s));
    // memory: one micro-step's activations; the step's whole input batch (10 B x 3 per
    // micro-step) held by the caller
    REQUIRE(p.memory_bytes.size() == 1);
    CHECK(p.memory_bytes[0] - p1.memory_bytes[0] == (k - 1) * 30);
  }
}

TEST_CASE("accumulation: a pipeline runs its schedule K times", "[accumulation]") {
  Problem problem = diamond_problem();
  const Plan one = test::make_plan(problem.graph, problem.cluster, 2, 2, MpMode::kPipeline, 4,
                                   {0, 0, 1, 1}, 2, Schedule::kGpipe);
  const Prediction p1 = evaluate(problem, one);
  const Prediction p3 = evaluate(problem, with_steps(one, 3));
  CHECK(p3.compute_s == Approx(3 * p1.compute_s));
  CHECK(p3.bubble_s == Approx(3 * p1.bubble_s));
  CHECK(p3.transfer_s == Approx(3 * p1.transfer_s));
  CHECK(p3.allreduce_s == Approx(p1.allreduce_s));
  CHECK(p3.step_s == Approx(3 * p1.compute_s + p1.allreduce_s + p1.optimizer_s + p1.overhead_s));
}

TEST_CASE("accumulation: sharded micro-steps gather again, reduce once, hold whole gradients",
          "[accumulation][sharding]") {
  Problem problem = diamond_problem();  // P = 300 B: a 100, c 200
  problem.cluster.runtime.step_s = 0;
  problem.job.optimizer = Optimizer::kAdam;
  Plan plan = test::make_plan(problem.graph, problem.cluster, 2, 1, MpMode::kPlacement, 1,
                              {0, 0, 0, 0});
  const Prediction none = evaluate(problem, plan);
  plan.sharding = Sharding::kZero2;
  const Prediction z2 = evaluate(problem, plan);
  // test_evaluate.cc: zero2's collectives cost 2 s past the compute (the last reduce-scatter
  // 1 s, a's gather 1 s); memory P + 3P/2 + c's 200 B = 950 B against 1200 B unsharded
  REQUIRE(z2.sharding_s == Approx(2.0));
  const Prediction z2k = evaluate(problem, with_steps(plan, 2));
  // the first micro-step gathers a (1 s, exposed: a's forward waits) and reduces nothing
  CHECK(z2k.sharding_s == Approx(2.0 + 1.0));
  CHECK(z2k.compute_s == 2 * z2.compute_s);
  // accumulating: every unit's unsharded gradient held, 2P + 3P/2 = 1050 B (+ 10 B more input)
  CHECK(z2k.memory_bytes[0] - none.memory_bytes[0] == 1050 - 1200 + 10);
  plan.sharding = Sharding::kZero3;
  const Prediction z3k = evaluate(problem, with_steps(plan, 2));
  // P + 3P/2 + 2 units of c (gathered, prefetched; its gradient is among P) = 1150 B
  CHECK(z3k.memory_bytes[0] - none.memory_bytes[0] == 1150 - 1200 + 10);
}

TEST_CASE("accumulation: the plan's field, written, read and validated", "[accumulation][plan]") {
  const Problem problem = diamond_problem();
  const Plan one = test::make_plan(problem.graph, problem.cluster, 2, 1, MpMode::kPlacement, 3,
                                   {0, 0, 0, 0});
  const Json j1 = plan_to_json(one, problem.graph);
  CHECK_FALSE(j1.contains("accumulation_steps"));  // absent: 1
  CHECK(plan_from_json(j1, "p.json").accumulation_steps == 1);
  const Json j4 = plan_to_json(with_steps(one, 4), problem.graph);
  CHECK(j4["accumulation_steps"] == 4);
  CHECK(j4["global_batch"] == 24);
  CHECK(plan_from_json(j4, "p.json").accumulation_steps == 4);
  Json bad = j4;
  bad["accumulation_steps"] = 0;
  CHECK(test::input_error_of([&] { plan_from_json(bad, "p.json"); }) ==
        "p.json: accumulation_steps must be >= 1 (got 0)");
  bad["accumulation_steps"] = 70000;
  CHECK(test::input_error_of([&] { plan_from_json(bad, "p.json"); }) ==
        "p.json: accumulation_steps must be at most 65536 (2^16 steps) (got 70000)");
  bad["accumulation_steps"] = 2;
  CHECK(test::input_error_of([&] { plan_from_json(bad, "p.json"); }) ==
        "p.json: global_batch must equal dp * per_replica_batch * accumulation_steps = 12 "
        "(got 24)");
  bad["accumulation_steps"] = "2";
  CHECK_THROWS_AS(plan_from_json(bad, "p.json"), InputError);
}

TEST_CASE("accumulation: the job's candidates", "[accumulation][job]") {
  const auto job = [](Json extra) {
    Json j = {{"schema_version", 1}, {"kind", "hybridplan.job"}};
    if (!extra.is_null()) j.update(extra);
    return job_from_json(j, "job.json");
  };
  CHECK(job({}).accumulation_candidates() == BatchCandidates{1});
  CHECK(job({{"global_batch", 64}}).accumulation_candidates() ==
        BatchCandidates{1, 2, 4, 8, 16, 32, 64});
  CHECK(job({{"accumulation_steps", {{"min", 1}, {"max", 8}}}}).accumulation_candidates() ==
        BatchCandidates{1, 2, 4, 8});
  CHECK(job({{"global_batch", 64}, {"accumulation_steps", 4}}).accumulation_candidates() ==
        BatchCandidates{4});
  CHECK(test::input_error_of([&] { job({{"accumulation_steps", 0}}); }) ==
        "job.json: accumulation_steps must be >= 1 (got 0)");
  CHECK(test::input_error_of([&] { job({{"accumulation_steps", 100000}}); }) ==
        "job.json: accumulation_steps must be at most 65536 (2^16 steps) (got 100000)");
  const Job round = job({{"global_batch", 64}, {"accumulation_steps", {1, 4}}});
  CHECK(job_to_json(round)["accumulation_steps"] == Json({1, 4}));
}

namespace {

// a -> b on one device: forward 1 s and backward 2 s per sample each (linear in the batch),
// 100 B of parameters each, 1000 B of output per sample each; the job's global batch 8.
// A batch of b needs 400 B (parameters and gradients) + 2000 b kept + 2000 b of b's backward
// workspace + 1000 b of output held: 400 + 5000 b, 20,400 B at 4 and 40,400 B at 8.
Problem memory_bound_problem(int64_t memory_bytes) {
  Problem p;
  p.graph = test::make_graph({{"a", 1, 2, 100, 1000}, {"b", 1, 2, 100, 1000}}, {{0, 1, 1000}},
                             1, "ab");
  p.cluster = test::make_cluster(1, 1, 1e9, 0, 1e8, 0, memory_bytes);
  p.job.global_batches = {8};
  return p;
}

}  // namespace

TEST_CASE("accumulation: the search accumulates where memory binds, and not otherwise",
          "[accumulation][search]") {
  SECTION("memory binds: the global batch of 8 in 2 micro-steps of 4") {
    const Problem problem = memory_bound_problem(25'000);
    const SearchResult r = search(problem, SearchOptions{});
    REQUIRE(!r.plans.empty());
    const Plan& best = r.plans.front();
    CHECK(best.accumulation_steps == 2);
    CHECK(best.per_replica_batch == 4);
    CHECK(best.global_batch == 8);
    CHECK(best.recompute.empty());
    // 2 micro-steps of (1 + 1 + 2 + 2) s x 4 samples: 48 s, as the batch of 8 at once
    CHECK(best.predicted.compute_s == Approx(48));
    CHECK(best.predicted.memory_bytes[0] == 20'400);
    // K = 1 does not fit, recomputing or not
    Plan k1 = best;
    k1.accumulation_steps = 1;
    k1.per_replica_batch = 8;
    CHECK(evaluate(problem, k1).memory_bytes[0] == 40'400);
    CHECK_FALSE(evaluate(problem, k1).feasible);
    k1.recompute = {kRecomputeFull, kRecomputeFull};
    CHECK_FALSE(evaluate(problem, k1).feasible);
    // no more steps than memory needs: K = 4 was not tried past the fitting K = 2
    for (const Plan& p : r.plans) CHECK(p.accumulation_steps <= 2);
    CHECK(std::any_of(r.notes.begin(), r.notes.end(), [](const std::string& n) {
      return n.find("gradient accumulation") != std::string::npos;
    }));
  }
  SECTION("memory does not bind: one step of 8") {
    const Problem problem = memory_bound_problem(int64_t{1} << 30);
    const SearchResult r = search(problem, SearchOptions{});
    REQUIRE(!r.plans.empty());
    for (const Plan& p : r.plans) CHECK(p.accumulation_steps == 1);
    CHECK(r.plans.front().per_replica_batch == 8);
  }
  SECTION("a job fixing K: the search takes it") {
    Problem problem = memory_bound_problem(int64_t{1} << 30);
    problem.job.accumulation_steps = {4};
    const SearchResult r = search(problem, SearchOptions{});
    REQUIRE(!r.plans.empty());
    CHECK(r.plans.front().accumulation_steps == 4);
    CHECK(r.plans.front().per_replica_batch == 2);
  }
  SECTION("listed steps with a global batch: each searched, the faster kept") {
    Problem problem = memory_bound_problem(int64_t{1} << 30);
    problem.job.accumulation_steps = {1, 2};
    SearchOptions options;
    options.top_k = 4;
    const SearchResult r = search(problem, options);
    REQUIRE(r.plans.size() == 2);
    CHECK(r.plans.front().accumulation_steps == 1);  // equal steps here: ties go to fewer steps
    CHECK(r.plans.back().accumulation_steps == 2);
    CHECK(r.plans.back().per_replica_batch == 4);
    CHECK(r.plans.back().global_batch == 8);
  }
  SECTION("per-replica batches: each K is its own global batch, ranked by the objective") {
    Problem problem = memory_bound_problem(int64_t{1} << 30);
    problem.job.global_batches.clear();
    problem.job.per_replica_batches = {4};
    problem.job.accumulation_steps = {1, 2};
    problem.cluster.device.memory_bandwidth_bytes_per_s = 1000;  // an optimizer step to spread
    SearchOptions options;
    options.top_k = 4;
    const SearchResult r = search(problem, options);
    REQUIRE(r.plans.size() == 2);
    // samples/s: the fixed optimizer step spread over twice the samples at K = 2
    CHECK(r.plans.front().accumulation_steps == 2);
    CHECK(r.plans.front().global_batch == 8);
    CHECK(r.plans.back().global_batch == 4);
  }
}
