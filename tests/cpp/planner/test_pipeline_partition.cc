// The bottleneck DP against brute force over every contiguous partition, plus hand-computed cases.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "catch.h"
#include "partition_fixtures.h"
#include "planner/searches/pipeline_partition.h"

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

TEST_CASE("partition: with recompute kinds and buffers, the DP equals brute force",
          "[pipeline_partition][recompute]") {
  // Each stage keeps, recomputes selectively (where every position measured it) or fully,
  // whichever is fastest and fits; receive buffers at its cuts, its largest workspace, a tied
  // copy, the first stage's batch and the last stage's held outputs count too (not monotone in
  // the stage's extent: the DP may stop its scan on the monotone part only).
  std::mt19937_64 rng(20261202);
  std::uniform_real_distribution<double> t(0.0, 1.0);
  int feasible = 0, infeasible = 0, recomputing = 0, selective = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 11);
    const int k = 1 + static_cast<int>(rng() % std::min<int64_t>(n, 6));
    PartitionCosts c = random_costs(rng, n, k, true);
    testing::add_random_memory_terms(rng, c, 4, 10, 5);
    if (n >= 2 && trial % 2 == 0) {
      c.tied_copies.push_back({{0, n - 1}, 30 * t(rng)});
    }
    if (trial % 3 == 0) {  // some positions may not begin a stage
      c.cut_before.assign(n + 1, 1);
      for (int64_t p = 1; p < n; ++p) c.cut_before[p] = rng() % 4 != 0;
    }
    double brute = std::numeric_limits<double>::infinity();
    std::vector<int64_t> brute_starts;
    for_each_contiguous_partition(n, k, [&](const std::vector<int64_t>& s) {
      const double b = partition_bottleneck_s(c, s);
      if (b < brute) brute = b, brute_starts = s;
    });
    // the least memory of a fullest stage, each stage with its kind needing the least
    const auto least_bytes = [&](const std::vector<int64_t>& s, std::vector<StageRecompute>* kinds) {
      double most = 0;
      for (int st = 0; st < k; ++st) {
        if (st > 0 && !c.cut_allowed(s[st])) return std::numeric_limits<double>::infinity();
        const auto [b, r] = testing::least_kind(c, st, s[st], s[st + 1]);
        if (kinds) kinds->push_back(r);
        most = std::max(most, b);
      }
      return most;
    };
    double least_brute = std::numeric_limits<double>::infinity();
    for_each_contiguous_partition(n, k, [&](const std::vector<int64_t>& s) {
      least_brute = std::min(least_brute, least_bytes(s, nullptr));
    });
    const auto least = least_memory_partition(c);
    if (std::isinf(least_brute)) {  // no split where cuts are allowed
      CHECK_FALSE(least);
      CHECK_FALSE(optimal_partition(c));
      continue;
    }
    REQUIRE(least);
    std::vector<StageRecompute> least_kinds;
    CHECK(least_bytes(least->stage_starts, &least_kinds) == Approx(least_brute).epsilon(1e-12));
    CHECK(least->recompute == least_kinds);
    const auto p = optimal_partition(c);
    if (std::isinf(brute)) {
      CHECK_FALSE(p);
      CHECK(least_brute > c.memory_capacity_bytes);
      ++infeasible;
      continue;
    }
    ++feasible;
    REQUIRE(p);
    CHECK(least_brute <= c.memory_capacity_bytes);
    CHECK(p->bottleneck_s == Approx(brute).epsilon(1e-12));
    const Partition again = partition_of(c, p->stage_starts);
    CHECK(again.bottleneck_s == Approx(p->bottleneck_s).epsilon(1e-12));
    REQUIRE(p->recompute.size() == static_cast<size_t>(k));
    for (int s = 0; s < k; ++s) {
      // the returned kind fits its stage
      CHECK(c.stage_bytes(s, p->stage_starts[s], p->stage_starts[s + 1], p->recompute[s],
                          c.workspace_max(p->stage_starts[s], p->stage_starts[s + 1])) <=
            c.memory_capacity_bytes);
      recomputing += p->recompute[s] != 0;
      selective += p->recompute[s] == 2;
    }
  }
  CHECK(feasible > 150);
  CHECK(infeasible > 10);
  CHECK(recomputing > 50);
  CHECK(selective > 10);
}

TEST_CASE("partition: a stage recomputes only where keeping does not fit", "[pipeline_partition][recompute]") {
  // Four equal positions (1 s of work, a third of it forward), two stages, in flight 2 and 1,
  // 10 bytes kept each: keeping, a stage of two holds 40 and 20 bytes. Under 30 bytes the
  // first stage recomputes (20 bytes rebuilt at once, 2/3 s again) and the split stays even.
  PartitionCosts c = plain_costs({1, 1, 1, 1}, 2);
  c.prefix_activation_bytes = {0, 10, 20, 30, 40};
  c.activation_multiplier = {2, 1};
  c.prefix_full_recompute_s = {0, 1.0 / 3, 2.0 / 3, 1, 4.0 / 3};
  c.memory_capacity_bytes = 30;
  auto p = optimal_partition(c);
  REQUIRE(p);
  CHECK(p->stage_starts == std::vector<int64_t>{0, 2, 4});
  CHECK(p->recompute == std::vector<StageRecompute>{1, 0});
  CHECK(p->bottleneck_s == Approx(2 + 2.0 / 3));
  // Without recompute the first stage holds one position (20 bytes) and the second three.
  c.prefix_full_recompute_s.clear();
  p = optimal_partition(c);
  REQUIRE(p);
  CHECK(p->stage_starts == std::vector<int64_t>{0, 1, 4});
  CHECK(p->bottleneck_s == 3);
}
