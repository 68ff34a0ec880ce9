#include "catch.h"
#include "model_fixtures.h"
#include "planner/compute_cost.h"

using namespace hybridplan;

TEST_CASE("compute scales linearly with the batch", "[compute_cost]") {
  const Graph g = test::make_graph({{"a", 0.5, 1.0, 10, 64}, {"b", 0.25, 0.5, 0, 32}}, {{0, 1, 64}}, 32);
  REQUIRE(batch_scale(g, 32) == 1);
  REQUIRE(batch_scale(g, 8) == 0.25);
  REQUIRE(scaled_time_s(0.5, 0.25) == 0.125);
  REQUIRE(scaled_bytes(64, 0.25) == 16);
  // (0.5 + 1 + 0.25 + 0.5) * 64 / 32 = 4.5
  REQUIRE(single_device_compute_s(g, 64) == 4.5);
}
