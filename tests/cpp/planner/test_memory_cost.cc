#include "catch.h"
#include "model_fixtures.h"
#include "planner/costs/memory_cost.h"

using namespace hybridplan;

TEST_CASE("memory: params + grads + optimizer state + activations x in-flight", "[memory_cost]") {
  REQUIRE(optimizer_state_copies(Optimizer::kSgd) == 0);
  REQUIRE(optimizer_state_copies(Optimizer::kSgdMomentum) == 1);
  REQUIRE(optimizer_state_copies(Optimizer::kAdam) == 2);
  REQUIRE(device_memory_bytes(100, 50.0, 3, {Optimizer::kAdam}) == 550);        // 100*4 + 50*3
  REQUIRE(device_memory_bytes(100, 50.0, 1, {Optimizer::kSgd}) == 250);         // 100*2 + 50
  REQUIRE(device_memory_bytes(100, 0.25, 2, {Optimizer::kSgdMomentum}) == 301); // 300 + ceil(0.5)
}

TEST_CASE("in-flight micro-batches: GPipe M, 1F1B min(M, S - s)", "[memory_cost]") {
  REQUIRE(in_flight_microbatches(Schedule::kNone, 1, 1, 0) == 1);
  REQUIRE(in_flight_microbatches(Schedule::kGpipe, 8, 4, 0) == 8);
  REQUIRE(in_flight_microbatches(Schedule::kGpipe, 8, 4, 3) == 8);
  REQUIRE(in_flight_microbatches(Schedule::k1F1B, 8, 4, 0) == 4);
  REQUIRE(in_flight_microbatches(Schedule::k1F1B, 8, 4, 3) == 1);
  REQUIRE(in_flight_microbatches(Schedule::k1F1B, 2, 4, 0) == 2);
}

TEST_CASE("the infeasibility reason names the device and how much is over", "[memory_cost]") {
  const int64_t gib = int64_t{1} << 30;
  REQUIRE(memory_infeasible_reason(MpMode::kPlacement, 1, 9, 18 * gib + gib / 5, 16 * gib) ==
          "device 1 (global device 9) needs 18.2 GiB > 16.0 GiB (over by 2.20 GiB)");
  REQUIRE(memory_infeasible_reason(MpMode::kPipeline, 0, 4, 1536, 1024) ==
          "stage 0 (global device 4) needs 1.50 KiB > 1.00 KiB (over by 512 B)");
}

TEST_CASE("backward workspace: measured, its parameter-sized part kept; else output + inputs",
          "[memory_cost]") {
  // a (100 B of parameters, 50 B of output) -> b (no parameters, 80 B of output), batch 2
  Graph g = test::make_graph({{"a", 1, 2, 100, 50}, {"b", 1, 2, 0, 80}}, {{0, 1, 50}}, 2, "ab");
  REQUIRE(backward_workspace_bytes(g, 0, 1.0) == 50);        // its output's gradient
  REQUIRE(backward_workspace_bytes(g, 1, 0.5) == 65);        // (80 + 50) / 2
  g.nodes[0].backward_workspace_bytes = 300;                 // 100 of them its parameters'
  g.nodes[1].backward_workspace_bytes = 60;                  // no parameters: all scales
  REQUIRE(backward_workspace_bytes(g, 0, 1.0) == 300);
  REQUIRE(backward_workspace_bytes(g, 0, 0.5) == 100 + 100);
  REQUIRE(backward_workspace_bytes(g, 1, 0.5) == 30);
  g.nodes[0].backward_workspace_bytes = 40;                  // smaller than its parameters
  REQUIRE(backward_workspace_bytes(g, 0, 0.25) == 40);
  g.profiled.loss_backward_bytes = 400;                      // the last node: at least the loss's
  REQUIRE(backward_workspace_bytes(g, 1, 0.5) == 200);
  REQUIRE(backward_workspace_bytes(g, 0, 0.5) == 40);
}
