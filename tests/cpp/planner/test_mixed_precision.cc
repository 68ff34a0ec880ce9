// Mixed-precision training (Job::precision bf16 / fp16): an fp32 master copy and fp32 optimizer
// state beside the 16-bit parameters and gradients, in every memory formula of memory_cost.h
// and in the optimizer step's bytes (optimizer_cost.h); fp32, the numbers of before. A graph
// profiled in float32 is priced in the precision (costs/precision_cost.h): compute at the
// device's measured rate, activations, messages and TP collectives at 2 bytes, gradients
// reduced in fp32.
#include "catch.h"
#include "model_fixtures.h"
#include "planner/costs/evaluate.h"
#include "planner/costs/memory_cost.h"
#include "planner/costs/optimizer_cost.h"
#include "planner/costs/precision_cost.h"
#include "planner/documents/job.h"
#include "planner/documents/problem.h"
#include "planner/searches/search.h"

using namespace hybridplan;
using hybridplan::test::input_error_of;

namespace {

// Two nodes a (100 B of parameters) and b (200 B), profiled in float16 at batch 1; one node of
// two devices, 100 B/s without latency, 100 B/s of memory bandwidth.
Problem fp16_problem(Optimizer optimizer, bool mixed) {
  Problem p;
  p.graph = test::make_graph({{"a", 1, 2, 100, 10}, {"b", 1, 2, 200, 10}}, {{0, 1, 10}}, 1, "ab");
  p.graph.profiled.dtype = "float16";
  p.graph.finalize("ab");
  p.cluster = test::make_cluster(1, 2, 100, 0);
  p.cluster.device.memory_bandwidth_bytes_per_s = 100;
  p.job.optimizer = optimizer;
  p.job.precision = mixed ? Precision::kBf16 : Precision::kFp32;
  return p;
}

}  // namespace

TEST_CASE("mixed precision: the optimizer's copies in every sharding variant", "[memory_cost]") {
  // Adam in fp16 (r = 4 / 2): O = Os = 2 * (1 + 2) = 6 parameter bytes per parameter byte.
  const OptimizerState mixed{Optimizer::kAdam, 2.0};
  CHECK(mixed.copies() == 6);
  CHECK(mixed.shard_copies() == 6);
  ShardedState state;
  // none: 2P + 6P = 8P, Megatron-LM's 16 bytes per fp16 parameter (2 + 2 + 4 + 4 + 4)
  CHECK(parameter_state_bytes(2, mixed, state) == 16);
  CHECK(parameter_state_bytes(100, mixed, state) == 800);
  state.dp = 4;
  state.largest_unit_bytes = 10;
  state.sharding = Sharding::kZero2;  // P + 6 P/d + U
  CHECK(parameter_state_bytes(100, mixed, state) == Approx(100 + 600.0 / 4 + 10));
  state.sharding = Sharding::kZero3;  // 6 P/d + 2 U (collectives not overlapped)
  CHECK(parameter_state_bytes(100, mixed, state) == Approx(600.0 / 4 + 20));
  state.overlapped = true;  // + the prefetched unit
  CHECK(parameter_state_bytes(100, mixed, state) == Approx(600.0 / 4 + 30));
  state.sharding = Sharding::kZero2;
  state.pipeline = true;  // 2P + 6 P/d
  CHECK(parameter_state_bytes(100, mixed, state) == Approx(200 + 600.0 / 4));
  // Without mixed precision: the formulas of before (O = k_opt, Os = 1 + k_opt).
  const OptimizerState plain{Optimizer::kAdam};
  CHECK(plain.copies() == 2);
  CHECK(plain.shard_copies() == 3);
  CHECK(parameter_state_bytes(100, plain, ShardedState{}) == 400);
  CHECK(parameter_state_bytes(100, plain, state) == Approx(200 + 300.0 / 4));
  // SGD in bf16: a master copy and nothing else, 2P + 2P.
  CHECK(parameter_state_bytes(100, OptimizerState{Optimizer::kSgd, 2.0}, ShardedState{}) == 400);
  // bytes the step touches per parameter byte: 3 + 2 k_opt, or 2 + 2 r (1 + k_opt)
  CHECK(optimizer_bytes_touched_per_param_byte(plain) == 7);
  CHECK(optimizer_bytes_touched_per_param_byte(mixed) == 14);  // 28 B per fp16 parameter
  CHECK(optimizer_bytes_touched_per_param_byte(OptimizerState{Optimizer::kSgdMomentum, 2.0}) == 10);
}

TEST_CASE("mixed precision: r = 4 / the precision's bytes, refused on an unknown dtype",
          "[memory_cost]") {
  Problem p = fp16_problem(Optimizer::kAdam, true);
  CHECK(optimizer_state(p.job, p.graph).master_ratio == 2);
  p.graph.profiled.dtype = "bfloat16";
  CHECK(optimizer_state(p.job, p.graph).master_ratio == 2);
  p.graph.profiled.dtype = "16-bit";  // a config graph's other element sizes
  CHECK(optimizer_state(p.job, p.graph).master_ratio == 2);
  p.graph.profiled.dtype = "float32";  // priced in the precision's dtype (precision_cost.h)
  CHECK(optimizer_state(p.job, p.graph).master_ratio == 2);
  CHECK_NOTHROW(p.validate());
  p.graph.profiled.dtype = "float64";
  CHECK(input_error_of([&] { optimizer_state(p.job, p.graph); }) ==
        "job: precision needs a graph profiled in float32 or a 16-bit dtype (float16, "
        "bfloat16): graph \"ab\" has profiled.dtype \"float64\" (got \"bf16\")");
  CHECK(input_error_of([&] { p.validate(); }).rfind("problem (job): precision needs", 0) == 0);
  CHECK_THROWS_AS(Evaluator(p), InputError);
  p.graph.profiled.dtype = "posit16";
  CHECK(input_error_of([&] { optimizer_state(p.job, p.graph); }) ==
        "job: precision needs a graph profiled in float32 or a 16-bit dtype (float16, "
        "bfloat16): graph \"ab\" has profiled.dtype \"posit16\" (an unknown dtype) (got "
        "\"bf16\")");
  p.job.precision = Precision::kFp32;  // without it any dtype goes, as before
  CHECK(optimizer_state(p.job, p.graph).master_ratio == 0);
  CHECK_NOTHROW(p.validate());
  CHECK(dtype_bytes("float64") == 8);
  CHECK(dtype_bytes("12-bit") == std::nullopt);
  CHECK(dtype_bytes("-bit") == std::nullopt);
  CHECK(dtype_bytes("123-bit") == std::nullopt);
}

TEST_CASE("precision: a job field, written only when not fp32; mixed_precision read as bf16",
          "[job]") {
  const Json base = Json::parse(R"({"schema_version": 1, "kind": "hybridplan.job"})");
  CHECK(job_from_json(base, "job.json").precision == Precision::kFp32);
  CHECK(!job_to_json(job_from_json(base, "job.json")).contains("precision"));
  Json j = base;
  j["mixed_precision"] = true;  // the older form
  const Job job = job_from_json(j, "job.json");
  CHECK(job.precision == Precision::kBf16);
  CHECK(job_to_json(job)["precision"] == "bf16");
  CHECK(!job_to_json(job).contains("mixed_precision"));
  j["mixed_precision"] = "fp16";
  CHECK(input_error_of([&] { job_from_json(j, "job.json"); }) ==
        "job.json: mixed_precision must be true or false (got \"fp16\")");
  j = base;
  j["precision"] = "fp16";
  CHECK(job_from_json(j, "job.json").precision == Precision::kFp16);
  j["mixed_precision"] = false;
  CHECK(input_error_of([&] { job_from_json(j, "job.json"); }) ==
        "job.json: mixed_precision must agree with \"precision\": \"fp16\" (true is \"bf16\", "
        "false \"fp32\"; give precision alone) (got false)");
  j.erase("mixed_precision");
  j["precision"] = "float16";
  CHECK(input_error_of([&] { job_from_json(j, "job.json"); }) ==
        "job.json: precision must be one of \"fp32\", \"bf16\", \"fp16\" (got \"float16\")");
}

TEST_CASE("precision: a plan field, copied from the job by the search and checked by evaluate",
          "[plan]") {
  Problem p = fp16_problem(Optimizer::kAdam, true);
  Plan plan = test::make_plan(p.graph, p.cluster, 2, 1, MpMode::kPlacement, 1, {0, 0});
  Json j = plan_to_json(plan, p.graph);
  CHECK(!j.contains("precision"));  // absent: fp32
  plan.precision = Precision::kBf16;
  j = plan_to_json(plan, p.graph);
  CHECK(j["precision"] == "bf16");
  CHECK(plan_from_json(j, "plan.json").precision == Precision::kBf16);
  j["precision"] = "half";
  CHECK(input_error_of([&] { plan_from_json(j, "plan.json"); }) ==
        "plan.json: precision must be one of \"fp32\", \"bf16\", \"fp16\" (got \"half\")");
  CHECK_NOTHROW(evaluate(p, plan));
  plan.precision = Precision::kFp16;
  CHECK(input_error_of([&] { evaluate(p, plan); }) ==
        "plan: precision must be the job's precision \"bf16\" (a plan is priced and applied in "
        "the precision of the job it was planned for) (got \"fp16\")");
}

TEST_CASE("precision: a float32 graph priced in bf16", "[evaluate]") {
  // The fp16 problem's graph, profiled in float32 instead: 300 B of fp32 parameters.
  Problem fp32 = fp16_problem(Optimizer::kSgd, false);
  fp32.graph.profiled.dtype = "float32";
  Problem bf16 = fp32;
  bf16.job.precision = Precision::kBf16;
  const Plan dp2 = test::make_plan(fp32.graph, fp32.cluster, 2, 1, MpMode::kPlacement, 1, {0, 0});
  const Plan mp2 = test::make_plan(fp32.graph, fp32.cluster, 1, 2, MpMode::kPlacement, 1, {0, 1});
  CHECK(input_error_of([&] { evaluate(bf16, dp2); }).rfind(
            "cluster: device.compute_speedup.bf16 is needed to plan the job's precision \"bf16\" "
            "on graph \"ab\" (profiled in float32)", 0) == 0);
  bf16.cluster.device.compute_speedup = {{"bf16", 2.0}};
  const Prediction a = evaluate(fp32, dp2), b = evaluate(bf16, dp2);
  CHECK(b.compute_s == Approx(a.compute_s / 2));        // the device's rate for bf16
  CHECK(b.allreduce_s == Approx(a.allreduce_s));        // gradients reduced in fp32
  // memory: fp32 2P + 1P... SGD: P (2 + 0) = 600 B before; 150 B bf16 parameters x (2 + 2) = 600
  // (the fp32 master copy is the 300 B the fp32 run held), activations halved
  CHECK(b.memory_bytes[0] < a.memory_bytes[0]);
  // the edge a -> b (10 B) crosses the devices under mp = 2: half the bytes in bf16
  const Prediction c = evaluate(fp32, mp2), d = evaluate(bf16, mp2);
  CHECK(c.compute_s - d.compute_s > 0);
  Problem converted = in_job_precision(bf16);
  CHECK(converted.graph.profiled.dtype == "bfloat16");
  CHECK(converted.graph.nodes[0].param_bytes == 50);
  CHECK(converted.graph.edges[0].bytes == 5);
  CHECK(converted.graph.nodes[0].forward_s == Approx(fp32.graph.nodes[0].forward_s / 2));
  CHECK(gradient_reduce_ratio(bf16) == 2);
  CHECK(gradient_reduce_ratio(fp32) == 1);
  CHECK(gradient_reduce_ratio(fp16_problem(Optimizer::kSgd, true)) == 1);  // a 16-bit graph
}

TEST_CASE("mixed precision: evaluate's memory and optimizer step, the all-reduce unchanged",
          "[evaluate]") {
  const Problem plain = fp16_problem(Optimizer::kAdam, false);
  const Problem mixed = fp16_problem(Optimizer::kAdam, true);
  const Plan dp2 = test::make_plan(plain.graph, plain.cluster, 2, 1, MpMode::kPlacement, 1, {0, 0});
  const Prediction a = evaluate(plain, dp2);
  const Prediction b = evaluate(mixed, dp2);
  // memory: P (2 + 2) = 1200 B before, 2P + 6P = 2400 B with fp32 masters and moments
  REQUIRE(a.memory_bytes.size() == 1);
  CHECK(b.memory_bytes[0] - a.memory_bytes[0] == 2400 - 1200);
  // optimizer: 300 B * 7 / 100 B/s = 21 s before, 300 * 14 / 100 = 42 s
  CHECK(a.optimizer_s == Approx(21));
  CHECK(b.optimizer_s == Approx(42));
  // the gradients all-reduced are the graph's fp16 ones
  CHECK(b.allreduce_s == a.allreduce_s);
  CHECK(b.compute_s == a.compute_s);
  // zero2 over the two replicas: P + 6 P/2 + b's 200 B = 1400 (before: P + 3 P/2 + 200 = 950)
  Plan zero2 = dp2;
  zero2.sharding = Sharding::kZero2;
  CHECK(evaluate(mixed, zero2).memory_bytes[0] - b.memory_bytes[0] == 1400 - 2400);
  CHECK(evaluate(plain, zero2).memory_bytes[0] - a.memory_bytes[0] == 950 - 1200);
  // a sharded step updates half the bytes
  CHECK(evaluate(mixed, zero2).optimizer_s == Approx(150.0 * 14 / 100));
}

TEST_CASE("precision: the search's plans carry the job's, and bf16 is priced on them", "[search]") {
  Problem fp32 = fp16_problem(Optimizer::kAdam, false);
  fp32.graph.profiled.dtype = "float32";
  fp32.cluster.device.compute_speedup = {{"bf16", 2.0}};
  Problem bf16 = fp32;
  bf16.job.precision = Precision::kBf16;
  const SearchResult a = search(fp32, SearchOptions{}), b = search(bf16, SearchOptions{});
  REQUIRE(!a.plans.empty());
  REQUIRE(!b.plans.empty());
  for (const Plan& plan : a.plans) CHECK(plan.precision == Precision::kFp32);
  for (const Plan& plan : b.plans) {
    CHECK(plan.precision == Precision::kBf16);
    CHECK(plan.predicted.step_s == Approx(evaluate(bf16, plan).step_s));  // priced in bf16
  }
  CHECK(plan_to_json(b.plans.front(), bf16.graph)["precision"] == "bf16");
}
