// Optimal contiguous pipeline partition: split the positions 0..n-1 of graph.topo_order into
// `num_stages` non-empty intervals so that the slowest stage is as fast as possible, subject to
// each stage fitting in its device's memory.
//
// Formulation (the classic "linear partition" / chain-on-chain bottleneck DP; cf. PipeDream,
// Narayanan et al., SOSP 2019, https://arxiv.org/abs/1806.03377, Sec. 3.1, and torchgpipe's
// balance/blockpartition.py):
//   stage s holds positions [a_s, a_{s+1}), a_0 = 0 < a_1 < ... < a_k = n
//   stage_s(i, j) = compute_s(i, j) + in_s(s, i) + out_s(s, j)
//       compute_s(i, j) = prefix_compute_s[j] - prefix_compute_s[i]
//       in_s(s, i)      = boundary_s[s-1][i]   (s > 0; receive activations, send gradients)
//       out_s(s, j)     = boundary_s[s][j]     (s < k-1; send activations, receive gradients)
//   fits_s(i, j)    = static_bytes(i, j) + activation_multiplier[s] * activation_bytes(i, j)
//                     <= memory_capacity_bytes
//   a stage may start at position i > 0 only where cut_allowed(i) (graph nodes with
//   cut_before = false)
//   best[0][j]  = stage_0(0, j)                                    if fits_0(0, j)
//   best[s][j]  = min_{s <= i < j, fits_s(i, j)} max(best[s-1][i], stage_s(i, j))
//   answer      = best[k-1][n]
// Because compute_s(i, j) and the memory of [i, j) only grow as i decreases, the scan over i for
// a fixed (s, j) stops as soon as compute alone reaches the best value found, which makes the DP
// close to O(n^2) in practice instead of O(k n^2). The bottleneck of the split at equal
// compute shares, where it fits, bounds the optimum from above and so the positions where each
// stage can end: with many stages (pipelines spanning nodes) a window a few stages wide.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace hybridplan {

// Per-position costs of a chain of n positions (the graph's topological order) for k stages.
struct PartitionCosts {
  std::vector<double> prefix_compute_s;            // n+1 entries, non-decreasing
  // boundary_s[l][p]: cost charged to both stages l and l+1 of the cut before position p
  // (all edges from positions < p to positions >= p cross the link between stage l and l+1).
  std::vector<std::vector<double>> boundary_s;     // k-1 rows of n+1 entries
  std::vector<double> prefix_static_bytes;         // n+1: params + grads + optimizer state
  std::vector<double> prefix_activation_bytes;     // n+1: activations kept per in-flight batch
  std::vector<double> activation_multiplier;       // k: in-flight (micro-)batches of stage s
  double memory_capacity_bytes = 0;                // <= 0: unlimited
  std::vector<char> cut_before;                    // n+1 or empty (all allowed): stage may start at p

  bool cut_allowed(int64_t p) const { return cut_before.empty() || cut_before[p] != 0; }

  int64_t num_positions() const { return static_cast<int64_t>(prefix_compute_s.size()) - 1; }
  int num_stages() const { return static_cast<int>(activation_multiplier.size()); }
  // stage_s(i, j) of the formulation above.
  double stage_s(int stage, int64_t first, int64_t end) const;
  // fits_s(i, j) of the formulation above.
  bool fits(int stage, int64_t first, int64_t end) const;
};

struct Partition {
  std::vector<int64_t> stage_starts;  // k+1 entries: a_0 = 0, ..., a_k = n
  double bottleneck_s = 0;            // max over stages of stage_s
};

// The optimal partition, or nullopt when no partition into non-empty fitting stages exists.
std::optional<Partition> optimal_partition(const PartitionCosts& costs);

// The bottleneck of a given partition (+infinity when a stage does not fit).
double partition_bottleneck_s(const PartitionCosts& costs, const std::vector<int64_t>& starts);

// Calls fn(starts) for every split of n positions into k non-empty contiguous stages
// (C(n-1, k-1) of them), in lexicographic order of the starts.
void for_each_contiguous_partition(int64_t n, int k,
                                   const std::function<void(const std::vector<int64_t>&)>& fn);

}  // namespace hybridplan
