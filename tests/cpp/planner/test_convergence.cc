#include "catch.h"
#include "planner/run/convergence.h"

using namespace hybridplan;
#if __has_include(<catch2/catch_all.hpp>)
using Catch::Approx;  // Catch2 v3; v2 has ::Approx
#endif

TEST_CASE("critical batch: epochs_min * (1 + B / critical_batch)", "[convergence]") {
  Convergence c;
  c.model = Convergence::Model::kCriticalBatch;
  c.epochs_min = 90;
  c.critical_batch = 8192;
  REQUIRE(epochs_to_target(c, 8192) == 180);
  REQUIRE(epochs_to_target(c, 2048) == Approx(112.5));  // 90 * 1.25
  REQUIRE(epochs_to_target(Convergence{}, 8192) == 0);  // no model
}

TEST_CASE("table: piecewise linear in log B, clamped outside", "[convergence]") {
  Convergence c;
  c.model = Convergence::Model::kTable;
  c.points = {{256, 90}, {8192, 92}, {32768, 140}};
  REQUIRE(epochs_to_target(c, 100) == 90);       // below the table: first point
  REQUIRE(epochs_to_target(c, 256) == 90);
  REQUIRE(epochs_to_target(c, 8192) == 92);
  // log2: 8192 = 2^13, 32768 = 2^15, 16384 = 2^14 is half way: 92 + 0.5 * 48 = 116
  REQUIRE(epochs_to_target(c, 16384) == Approx(116));
  // 2^9 = 512 between 2^8 and 2^13: 90 + 2 * 1/5 = 90.4
  REQUIRE(epochs_to_target(c, 512) == Approx(90.4));
  REQUIRE(epochs_to_target(c, 1e6) == 140);      // above: last point
  // monotone between points
  double previous = 0;
  for (double b = 128; b < 65536; b *= 1.1) {
    const double e = epochs_to_target(c, b);
    REQUIRE(e >= previous);
    previous = e;
  }
}

TEST_CASE("time to train: epochs * (samples / B) * step_s, no partial batch", "[convergence]") {
  REQUIRE(steps_per_epoch(1000, 250) == 4);
  REQUIRE(steps_per_epoch(1000, 400) == 2.5);  // the stream's next epoch completes the third step
  REQUIRE(time_to_train_s(2, 1000, 400, 0.5) == 2.5);  // 2 * 2.5 * 0.5
}
