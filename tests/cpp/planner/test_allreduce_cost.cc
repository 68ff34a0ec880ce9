#include "catch.h"
#include "model_fixtures.h"
#include "planner/allreduce_cost.h"

using namespace hybridplan;
#if __has_include(<catch2/catch_all.hpp>)
using Catch::Approx;  // Catch2 v3; v2 has ::Approx
#endif

TEST_CASE("ring all-reduce: 2(p-1)/p * bytes / bw + 2(p-1) * alpha", "[allreduce_cost]") {
  const AllReduceCost ring = ring_allreduce(4, 1e9, 1e-5);
  REQUIRE(ring.fixed_s == Approx(6e-5));        // 2 * 3 * 1e-5
  REQUIRE(ring.per_byte_s == Approx(1.5e-9));   // 2 * 3 / 4 / 1e9
  REQUIRE(ring.time_s(1e8) == Approx(0.15006)); // 0.15 + 6e-5
  REQUIRE(ring.time_s(0) == 0);                 // nothing to reduce
  REQUIRE(ring_allreduce(1, 1e9, 1e-5).time_s(1e8) == 0);
}

TEST_CASE("a ring inside a node runs at its slowest hop", "[allreduce_cost]") {
  Cluster c = test::make_cluster(1, 4, 1e9, 2e-6);
  // hops 0-1 50 GB/s, 1-2 10 GB/s, 2-3 50 GB/s, 3-0 25 GB/s; 0-2 and 1-3 20 GB/s
  c.bandwidth_matrix = {{0, 5e10, 2e10, 2.5e10}, {5e10, 0, 1e10, 2e10},
                        {2e10, 1e10, 0, 5e10}, {2.5e10, 2e10, 5e10, 0}};
  const AllReduceCost in_order = group_allreduce(c, {0, 1, 2, 3}, 1);
  REQUIRE(in_order.per_byte_s == Approx(1.5 / 1e10));  // 2*3/4 / 10 GB/s (hop 1-2)
  REQUIRE(in_order.fixed_s == Approx(6 * 2e-6));
  // ring 0 -> 1 -> 3 -> 2 -> 0: hops 50, 20, 50, 20 GB/s -> 20 GB/s
  REQUIRE(group_allreduce(c, {0, 1, 3, 2}, 1).per_byte_s == Approx(1.5 / 2e10));
  // a pair: 2*1/2 / 25 GB/s
  REQUIRE(group_allreduce(c, {3, 0}, 1).per_byte_s == Approx(1.0 / 2.5e10));
  REQUIRE(group_allreduce(c, {2}, 1).time_s(1e9) == 0);
}

TEST_CASE("hierarchical all-reduce across nodes shares the node's injection bandwidth",
          "[allreduce_cost]") {
  // 2 nodes x 4 devices; intra 1 GB/s, 1 us; inter 0.1 GB/s, 10 us.
  const Cluster c = test::make_cluster(2, 4, 1e9, 1e-6, 1e8, 1e-5);
  const std::vector<DeviceIndex> all{0, 1, 2, 3, 4, 5, 6, 7};
  const AllReduceCost one_group = group_allreduce(c, all, 1);
  // intra reduce-scatter + all-gather: 2 * (4-1)/4 / 1e9 = 1.5e-9 s/B, 2 * 3 * 1e-6 s
  // inter, 4 shards of bytes/4 at 1e8/4 each: 2 * (2-1)/2 * 1 / 1e8 = 1e-8 s/B, 2 * 1 * 1e-5 s
  REQUIRE(one_group.per_byte_s == Approx(1.5e-9 + 1e-8));
  REQUIRE(one_group.fixed_s == Approx(6e-6 + 2e-5));
  // Two groups reducing across nodes at once halve each one's inter-node bandwidth.
  REQUIRE(group_allreduce(c, all, 2).per_byte_s == Approx(1.5e-9 + 2e-8));
  // One device per node: only the inter-node ring, 2*(2-1)/2 / 1e8.
  const AllReduceCost spread = group_allreduce(c, {1, 5}, 1);
  REQUIRE(spread.per_byte_s == Approx(1e-8));
  REQUIRE(spread.fixed_s == Approx(2e-5));
  REQUIRE(hierarchical_allreduce(2, 1, {1e9, 0}, {1e8, 0}, 1).per_byte_s == Approx(1e-8));
}

TEST_CASE("bucketed all-reduce overlaps with backward", "[allreduce_cost]") {
  // t(bytes) = 0.1 + 0.001 * bytes, buckets of 100 bytes.
  BucketedAllReduce buckets({0.1, 0.001}, 100);
  buckets.add_gradient(1.0, 60);
  buckets.add_gradient(2.0, 60);   // bucket of 120 bytes ready at 2.0: 2.0 + 0.22 = 2.22
  buckets.add_gradient(2.05, 0);   // no parameters: nothing to reduce
  buckets.add_gradient(2.1, 50);   // last bucket ready 2.1, waits for the stream: 2.22 + 0.15
  REQUIRE(buckets.end_s() == Approx(2.37));

  // A gradient bigger than the cap is a bucket of its own; an idle stream starts at once.
  BucketedAllReduce big({0, 0.01}, 100);
  big.add_gradient(5.0, 300);      // 5 + 3 = 8
  big.add_gradient(9.0, 10);       // 9 + 0.1
  REQUIRE(big.end_s() == Approx(9.1));

  BucketedAllReduce none({1, 1}, 100);
  REQUIRE(none.end_s() == 0);
}
