// Optimal contiguous pipeline partition: split the positions 0..n-1 of graph.topo_order into
// `num_stages` non-empty intervals so that the slowest stage is as fast as possible, subject to
// each stage fitting in its device's memory, each stage keeping its activations or recomputing
// them (a recompute kind per stage: whole stages recompute alike, Plan::recompute).
//
// Formulation (the classic "linear partition" / chain-on-chain bottleneck DP; cf. PipeDream,
// Narayanan et al., SOSP 2019, https://arxiv.org/abs/1806.03377, Sec. 3.1, and torchgpipe's
// balance/blockpartition.py), extended by a recompute kind r per stage:
//   stage s holds positions [a_s, a_{s+1}), a_0 = 0 < a_1 < ... < a_k = n
//   stage_s(i, j, r) = compute_s(i, j) + again_s(i, j, r) + in_s(s, i) + out_s(s, j)
//       compute_s(i, j) = prefix_compute_s[j] - prefix_compute_s[i]
//       again_s         = the forwards run again: none 0, selective / full their prefix sums
//       in_s(s, i)      = boundary_s[s-1][i]   (s > 0; receive activations, send gradients)
//       out_s(s, j)     = boundary_s[s][j]     (s < k-1; send activations, receive gradients)
//   bytes_s(i, j, r) = static_bytes(i, j) + tied copies
//                    + activation_multiplier[s] * kept(i, j, r) + rebuilt(i, j, r)
//                    + max workspace over [i, j) + receive buffers at i (s > 0) and j (s < k-1)
//                    + first_stage_bytes (s = 0) + activation_multiplier[s] * last_stage_bytes
//                      (s = k-1)
//       kept / rebuilt: none act(i, j) / 0; selective the kept part / the rest (every position
//       of the stage measured); full 0 / act(i, j) (the stage's activations rebuilt at once)
//   stage_s(i, j) = stage_s(i, j, r) of the first kind of none, selective, full (by time) with
//                   bytes_s(i, j, r) <= memory_capacity_bytes; +infinity when none fits
//   a stage may start at position i > 0 only where cut_allowed(i) (graph nodes with
//   cut_before = false)
//   best[0][j]  = stage_0(0, j)
//   best[s][j]  = min_{s <= i < j} max(best[s-1][i], stage_s(i, j))
//   answer      = best[k-1][n]
// The recompute and memory terms beyond the first (static bytes, kept activations) are optional
// (empty: none, or 0 bytes), which is the plain DP. Because compute_s(i, j) and the monotone part
// of the memory (static bytes, workspace, the least kept + rebuilt of any kind) only grow as i
// decreases, the scan over i for a fixed (s, j) stops as soon as compute alone reaches the best
// value found or that memory exceeds the capacity, which makes the DP close to O(n^2) in
// practice instead of O(k n^2). The bottleneck of the split at equal compute shares, where it
// fits, bounds the optimum from above and so the positions where each stage can end: with many
// stages (pipelines spanning nodes) a window a few stages wide.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace hybridplan {

// A stage's recompute kind: Plan::recompute's values (kRecomputeNone, kRecomputeFull,
// kRecomputeSelective).
using StageRecompute = uint8_t;

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

  // Recompute (empty: a stage keeps its activations). prefix_full_recompute_s: n+1, the forward
  // times a fully recomputing stage runs again; the selective ones likewise, with what a
  // selectively recomputing stage keeps per in-flight (micro-)batch and what it rebuilds, and
  // the count of positions without a selective measurement (a stage holding one cannot).
  std::vector<double> prefix_full_recompute_s;
  std::vector<double> prefix_selective_recompute_s;
  std::vector<double> prefix_selective_kept_bytes;
  std::vector<double> prefix_selective_rebuilt_bytes;
  std::vector<int64_t> prefix_unselective;
  // Memory alive only part of the step (memory_cost.h transient_bytes; empty or 0: none):
  // receive_bytes[p] (n+1), the receive buffers of a cut before p, held by both stages beside
  // it; workspace_bytes[p] (n), position p's backward workspace (a stage needs its largest);
  // the first stage's input batch; the last stage's held output per in-flight micro-batch.
  std::vector<double> receive_bytes;
  std::vector<double> workspace_bytes;
  double first_stage_bytes = 0;
  double last_stage_bytes = 0;
  // Tied parameters (graph.h TiedParams): a stage holding one of `positions` but not the
  // first holds a copy of `bytes` (static, like prefix_static_bytes).
  struct TiedCopy {
    std::vector<int64_t> positions;
    double bytes = 0;
  };
  std::vector<TiedCopy> tied_copies;

  bool cut_allowed(int64_t p) const { return cut_before.empty() || cut_before[p] != 0; }

  int64_t num_positions() const { return static_cast<int64_t>(prefix_compute_s.size()) - 1; }
  int num_stages() const { return static_cast<int>(activation_multiplier.size()); }
  // stage_s(i, j, none) of the formulation above.
  double stage_s(int stage, int64_t first, int64_t end) const;
  // The largest workspace_bytes over [first, end) (0 without them).
  double workspace_max(int64_t first, int64_t end) const;
  // bytes_s(i, j, r) of the formulation above, `workspace` = workspace_max(i, j).
  double stage_bytes(int stage, int64_t first, int64_t end, StageRecompute r, double workspace) const;
  // A lower bound on bytes_s(i, j, r) over the kinds, that only grows as i decreases or j
  // grows: static bytes, `workspace` and the least kept + rebuilt activations of any kind.
  double stage_bytes_floor(int stage, int64_t first, int64_t end, double workspace) const;
  // The fastest kind of stage s on [i, j) that fits (none when memory is unlimited) and its
  // stage_s, or +infinity time where none fits.
  struct Choice {
    double time_s = 0;
    StageRecompute recompute = 0;
  };
  Choice choose(int stage, int64_t first, int64_t end, double workspace) const;
  // Whether some kind of stage s on [i, j) fits.
  bool fits(int stage, int64_t first, int64_t end) const;
};

struct Partition {
  std::vector<int64_t> stage_starts;   // k+1 entries: a_0 = 0, ..., a_k = n
  std::vector<StageRecompute> recompute;  // k entries: each stage's kind
  double bottleneck_s = 0;             // max over stages of stage_s
  double fullest_bytes = 0;            // least_memory_partition only: its fullest stage's bytes
};

// The optimal partition, or nullopt when no partition into non-empty fitting stages exists.
// `hints` (optional): other splits (k+1 starts each, e.g. the optimum at another micro-batch
// size); the best of their bottlenecks bounds the DP like the equal-share split does, so a good
// hint narrows it further, and the result is the same.
std::optional<Partition> optimal_partition(const PartitionCosts& costs,
                                           const std::vector<std::vector<int64_t>>& hints = {});

// The bottleneck of a given partition (+infinity when a stage does not fit).
double partition_bottleneck_s(const PartitionCosts& costs, const std::vector<int64_t>& starts);

// The split whose fullest stage needs the least memory, each stage with its kind that needs the
// least (none, selective, full: the first of the least), whatever the capacity: what a point
// that fits nowhere is reported with. bottleneck_s is that split's with those kinds (memory
// unlimited); nullopt when no split exists (fewer positions or places to cut than stages).
// min over splits of max over stages of min over kinds of bytes_s, by the DP above on bytes
// (fullest_bytes). Some split fits (optimal_partition has one) exactly when fullest_bytes is at
// most memory_capacity_bytes.
std::optional<Partition> least_memory_partition(const PartitionCosts& costs);

// A given split with each stage's fastest fitting kind and the bottleneck (+infinity when a
// stage does not fit; its kind is then full).
Partition partition_of(const PartitionCosts& costs, const std::vector<int64_t>& starts);

// Calls fn(starts) for every split of n positions into k non-empty contiguous stages
// (C(n-1, k-1) of them), in lexicographic order of the starts.
void for_each_contiguous_partition(int64_t n, int k,
                                   const std::function<void(const std::vector<int64_t>&)>& fn);

}  // namespace hybridplan
