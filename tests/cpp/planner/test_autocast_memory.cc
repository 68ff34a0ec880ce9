// What a bf16 or fp16 job keeps for its backward on a float32 graph (costs/precision_cost.h
// "kept for backward"): the plans the executor autocasts (every plan but FSDP2's,
// precision_policy) take what the profile recorded under torch.autocast (Node
// autocast_saved_bytes and autocast_weight_copy_bytes, profiled.autocast_loss_backward_bytes),
// FSDP2's plans and graphs without the recording the float32 bytes halved.
#include "catch.h"
#include "model_fixtures.h"
#include "planner/costs/evaluate.h"
#include "planner/costs/precision_cost.h"
#include "planner/documents/problem.h"
#include "planner/reports/explain.h"

using namespace hybridplan;
using hybridplan::test::input_error_of;

namespace {

// norm (a layer norm: no parameters, keeps its fp32 input under autocast) -> fc (100 B of
// parameters), profiled in float32 at batch 4 with a loss; each keeps 400 B for its backward.
// With `recorded`, the profile's autocast bf16 recording: norm 400 B (whole: its saved input
// stays fp32), fc 200 B (half) and 50 B of weight copies, the loss's backward peak 1000 B as
// in float32. Trained in bf16 on 2 devices.
Problem norm_fc(bool recorded) {
  Problem p;
  p.graph = test::make_graph({{"norm", 1, 2, 0, 400}, {"fc", 1, 2, 100, 400}}, {{0, 1, 400}}, 4,
                             "norm_fc");
  p.graph.nodes[0].saved_bytes = 400;
  p.graph.nodes[1].saved_bytes = 400;
  p.graph.profiled.loss_backward_bytes = 1000;
  if (recorded) {
    p.graph.nodes[0].autocast_saved_bytes.bf16 = 400;
    p.graph.nodes[1].autocast_saved_bytes.bf16 = 200;
    p.graph.nodes[1].autocast_weight_copy_bytes.bf16 = 50;
    p.graph.profiled.autocast_loss_backward_bytes.bf16 = 1000;
  }
  p.graph.finalize("norm_fc");
  p.cluster = test::make_cluster(1, 2);
  p.cluster.device.compute_speedup = {{"bf16", 2.0}};
  p.job.optimizer = Optimizer::kSgd;
  p.job.precision = Precision::kBf16;
  return p;
}

Plan dp_plan(const Problem& p, int64_t batch, Sharding sharding = Sharding::kNone) {
  Plan plan = test::make_plan(p.graph, p.cluster, 2, 1, MpMode::kPlacement, batch, {0, 0});
  plan.precision = Precision::kBf16;
  plan.sharding = sharding;
  return plan;
}

}  // namespace

TEST_CASE("autocast memory: the policy of each plan kind, as executor/precision.py of_plan",
          "[autocast_memory]") {
  const Problem p = norm_fc(true);
  CHECK(precision_policy(dp_plan(p, 4)) == PrecisionPolicy::kAutocast);
  CHECK(precision_policy(dp_plan(p, 4, Sharding::kZero2)) == PrecisionPolicy::kFsdp);
  CHECK(precision_policy(dp_plan(p, 4, Sharding::kZero3)) == PrecisionPolicy::kFsdp);
  Plan pipeline = test::make_plan(p.graph, p.cluster, 1, 2, MpMode::kPipeline, 4, {0, 1}, 2,
                                  Schedule::k1F1B);
  CHECK(precision_policy(pipeline) == PrecisionPolicy::kAutocast);
  pipeline.sharding = Sharding::kZero2;  // a pipeline's zero2 is not FSDP2's policy
  CHECK(precision_policy(pipeline) == PrecisionPolicy::kAutocast);
}

TEST_CASE("autocast memory: the recording replaces the halving under autocast only",
          "[autocast_memory]") {
  const Problem p = norm_fc(true);
  const Problem autocast = in_job_precision(p, "cluster", PrecisionPolicy::kAutocast);
  CHECK(autocast.graph.nodes[0].saved_bytes == 400);  // the layer norm kept whole
  CHECK(autocast.graph.nodes[1].saved_bytes == 200);
  CHECK(autocast.graph.nodes[1].fixed_saved_bytes == 50);
  CHECK(autocast.graph.profiled.loss_backward_bytes == 1000);
  const Problem fsdp = in_job_precision(p, "cluster", PrecisionPolicy::kFsdp);
  CHECK(fsdp.graph.nodes[0].saved_bytes == 200);  // halved
  CHECK(fsdp.graph.nodes[1].saved_bytes == 200);
  CHECK(fsdp.graph.nodes[1].fixed_saved_bytes == 0);
  CHECK(fsdp.graph.profiled.loss_backward_bytes == 500);
  // fp16 has no recording here: halved under either policy
  Problem fp16 = p;
  fp16.job.precision = Precision::kFp16;
  fp16.cluster.device.compute_speedup = {{"fp16", 2.0}};
  CHECK(!records_autocast(fp16));
  CHECK(in_job_precision(fp16).graph.nodes[0].saved_bytes == 200);
  CHECK(in_job_precision(fp16).graph.profiled.loss_backward_bytes == 500);
}

TEST_CASE("autocast memory: a dp plan keeps the layer norm whole, a zero2 plan halves it",
          "[autocast_memory]") {
  const Problem recorded = norm_fc(true), halved = norm_fc(false);
  for (int64_t batch : {4, 8}) {  // at the profiled batch and at twice it
    const double scale = static_cast<double>(batch) / 4;
    INFO("batch " << batch);
    // dp (DDP under autocast): norm 400 B where halving priced 200, fc as halved (200) plus its
    // 50 B of weight copies, which do not scale with the batch; the loss's backward peak 1000
    // B where halving priced 500 (the last device's transient: it exceeds fc's workspace)
    const Prediction a = evaluate(recorded, dp_plan(recorded, batch));
    const Prediction b = evaluate(halved, dp_plan(halved, batch));
    CHECK(a.memory_bytes[0] - b.memory_bytes[0] ==
          static_cast<int64_t>(200 * scale + 50 + 500 * scale));
    // zero2 (FSDP2's MixedPrecisionPolicy: bf16 parameters, so every activation is bf16)
    const Prediction c = evaluate(recorded, dp_plan(recorded, batch, Sharding::kZero2));
    const Prediction d = evaluate(halved, dp_plan(halved, batch, Sharding::kZero2));
    CHECK(c.memory_bytes[0] == d.memory_bytes[0]);
  }
  // explain names how the kept bytes were priced, the halving without a recording an estimate
  CHECK(evaluate(recorded, dp_plan(recorded, 4)).memory_model ==
        "kept activations as profiled under torch.autocast in bf16 (fp32 layer-norm inputs and "
        "loss, the weight copies)");
  CHECK(evaluate(halved, dp_plan(halved, 4)).memory_model.rfind(
            "kept activations estimated at half the float32 profile's: the graph has no "
            "autocast bf16 recording", 0) == 0);
  CHECK(evaluate(recorded, dp_plan(recorded, 4, Sharding::kZero2)).memory_model.rfind(
            "kept activations at half the float32 profile's (FSDP2's", 0) == 0);
  const Plan plan = dp_plan(recorded, 4);
  Plan priced = plan;
  priced.predicted = evaluate(recorded, plan);
  CHECK(explain(recorded, priced).find("  memory        kept activations as "
                                                          "profiled under torch.autocast") !=
        std::string::npos);
  // fp32 plans are as before: no memory model
  Problem fp32 = recorded;
  fp32.job.precision = Precision::kFp32;
  Plan fp32_plan = plan;
  fp32_plan.precision = Precision::kFp32;
  CHECK(evaluate(fp32, fp32_plan).memory_model.empty());
}

TEST_CASE("autocast memory: the graph fields, read, written and checked", "[autocast_memory]") {
  const Problem p = norm_fc(true);
  Json j = graph_to_json(p.graph);
  CHECK(j["nodes"][0]["autocast_saved_bytes"] == Json::parse(R"({"bf16": 400})"));
  CHECK(j["nodes"][1]["autocast_weight_copy_bytes"] == Json::parse(R"({"bf16": 50})"));
  CHECK(j["profiled"]["autocast_loss_backward_bytes"] == Json::parse(R"({"bf16": 1000})"));
  CHECK(!graph_to_json(norm_fc(false).graph)["nodes"][0].contains("autocast_saved_bytes"));
  const Graph back = graph_from_json(j, "g.json");
  CHECK(back.nodes[1].autocast_saved_bytes.bf16 == 200);
  CHECK(back.nodes[1].autocast_saved_bytes.fp16 == -1);
  CHECK(back.nodes[1].autocast_weight_copy_bytes.bf16 == 50);
  CHECK(back.profiled.autocast_loss_backward_bytes.bf16 == 1000);
  CHECK(graph_sha256(back) == graph_sha256(p.graph));

  Json bad = j;
  bad["nodes"][0]["autocast_saved_bytes"] = {{"fp32", 4}};
  CHECK(input_error_of([&] { graph_from_json(bad, "g.json"); }) ==
        "g.json: nodes[0].autocast_saved_bytes.fp32 must be \"bf16\" or \"fp16\" (a 16-bit "
        "precision) (got \"fp32\")");
  bad = j;
  bad["nodes"][0]["autocast_saved_bytes"] = {{"bf16", -1}};
  CHECK(input_error_of([&] { graph_from_json(bad, "g.json"); }) ==
        "g.json: nodes[0].autocast_saved_bytes.bf16 must be >= 0 (got -1)");
  bad = j;
  bad["nodes"][0].erase("saved_bytes");
  CHECK(input_error_of([&] { graph_from_json(bad, "g.json"); }) ==
        "g.json: nodes[0].autocast_saved_bytes must be given with saved_bytes (got present)");
  bad = j;
  bad["nodes"][1]["autocast_weight_copy_bytes"] = {{"fp16", 50}};
  CHECK(input_error_of([&] { graph_from_json(bad, "g.json"); }) ==
        "g.json: nodes[1].autocast_weight_copy_bytes.fp16 must be given with "
        "autocast_saved_bytes.fp16 (got 50)");
  bad = j;
  bad["profiled"]["dtype"] = "bfloat16";
  CHECK(input_error_of([&] { graph_from_json(bad, "g.json"); }).find(
            "autocast_loss_backward_bytes is measured on a float32 profile only") !=
        std::string::npos);
  bad = j;
  bad["profiled"].erase("loss_backward_bytes");
  CHECK(input_error_of([&] { graph_from_json(bad, "g.json"); }) ==
        "g.json: profiled.autocast_loss_backward_bytes must be given with "
        "profiled.loss_backward_bytes (got present)");
}
