#include <algorithm>
#include <random>

#include "catch.h"
#include "model_fixtures.h"
#include "planner/costs/allreduce_cost.h"
#include "planner/documents/cluster.h"

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

TEST_CASE("a ring inside a node runs at its slowest hop, in the library's order", "[allreduce_cost]") {
  Cluster c = test::make_cluster(1, 4, 1e9, 2e-6);
  // hops 0-1 50 GB/s, 1-2 10 GB/s, 2-3 50 GB/s, 3-0 25 GB/s; 0-2 and 1-3 20 GB/s
  c.bandwidth_matrix = {{0, 5e10, 2e10, 2.5e10}, {5e10, 0, 1e10, 2e10},
                        {2e10, 1e10, 0, 5e10}, {2.5e10, 2e10, 5e10, 0}};
  // The three rings of 4 devices: 0-1-2-3 (50, 10, 50, 25: 10 GB/s), 0-1-3-2 (50, 20, 50, 20:
  // 20 GB/s), 0-2-1-3 (20, 10, 20, 25: 10 GB/s). NCCL runs the best one whatever the ranks.
  std::vector<DeviceIndex> ring;
  const AllReduceCost nccl = group_allreduce(c, {0, 1, 2, 3}, 1, &ring);
  REQUIRE(nccl.per_byte_s == Approx(1.5 / 2e10));  // 2*3/4 / 20 GB/s
  REQUIRE(nccl.fixed_s == Approx(6 * 2e-6));
  REQUIRE((ring == std::vector<DeviceIndex>{0, 1, 3, 2} || ring == std::vector<DeviceIndex>{0, 2, 3, 1}));
  // Gloo follows rank order: the hop 1-2 at 10 GB/s.
  c.collectives = CollectiveLibrary::kGloo;
  REQUIRE(group_allreduce(c, {0, 1, 2, 3}, 1, &ring).per_byte_s == Approx(1.5 / 1e10));
  REQUIRE(ring == std::vector<DeviceIndex>{0, 1, 2, 3});
  REQUIRE(group_allreduce(c, {0, 1, 3, 2}, 1).per_byte_s == Approx(1.5 / 2e10));
  // a pair: 2*1/2 / 25 GB/s
  REQUIRE(group_allreduce(c, {3, 0}, 1).per_byte_s == Approx(1.0 / 2.5e10));
  REQUIRE(group_allreduce(c, {2}, 1).time_s(1e9) == 0);
}

TEST_CASE("DGX-1: data parallelism over 8 GPUs rides NVLink, not PCIe", "[allreduce_cost]") {
  Cluster c = load_cluster("dgx1-v100");
  // Device-index order 0..7 crosses 3->4 and 7->0, which have no NVLink (10 GB/s); NCCL's ring
  // 0-3-2-1-5-6-7-4 uses only 2-link pairs at 50 GB/s (the preset's matrix).
  std::vector<DeviceIndex> ring;
  const AllReduceCost nccl = group_allreduce(c, {0, 1, 2, 3, 4, 5, 6, 7}, 1, &ring);
  REQUIRE(nccl.per_byte_s == Approx(2.0 * 7 / 8 / 50e9));
  REQUIRE(nccl.time_s(1e9) == Approx(35e-3).epsilon(0.01));  // 1 GB of gradients: ~35 ms
  for (size_t i = 0; i < ring.size(); ++i) {
    REQUIRE(c.link(ring[i], ring[(i + 1) % ring.size()]).bandwidth_bytes_per_s == 50e9);
  }
  // mp = 2 groups (dp = 4 over devices 0, 2, 4, 6): 0-2 is one NVLink (25 GB/s), and the best
  // ring 0-2-6-4 keeps to NVLink: 25, 25, 25, 50 GB/s -> 25 GB/s; 0-2-4-6 would cross PCIe.
  REQUIRE(group_allreduce(c, {0, 2, 4, 6}, 1).per_byte_s == Approx(2.0 * 3 / 4 / 25e9));
  c.collectives = CollectiveLibrary::kGloo;
  REQUIRE(group_allreduce(c, {0, 1, 2, 3, 4, 5, 6, 7}, 1).per_byte_s == Approx(2.0 * 7 / 8 / 10e9));
}

TEST_CASE("ring search: exact bottleneck cycle, greedy above the exact size", "[allreduce_cost]") {
  // A random symmetric matrix of 9 devices: the exact ring's slowest hop equals the best over
  // every cycle (brute force over the 8!/2 rings that start at 0).
  std::mt19937_64 rng(3);
  Cluster c = test::make_cluster(1, 9, 1e9, 0);
  c.bandwidth_matrix.assign(9, std::vector<double>(9, 0));
  for (int i = 0; i < 9; ++i)
    for (int j = i + 1; j < 9; ++j) c.bandwidth_matrix[i][j] = c.bandwidth_matrix[j][i] = 1e9 * (1 + rng() % 20);
  std::vector<DeviceIndex> members{0, 1, 2, 3, 4, 5, 6, 7, 8};
  const auto slowest = [&](const std::vector<DeviceIndex>& r) {
    double s = 1e300;
    for (size_t i = 0; i < r.size(); ++i) s = std::min(s, c.link(r[i], r[(i + 1) % r.size()]).bandwidth_bytes_per_s);
    return s;
  };
  double best = 0;
  std::vector<DeviceIndex> perm = members;
  do best = std::max(best, slowest(perm));
  while (std::next_permutation(perm.begin() + 1, perm.end()));
  const std::vector<DeviceIndex> ring = ring_order(c, members);
  REQUIRE(slowest(ring) == best);
  std::vector<DeviceIndex> sorted = ring;
  std::sort(sorted.begin(), sorted.end());
  REQUIRE(sorted == members);
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
  BucketedAllReduce buckets({0.1, 0.001}, BucketCaps::uniform(100));
  buckets.add_gradient(1.0, 60);
  buckets.add_gradient(2.0, 60);   // bucket of 120 bytes ready at 2.0: 2.0 + 0.22 = 2.22
  buckets.add_gradient(2.05, 0);   // no parameters: nothing to reduce
  buckets.add_gradient(2.1, 50);   // last bucket ready 2.1, waits for the stream: 2.22 + 0.15
  REQUIRE(buckets.end_s() == Approx(2.37));

  // A gradient bigger than the cap is a bucket of its own; an idle stream starts at once.
  BucketedAllReduce big({0, 0.01}, BucketCaps::uniform(100));
  big.add_gradient(5.0, 300);      // 5 + 3 = 8
  big.add_gradient(9.0, 10);       // 9 + 0.1
  REQUIRE(big.end_s() == Approx(9.1));

  // DDP's first bucket is smaller (1 MiB by default): it launches early, later ones are 25 MiB.
  BucketedAllReduce ddp({0, 0.01}, BucketCaps{20, 100});
  ddp.add_gradient(1.0, 30);       // first bucket full at 30 >= 20: 1 + 0.3
  ddp.add_gradient(2.0, 60);       // second bucket, cap 100: not full
  ddp.add_gradient(3.0, 50);       // 110 >= 100: 3 + 1.1 = 4.1
  REQUIRE(ddp.end_s() == Approx(4.1));
  // The buckets it reduced are the policy's (bucket_policy.h): 30, then 60 + 50 = 110.
  REQUIRE(bucket_bytes({30, 60, 50}, BucketCaps{20, 100}) == std::vector<int64_t>{30, 110});

  BucketedAllReduce none({1, 1}, BucketCaps::uniform(100));
  REQUIRE(none.end_s() == 0);
}
