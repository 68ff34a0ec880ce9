// Shared by the partition DP tests (test_pipeline_partition.cc, test_search_pruning.cc): the
// recompute and buffer terms of random PartitionCosts, and a stage's least-memory kind as
// least_memory_partition defines it.
#pragma once
#include <cstdint>
#include <random>
#include <utility>

#include "planner/documents/plan.h"
#include "planner/searches/pipeline_partition.h"

namespace hybridplan::testing {

// Gives `c` (compute and activation prefixes set, n positions) every memory term but the limit:
// per position a full recompute of a third of its compute, a random selective share of that
// and of its activations, a position without the selective measurement one time in
// `unselective_one_in`, a workspace up to 20 bytes; receive buffers at the cuts (up to 40
// bytes); the first stage's bytes up to `first_stage_max`, the last stage's up to
// `last_stage_max`. Draws from `rng` in that order.
inline void add_random_memory_terms(std::mt19937_64& rng, PartitionCosts& c, int unselective_one_in,
                                    double first_stage_max, double last_stage_max) {
  std::uniform_real_distribution<double> t(0.0, 1.0);
  const auto n = static_cast<int64_t>(c.prefix_compute_s.size()) - 1;
  c.prefix_full_recompute_s.assign(n + 1, 0);
  c.prefix_selective_recompute_s.assign(n + 1, 0);
  c.prefix_selective_kept_bytes.assign(n + 1, 0);
  c.prefix_selective_rebuilt_bytes.assign(n + 1, 0);
  c.prefix_unselective.assign(n + 1, 0);
  c.workspace_bytes.assign(n, 0);
  c.receive_bytes.assign(n + 1, 0);
  for (int64_t p = 0; p < n; ++p) {
    const double forward = (c.prefix_compute_s[p + 1] - c.prefix_compute_s[p]) / 3;
    const double act = c.prefix_activation_bytes[p + 1] - c.prefix_activation_bytes[p];
    const double kept = act * t(rng);
    c.prefix_full_recompute_s[p + 1] = c.prefix_full_recompute_s[p] + forward;
    c.prefix_selective_recompute_s[p + 1] = c.prefix_selective_recompute_s[p] + forward * t(rng);
    c.prefix_selective_kept_bytes[p + 1] = c.prefix_selective_kept_bytes[p] + kept;
    c.prefix_selective_rebuilt_bytes[p + 1] = c.prefix_selective_rebuilt_bytes[p] + act - kept;
    c.prefix_unselective[p + 1] =
        c.prefix_unselective[p] + (rng() % unselective_one_in == 0 ? 1 : 0);
    c.workspace_bytes[p] = 20 * t(rng);
  }
  for (int64_t p = 1; p < n; ++p) c.receive_bytes[p] = 40 * t(rng) * t(rng);
  c.first_stage_bytes = first_stage_max * t(rng);
  c.last_stage_bytes = last_stage_max * t(rng);
}

// The least bytes of stage s on [i, j) over the kinds and that kind (none, selective, full:
// the first of the least), as least_memory_partition defines them.
inline std::pair<double, StageRecompute> least_kind(const PartitionCosts& c, int s, int64_t i,
                                                    int64_t j) {
  const double w = c.workspace_max(i, j);
  std::pair<double, StageRecompute> out{c.stage_bytes(s, i, j, kRecomputeNone, w), kRecomputeNone};
  if (c.prefix_unselective[j] == c.prefix_unselective[i]) {
    const double b = c.stage_bytes(s, i, j, kRecomputeSelective, w);
    if (b < out.first) out = std::make_pair(b, kRecomputeSelective);
  }
  const double b = c.stage_bytes(s, i, j, kRecomputeFull, w);
  if (b < out.first) out = std::make_pair(b, kRecomputeFull);
  return out;
}

}  // namespace hybridplan::testing
