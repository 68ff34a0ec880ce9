// The bottleneck DP against brute force over every contiguous partition, plus hand-computed cases.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "catch.h"
#include "planner/pipeline_partition.h"

using namespace hybridplan;

namespace {

// Costs with no transfers and unlimited memory from per-position compute times.
PartitionCosts plain_costs(const std::vector<double>& compute_s, int k) {
  PartitionCosts c;
  c.prefix_compute_s.assign(compute_s.size() + 1, 0);
  for (size_t i = 0; i < compute_s.size(); ++i)
    c.prefix_compute_s[i + 1] = c.prefix_compute_s[i] + compute_s[i];
  c.boundary_s.assign(k - 1, std::vector<double>(compute_s.size() + 1, 0));
  c.prefix_static_bytes.assign(compute_s.size() + 1, 0);
  c.prefix_activation_bytes.assign(compute_s.size() + 1, 0);
  c.activation_multiplier.assign(k, 1);
  return c;
}

PartitionCosts random_costs(std::mt19937_64& rng, int64_t n, int k, bool with_memory) {
  std::uniform_real_distribution<double> t(0.0, 1.0);
  std::vector<double> compute_s(n);
  for (auto& x : compute_s) x = t(rng);
  PartitionCosts c = plain_costs(compute_s, k);
  for (auto& row : c.boundary_s)
    for (auto& x : row) x = 0.5 * t(rng) * t(rng);
  for (int64_t i = 0; i < n; ++i) {
    c.prefix_static_bytes[i + 1] = c.prefix_static_bytes[i] + 100 * t(rng);
    c.prefix_activation_bytes[i + 1] = c.prefix_activation_bytes[i] + 50 * t(rng);
  }
  for (int s = 0; s < k; ++s) c.activation_multiplier[s] = k - s;  // 1F1B-like in-flight counts
  if (with_memory) {
    const double total = c.prefix_static_bytes[n] + k * c.prefix_activation_bytes[n];
    c.memory_capacity_bytes = total / k * (0.6 + 1.2 * t(rng));  // sometimes infeasible
  }
  return c;
}

}  // namespace

TEST_CASE("partition: hand-computed chain", "[pipeline_partition]") {
  // Times 4 1 1 1 1 4 on two stages: best split is {4 1 1} | {1 1 4} with bottleneck 6.
  PartitionCosts c = plain_costs({4, 1, 1, 1, 1, 4}, 2);
  auto p = optimal_partition(c);
  REQUIRE(p);
  CHECK(p->bottleneck_s == 6);
  CHECK(p->stage_starts == std::vector<int64_t>{0, 3, 6});

  // A cut before position 3 costing 5 pushes the split to position 2 or 4:
  // {4 1} | {1 1 1 4} = 7 + 0 or {4 1 1 1} | {1 4} = 7; both have bottleneck 7.
  c.boundary_s[0][3] = 5;
  p = optimal_partition(c);
  REQUIRE(p);
  CHECK(p->bottleneck_s == 7);
  CHECK(p->stage_starts[1] != 3);
}

TEST_CASE("partition: memory forces an unbalanced split or infeasibility", "[pipeline_partition]") {
  PartitionCosts c = plain_costs({1, 1, 1, 1}, 2);
  // Static bytes 10, 10, 10, 30: a stage holding position 3 may hold nothing else under 35.
  c.prefix_static_bytes = {0, 10, 20, 30, 60};
  c.memory_capacity_bytes = 35;
  auto p = optimal_partition(c);
  REQUIRE(p);
  CHECK(p->stage_starts == std::vector<int64_t>{0, 3, 4});  // {1 1 1} | {1}: 30 and 30 bytes
  CHECK(p->bottleneck_s == 3);
  c.memory_capacity_bytes = 25;  // position 3 alone needs 30
  CHECK_FALSE(optimal_partition(c));
  CHECK(std::isinf(partition_bottleneck_s(c, {0, 3, 4})));
}

TEST_CASE("partition: fewer positions than stages has no partition", "[pipeline_partition]") {
  CHECK_FALSE(optimal_partition(plain_costs({1, 2}, 3)));
  int count = 0;
  for_each_contiguous_partition(2, 3, [&](const std::vector<int64_t>&) { ++count; });
  CHECK(count == 0);
}

TEST_CASE("partition: enumeration counts C(n-1, k-1) distinct splits", "[pipeline_partition]") {
  int count = 0;
  std::vector<std::vector<int64_t>> seen;
  for_each_contiguous_partition(7, 3, [&](const std::vector<int64_t>& s) {
    ++count;
    seen.push_back(s);
    for (int i = 0; i < 3; ++i) CHECK(s[i] < s[i + 1]);
    CHECK(s.front() == 0);
    CHECK(s.back() == 7);
  });
  CHECK(count == 15);  // C(6, 2)
  std::sort(seen.begin(), seen.end());
  CHECK(std::unique(seen.begin(), seen.end()) == seen.end());
}

TEST_CASE("partition: DP equals brute force on random chains", "[pipeline_partition]") {
  std::mt19937_64 rng(20261130);
  int feasible = 0, infeasible = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 10);
    const int k = 1 + static_cast<int>(rng() % std::min<int64_t>(n, 6));
    const PartitionCosts c = random_costs(rng, n, k, trial % 2 == 1);
    double brute = std::numeric_limits<double>::infinity();
    for_each_contiguous_partition(n, k, [&](const std::vector<int64_t>& s) {
      brute = std::min(brute, partition_bottleneck_s(c, s));
    });
    const auto p = optimal_partition(c);
    if (std::isinf(brute)) {
      CHECK_FALSE(p);
      ++infeasible;
      continue;
    }
    ++feasible;
    REQUIRE(p);
    CHECK(p->bottleneck_s == Approx(brute).epsilon(1e-12));
    // The returned split really achieves the reported bottleneck.
    CHECK(partition_bottleneck_s(c, p->stage_starts) == Approx(p->bottleneck_s).epsilon(1e-12));
  }
  CHECK(feasible > 100);   // the oracle was exercised on both outcomes
  CHECK(infeasible > 10);
}

TEST_CASE("partition: many stages, the DP narrowed by the balanced split equals brute force",
          "[pipeline_partition]") {
  // Up to 11 stages over up to 14 positions, memory unlimited (the equal-share split then
  // bounds the DP) or tight; some positions take no time and some may not begin a stage.
  std::mt19937_64 rng(20261201);
  int narrowed = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t n = 2 + static_cast<int64_t>(rng() % 13);
    const int k = 2 + static_cast<int>(rng() % std::min<int64_t>(n - 1, 10));
    PartitionCosts c = random_costs(rng, n, k, trial % 3 == 2);
    for (int64_t p = 1; p <= n; ++p) {
      if (rng() % 4 == 0) {  // a zero-time position: the prefix stays flat
        const double step = c.prefix_compute_s[p] - c.prefix_compute_s[p - 1];
        for (int64_t q = p; q <= n; ++q) c.prefix_compute_s[q] -= step;
      }
    }
    c.cut_before.assign(n + 1, 1);
    for (int64_t p = 1; p < n; ++p) c.cut_before[p] = rng() % 5 != 0;
    double brute = std::numeric_limits<double>::infinity();
    for_each_contiguous_partition(n, k, [&](const std::vector<int64_t>& s) {
      brute = std::min(brute, partition_bottleneck_s(c, s));
    });
    const auto p = optimal_partition(c);
    if (std::isinf(brute)) {
      CHECK_FALSE(p);
      continue;
    }
    narrowed += c.memory_capacity_bytes <= 0;
    REQUIRE(p);
    CHECK(p->bottleneck_s == Approx(brute).epsilon(1e-12));
    CHECK(partition_bottleneck_s(c, p->stage_starts) == Approx(p->bottleneck_s).epsilon(1e-12));
  }
  CHECK(narrowed > 100);
  // Every position free: the bound is the optimum itself, which the DP still returns.
  const PartitionCosts zero = plain_costs(std::vector<double>(6, 0.0), 6);
  const auto p = optimal_partition(zero);
  REQUIRE(p);
  CHECK(p->bottleneck_s == 0);
  CHECK(p->stage_starts == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6});
}
