#include "planner/pipeline_partition.h"

#include <algorithm>
#include <limits>

#include "common/error.h"

namespace hybridplan {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

// The bottleneck of the split at equal compute shares (stage s begins at the first allowed
// position whose prefix compute reaches s/k of the total, leaving a position for every later
// stage), +infinity where that split does not exist or does not fit: an upper bound on the
// optimum (optimal_partition narrows its DP with it).
double balanced_split_bottleneck(const PartitionCosts& costs) {
  const int64_t n = costs.num_positions();
  const int k = costs.num_stages();
  const std::vector<double>& prefix = costs.prefix_compute_s;
  std::vector<int64_t> starts(k + 1, 0);
  starts[k] = n;
  int64_t p = 0;
  for (int s = 1; s < k; ++s) {
    const double share = prefix[n] * s / k;
    p = std::max<int64_t>(p + 1, std::lower_bound(prefix.begin(), prefix.end(), share) - prefix.begin());
    while (p < n && !costs.cut_allowed(p)) ++p;
    if (p > n - (k - s)) return kInf;
    starts[s] = p;
  }
  return partition_bottleneck_s(costs, starts);
}

}  // namespace

double PartitionCosts::stage_s(int stage, int64_t first, int64_t end) const {
  double t = prefix_compute_s[end] - prefix_compute_s[first];
  if (stage > 0) t += boundary_s[stage - 1][first];
  if (stage + 1 < num_stages()) t += boundary_s[stage][end];
  return t;
}

bool PartitionCosts::fits(int stage, int64_t first, int64_t end) const {
  if (memory_capacity_bytes <= 0) return true;
  const double bytes = prefix_static_bytes[end] - prefix_static_bytes[first] +
                       activation_multiplier[stage] *
                           (prefix_activation_bytes[end] - prefix_activation_bytes[first]);
  return bytes <= memory_capacity_bytes;
}

std::optional<Partition> optimal_partition(const PartitionCosts& costs) {
  const int64_t n = costs.num_positions();
  const int k = costs.num_stages();
  HP_INTERNAL_ASSERT(k >= 1, "need at least one stage");
  HP_INTERNAL_ASSERT(static_cast<int>(costs.boundary_s.size()) == k - 1, "boundary rows");
  if (n < k) return std::nullopt;

  // best[s][j]: optimal bottleneck of positions [0, j) on stages 0..s; arg[s][j]: start of s.
  std::vector<std::vector<double>> best(k, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int64_t>> arg(k, std::vector<int64_t>(n + 1, -1));
  // Only states of a partition whose bottleneck is at most `bound` (an upper bound on the
  // optimum, with a slack for rounding) are computed: stage s ends where stages 0..s hold at
  // most (s + 1) * bound of compute and stages s+1..k-1 the rest, at most (k - 1 - s) * bound;
  // a state worth `bound` or more stays +infinity. Every state worth less, hence the optimum and
  // its split, is what the full DP gives; for many stages the window of ends is a few stages
  // wide (O(n^2 / k) instead of O(n^2 log k) steps).
  const double bound =
      balanced_split_bottleneck(costs) * (1 + 1e-9) + std::numeric_limits<double>::min();
  const std::vector<double>& prefix = costs.prefix_compute_s;
  const auto ends = [&](int s, int64_t first, int64_t last) {  // stage s's ends to compute
    if (bound < kInf) {
      const double after = (k - 1 - s) * bound, upto = (s + 1) * bound;
      first = std::max<int64_t>(
          first, std::lower_bound(prefix.begin(), prefix.end(), prefix[n] - after) - prefix.begin());
      last = std::min<int64_t>(
          last, std::upper_bound(prefix.begin(), prefix.end(), upto) - prefix.begin() - 1);
    }
    return std::make_pair(first, last);
  };
  for (auto [j, last] = ends(0, 1, n - (k - 1)); j <= last; ++j) {
    if (costs.fits(0, 0, j)) best[0][j] = costs.stage_s(0, 0, j);
  }
  for (int s = 1; s < k; ++s) {
    // Stage s ends at j; stages after it need at least k-1-s positions.
    for (auto [j, last] = ends(s, s + 1, n - (k - 1 - s)); j <= last; ++j) {
      const double out_s = s + 1 < k ? costs.boundary_s[s][j] : 0.0;
      double b = bound;
      int64_t b_arg = -1;
      for (int64_t i = j - 1; i >= s; --i) {
        const double compute_s = costs.prefix_compute_s[j] - costs.prefix_compute_s[i];
        // compute_s and memory only grow as i decreases: nothing further left can win or fit.
        if (compute_s + out_s >= b) break;
        if (!costs.fits(s, i, j)) break;
        const double prev = best[s - 1][i];
        if (prev >= b || !costs.cut_allowed(i)) continue;
        const double cand = std::max(prev, compute_s + out_s + costs.boundary_s[s - 1][i]);
        if (cand < b) {
          b = cand;
          b_arg = i;
        }
      }
      best[s][j] = b;
      arg[s][j] = b_arg;
    }
  }
  if (best[k - 1][n] == kInf) return std::nullopt;

  Partition p;
  p.bottleneck_s = best[k - 1][n];
  p.stage_starts.assign(k + 1, 0);
  p.stage_starts[k] = n;
  int64_t end = n;
  for (int s = k - 1; s >= 1; --s) {
    end = arg[s][end];
    p.stage_starts[s] = end;
  }
  return p;
}

double partition_bottleneck_s(const PartitionCosts& costs, const std::vector<int64_t>& starts) {
  double worst = 0;
  for (int s = 0; s < costs.num_stages(); ++s) {
    if (!costs.fits(s, starts[s], starts[s + 1])) return kInf;
    if (s > 0 && !costs.cut_allowed(starts[s])) return kInf;
    worst = std::max(worst, costs.stage_s(s, starts[s], starts[s + 1]));
  }
  return worst;
}

void for_each_contiguous_partition(int64_t n, int k,
                                   const std::function<void(const std::vector<int64_t>&)>& fn) {
  if (k < 1 || n < k) return;
  std::vector<int64_t> starts(k + 1, 0);
  starts[k] = n;
  // Recursively place the start of stage s in [starts[s-1]+1, n-(k-s)].
  std::function<void(int)> place = [&](int s) {
    if (s == k) {
      fn(starts);
      return;
    }
    for (int64_t a = starts[s - 1] + 1; a <= n - (k - s); ++a) {
      starts[s] = a;
      place(s + 1);
    }
  };
  place(1);
}

}  // namespace hybridplan
