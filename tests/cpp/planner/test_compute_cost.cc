#include "catch.h"
#include "model_fixtures.h"
#include "planner/costs/compute_cost.h"

using namespace hybridplan;

TEST_CASE("bytes scale linearly with the batch", "[compute_cost]") {
  const Graph g = test::make_graph({{"a", 0.5, 1.0, 10, 64}, {"b", 0.25, 0.5, 0, 32}}, {{0, 1, 64}}, 32);
  REQUIRE(batch_scale(g, 32) == 1);
  REQUIRE(batch_scale(g, 8) == 0.25);
  REQUIRE(scaled_bytes(64, 0.25) == 16);
}

TEST_CASE("one batch size: per-call floor from the cluster, else linear", "[compute_cost]") {
  // t(b) = floor + (t0 - floor) * b / b0 with t0 = 0.5 s at b0 = 32.
  const std::vector<CurvePoint> one{{32, 0.5}};
  REQUIRE(curve_time_s(one, 64, 0) == 1.0);          // linear
  REQUIRE(curve_time_s(one, 8, 0) == 0.125);
  REQUIRE(curve_time_s(one, 8, 0.1) == Approx(0.1 + 0.4 * 0.25));   // 0.2
  REQUIRE(curve_time_s(one, 1, 0.1) == Approx(0.1 + 0.4 / 32));      // 0.1125
  REQUIRE(curve_time_s(one, 64, 0.1) == Approx(0.1 + 0.4 * 2));      // 0.9: larger batches gain
  REQUIRE(curve_time_s(one, 8, 0.7) == 0.5);  // floor above t0: the node costs t0 at any batch

  const Graph g = test::make_graph({{"a", 0.5, 1.0, 10, 64}, {"b", 0.25, 0.5, 0, 32}}, {{0, 1, 64}}, 32);
  Cluster c = test::make_cluster(1, 2);
  REQUIRE(ComputeModel(g, c).at_batch(64).total_s() == Approx(4.5));  // (0.5+1+0.25+0.5) * 2
  REQUIRE_THAT(ComputeModel(g, c).description(), Catch::Matchers::Contains("linear"));
  c.device.call_floor_s = 0.05;
  const NodeTimes t = ComputeModel(g, c).at_batch(16);
  // a: 0.05 + 0.45 * 0.5 = 0.275 forward, 0.05 + 0.95 * 0.5 = 0.525 backward
  REQUIRE(t.forward_s[0] == Approx(0.275));
  REQUIRE(t.backward_s[0] == Approx(0.525));
  REQUIRE_THAT(ComputeModel(g, c).description(), Catch::Matchers::Contains("per-call floor"));
}

TEST_CASE("measured curve: piecewise linear inside, clamped outside", "[compute_cost]") {
  // Points (batch, s): (2, 1.0), (4, 1.2), (8, 2.0).
  const std::vector<CurvePoint> curve{{2, 1.0}, {4, 1.2}, {8, 2.0}};
  REQUIRE(curve_time_s(curve, 4, 9) == 1.2);               // a measured point (floor unused)
  REQUIRE(curve_time_s(curve, 3, 0) == Approx(1.1));       // halfway between 2 and 4
  REQUIRE(curve_time_s(curve, 6, 0) == Approx(1.6));       // halfway between 4 and 8
  // Below: the line through (2, 1.0) and (4, 1.2) gives 0.9 at b = 1, inside [1.0 * 1/2, 1.0].
  REQUIRE(curve_time_s(curve, 1, 0) == Approx(0.9));
  // Above: the line through (4, 1.2), (8, 2.0) gives 3.6 at 16, inside [2.0, 2.0 * 16/8 = 4.0].
  REQUIRE(curve_time_s(curve, 16, 0) == Approx(3.6));
  // A steep last segment is capped by proportional scaling: (4, 1), (8, 4) -> 16 would be 10.
  REQUIRE(curve_time_s({{4, 1.0}, {8, 4.0}}, 16, 0) == Approx(8.0));
  // A falling first segment (noise) is capped by flat: (2, 1), (4, 0.5) -> 1 would be 1.25.
  REQUIRE(curve_time_s({{2, 1.0}, {4, 0.5}}, 1, 0) == Approx(1.0));
  // A micro-batch of 1 from a batch of 8 costs far more than 1/8 of it.
  REQUIRE(curve_time_s(curve, 1, 0) > 2.0 / 8 * 2);
}

TEST_CASE("the graph's batch_times are the curve", "[compute_cost]") {
  Graph g = test::make_graph({{"a", 2.0, 4.0, 0, 8}}, {}, 8);
  g.nodes[0].batch_times = {{1, 0.5, 0.8}, {4, 1.2, 2.0}};
  g.finalize("g");
  const ComputeModel model(g, test::make_cluster(1, 1));
  REQUIRE(model.at_batch(1).forward_s[0] == 0.5);
  REQUIRE(model.at_batch(2).forward_s[0] == Approx(0.5 + 0.7 / 3));
  REQUIRE(model.at_batch(6).backward_s[0] == Approx(3.0));  // between (4, 2.0) and (8, 4.0)
  REQUIRE_THAT(model.description(), Catch::Matchers::Contains("1, 4, 8"));
  REQUIRE(single_device_compute_s(model, 8) == 6.0);
}

TEST_CASE("profiles measure halvings of the example batch down to 1", "[compute_cost]") {
  REQUIRE(default_profile_batch_sizes(32) == std::vector<int64_t>{1, 2, 4, 8, 16});
  REQUIRE(default_profile_batch_sizes(48) == std::vector<int64_t>{1, 3, 6, 12, 24});
  REQUIRE(default_profile_batch_sizes(7) == std::vector<int64_t>{1, 3});
  REQUIRE(default_profile_batch_sizes(2) == std::vector<int64_t>{1});
  REQUIRE(default_profile_batch_sizes(1).empty());
}

TEST_CASE("split_backward: the plain backward in W outside the input region, else the split's "
          "cost divided by the measured share or half a weighted node's", "[compute]") {
  Node weighted;
  weighted.param_bytes = 100;
  Node free_node;
  const auto parts = [](const Node& n, double b, double slowdown, bool region) {
    const SplitBackward s = split_backward(n, b, slowdown, region);
    return std::vector<double>{s.input_s, s.weight_s};
  };
  // in the region: half a weighted node's backward in each, a parameter-free one's all in I
  CHECK(parts(weighted, 4.0, 1.0, true) == std::vector<double>{2.0, 2.0});
  CHECK(parts(free_node, 4.0, 1.0, true) == std::vector<double>{4.0, 0.0});
  // outside it, I has nothing to compute: W runs the node's plain backward
  CHECK(parts(weighted, 4.0, 1.0, false) == std::vector<double>{0.0, 4.0});
  CHECK(parts(free_node, 4.0, 1.0, false) == std::vector<double>{0.0, 4.0});
  // a measured share replaces the estimate, and the split's own cost (slowed like compute)
  // joins the backward it divides, in the region only
  weighted.weight_backward_fraction = 0.75;
  weighted.split_backward_extra_s = 2.0;
  CHECK(parts(weighted, 4.0, 1.0, true) == std::vector<double>{1.5, 4.5});
  CHECK(parts(weighted, 4.0, 2.0, true) == std::vector<double>{2.0, 6.0});
  CHECK(parts(weighted, 4.0, 1.0, false) == std::vector<double>{0.0, 4.0});
}
