#include "catch.h"
#include "model_fixtures.h"
#include "planner/costs/evaluate.h"
#include "planner/reports/explain.h"

using namespace hybridplan;

TEST_CASE("compress_names folds numbered runs", "[explain]") {
  REQUIRE(compress_names({"features.0", "features.1", "features.2", "fc"}) == "features.[0-2], fc");
  REQUIRE(compress_names({"a.1", "a.3", "a.4"}) == "a.1, a.[3-4]");
  REQUIRE(compress_names({"x", "y", "z"}, 2) == "x, y, ... (+1 more)");
  REQUIRE(compress_names({}) == "");
}

TEST_CASE("explain shows configuration, mesh, stages, breakdown and memory", "[explain]") {
  Problem problem;
  problem.graph = test::make_graph({{"layer.0", 1, 2, 1 << 20, 1 << 10}, {"layer.1", 1, 2, 0, 1 << 10},
                                    {"layer.2", 1, 2, 0, 1 << 10}, {"head", 1, 2, 0, 0}},
                                   {{0, 1, 1024}, {1, 2, 1024}, {2, 3, 1024}}, 4, "net");
  problem.cluster = test::make_cluster(1, 4);
  Plan plan = test::make_plan(problem.graph, problem.cluster, 2, 2, MpMode::kPipeline, 8,
                              {0, 0, 1, 1}, 2, Schedule::kGpipe);
  plan.predicted = evaluate(problem, plan);
  const std::string text = explain(problem, plan);
  CAPTURE(text);
  REQUIRE(text.find("plan for graph \"net\" on cluster \"test-cluster\"") != std::string::npos);
  REQUIRE(text.find("4 devices = dp 2 x mp 2, mode pipeline (gpipe, 2 micro-batches of 4)") != std::string::npos);
  REQUIRE(text.find("replica 1: 2 3") != std::string::npos);
  // stage 0: 1 MiB params * 2 (sgd) + 2 KiB activations * 2 in flight + 2 KiB workspace
  // (layer.1's output and input gradients) + 2 KiB gradient receive buffers = 2 MiB + 8 KiB;
  // stage 1: 1 KiB * 2 in flight + 2 KiB workspace + 2 KiB activation receive buffers
  REQUIRE(text.find("stage 0 (2 nodes, 2.01 MiB of 1.00 TiB): layer.[0-1]") != std::string::npos);
  REQUIRE(text.find("stage 1 (2 nodes, 6.00 KiB of 1.00 TiB): layer.2, head") != std::string::npos);
  REQUIRE(text.find("feasible      yes") != std::string::npos);

  // Without the graph, names come from the plan as loaded from JSON.
  const Plan loaded = plan_from_json(plan_to_json(plan, problem.graph), "plan.json");
  REQUIRE(explain(loaded).find("layer.[0-1]") != std::string::npos);
  // Built in code and shown without the graph: positions stand in for names.
  REQUIRE(explain(plan).find("stage 1 (2 nodes, 6.00 KiB): node [2-3]") != std::string::npos);
}
