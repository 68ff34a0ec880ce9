#include "planner/searches/pipeline_partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>
#include <utility>

#include "common/error.h"
#include "planner/documents/plan.h"

namespace hybridplan {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();

// The split at equal shares of `prefix` (n+1 non-decreasing entries): stage s begins at the
// first allowed position whose prefix reaches s/k of the total, leaving a position for every
// later stage; nullopt where that split does not exist.
std::optional<std::vector<int64_t>> balanced_starts(const PartitionCosts& costs,
                                                    const std::vector<double>& prefix) {
  const int64_t n = costs.num_positions();
  const int k = costs.num_stages();
  std::vector<int64_t> starts(k + 1, 0);
  starts[k] = n;
  int64_t p = 0;
  for (int s = 1; s < k; ++s) {
    const double share = prefix[n] * s / k;
    p = std::max<int64_t>(p + 1, std::lower_bound(prefix.begin(), prefix.end(), share) - prefix.begin());
    while (p < n && !costs.cut_allowed(p)) ++p;
    if (p > n - (k - s)) return std::nullopt;
    starts[s] = p;
  }
  return starts;
}

// The bottleneck of the split at equal compute shares, +infinity where that split does not
// exist or does not fit: an upper bound on the optimum (optimal_partition narrows its DP with
// it).
double balanced_split_bottleneck(const PartitionCosts& costs) {
  const std::optional<std::vector<int64_t>> starts = balanced_starts(costs, costs.prefix_compute_s);
  return starts ? partition_bottleneck_s(costs, *starts) : kInf;
}

}  // namespace

double PartitionCosts::stage_s(int stage, int64_t first, int64_t end) const {
  double t = prefix_compute_s[end] - prefix_compute_s[first];
  if (stage > 0) t += boundary_s[stage - 1][first];
  if (stage + 1 < num_stages()) t += boundary_s[stage][end];
  return t;
}

double PartitionCosts::workspace_max(int64_t first, int64_t end) const {
  if (workspace_bytes.empty()) return 0.0;
  double most = 0;
  for (int64_t p = first; p < end; ++p) most = std::max(most, workspace_bytes[p]);
  return most;
}

namespace {

double between(const std::vector<double>& prefix, int64_t first, int64_t end) {
  return prefix.empty() ? 0.0 : prefix[end] - prefix[first];
}

// The bytes of stage s on [first, end) besides its activations: static (tied copies included),
// workspace, receive buffers and the first and last stages' batch and output.
double fixed_bytes(const PartitionCosts& c, int stage, int64_t first, int64_t end, double workspace) {
  const int k = c.num_stages();
  double bytes = c.prefix_static_bytes[end] - c.prefix_static_bytes[first] + workspace;
  for (const PartitionCosts::TiedCopy& tied : c.tied_copies) {
    const auto inside = [&](int64_t p) { return first <= p && p < end; };
    if (tied.positions.empty() || inside(tied.positions.front())) continue;
    if (std::any_of(tied.positions.begin() + 1, tied.positions.end(), inside)) bytes += tied.bytes;
  }
  if (!c.receive_bytes.empty()) {
    if (stage > 0) bytes += c.receive_bytes[first];
    if (stage + 1 < k) bytes += c.receive_bytes[end];
  }
  if (stage == 0) bytes += c.first_stage_bytes;
  if (stage + 1 == k) bytes += c.activation_multiplier[stage] * c.last_stage_bytes;
  return bytes;
}

// The split a DP's choices give: from position n back, stage s ends where stage s + 1 begins
// (arg[s][end]), with the recompute kind it chose there (kind[s][end]); bottleneck_s unset.
Partition walk_back(const std::vector<std::vector<int64_t>>& arg,
                    const std::vector<std::vector<StageRecompute>>& kind, int k, int64_t n) {
  Partition p;
  p.stage_starts.assign(k + 1, 0);
  p.recompute.assign(k, kRecomputeNone);
  p.stage_starts[k] = n;
  int64_t end = n;
  for (int s = k - 1; s >= 1; --s) {
    p.recompute[s] = kind[s][end];
    end = arg[s][end];
    p.stage_starts[s] = end;
  }
  p.recompute[0] = kind[0][end];
  return p;
}

bool selective_allowed(const PartitionCosts& c, int64_t first, int64_t end) {
  return !c.prefix_selective_recompute_s.empty() && !c.prefix_unselective.empty() &&
         c.prefix_unselective[end] == c.prefix_unselective[first];
}

}  // namespace

namespace {

// stage_bytes given the stage's fixed_bytes (`fixed`, the same for every kind: found once where
// several kinds are weighed)
double bytes_of_kind(const PartitionCosts& c, int stage, int64_t first, int64_t end, StageRecompute r,
                     double fixed) {
  const double act = between(c.prefix_activation_bytes, first, end);
  double kept = act, rebuilt = 0;
  if (r == kRecomputeFull) {
    kept = 0;
    rebuilt = act;
  } else if (r == kRecomputeSelective) {
    kept = between(c.prefix_selective_kept_bytes, first, end);
    rebuilt = between(c.prefix_selective_rebuilt_bytes, first, end);
  }
  return fixed + c.activation_multiplier[stage] * kept + rebuilt;
}

}  // namespace

double PartitionCosts::stage_bytes(int stage, int64_t first, int64_t end, StageRecompute r,
                                   double workspace) const {
  return bytes_of_kind(*this, stage, first, end, r, fixed_bytes(*this, stage, first, end, workspace));
}

namespace {

// stage_bytes_floor, defined here so that the DPs' inner loops inline it (they call it for
// nearly every state they scan).
inline double bytes_floor(const PartitionCosts& c, int stage, int64_t first, int64_t end,
                          double workspace) {
  const double act = c.prefix_activation_bytes[end] - c.prefix_activation_bytes[first];
  const double mult = c.activation_multiplier[stage];
  double least = mult * act;
  if (!c.prefix_full_recompute_s.empty()) least = std::min(least, act);
  if (selective_allowed(c, first, end)) {
    least = std::min(least, mult * (c.prefix_selective_kept_bytes[end] - c.prefix_selective_kept_bytes[first]) +
                                c.prefix_selective_rebuilt_bytes[end] - c.prefix_selective_rebuilt_bytes[first]);
  }
  return c.prefix_static_bytes[end] - c.prefix_static_bytes[first] + workspace + least;
}

// The ends each stage can have in a split whose every stage's memory floor (bytes_floor) is at
// most `limit`: stage s ends within [lo[s], hi[s]]; nullopt when no split has every floor
// within it. The floor only grows with the stage's extent, so taking each stage as long as it
// may from the front bounds every such split's ends from above (hi), and from the back its
// starts from below (lo: stage s ends where stage s + 1 starts): a split's stages end no later
// and start no earlier than these greedy ones, by induction over the stages. A necessary
// condition only (cuts where the graph forbids them are allowed here), found in O(n + k).
struct EndWindows {
  std::vector<int64_t> lo, hi;
};
std::optional<EndWindows> end_windows(const PartitionCosts& c, double limit) {
  const int64_t n = c.num_positions();
  const int k = c.num_stages();
  const bool workspaces = !c.workspace_bytes.empty();
  EndWindows w;
  w.lo.assign(k, n);
  w.hi.assign(k, n);
  int64_t start = 0;
  for (int s = 0; s < k; ++s) {
    double workspace = 0;
    int64_t end = start;
    while (end < n) {
      const double widened = workspaces ? std::max(workspace, c.workspace_bytes[end]) : 0.0;
      if (bytes_floor(c, s, start, end + 1, widened) > limit) break;
      workspace = widened;
      ++end;
    }
    w.hi[s] = end;
    start = end;
  }
  if (w.hi[k - 1] < n) return std::nullopt;
  int64_t end = n;
  for (int s = k - 1; s >= 1; --s) {
    double workspace = 0;
    int64_t first = end;
    while (first > 0) {
      const double widened = workspaces ? std::max(workspace, c.workspace_bytes[first - 1]) : 0.0;
      if (bytes_floor(c, s, first - 1, end, widened) > limit) break;
      workspace = widened;
      --first;
    }
    w.lo[s - 1] = first;
    end = first;
  }
  if (end > 0 && bytes_floor(c, 0, 0, end, c.workspace_max(0, end)) > limit) return std::nullopt;
  return w;
}

// The positions [first, last] of `row` from `lowest` on that hold the first and the last value
// below `limit` (first > last where none does): a DP's scan over the starts of a stage needs
// no other, the previous stage's state being `limit` or more (or +infinity) elsewhere.
std::pair<int64_t, int64_t> finite_span(const std::vector<double>& row, int64_t lowest, double limit) {
  int64_t first = lowest, last = static_cast<int64_t>(row.size()) - 1;
  while (first <= last && !(row[first] < limit)) ++first;
  while (last >= first && !(row[last] < limit)) --last;
  return {first, last};
}

// The largest workspace over [first, end) where first is the position after `last_start` or
// end itself (a scan of the stage ending at `end` begins at min(end - 1, last_start)), for ends
// that only grow: the range past last_start widened one position at a time.
class WorkspaceAbove {
 public:
  explicit WorkspaceAbove(int64_t last_start) : first_(last_start + 1), next_(last_start + 1) {}
  double over(const PartitionCosts& c, int64_t first, int64_t end) {
    if (first >= end || c.workspace_bytes.empty()) return 0.0;
    HP_INTERNAL_ASSERT(first == first_ && end >= next_, "the range past the last start, growing");
    for (; next_ < end; ++next_) most_ = std::max(most_, c.workspace_bytes[next_]);
    return most_;
  }

 private:
  int64_t first_, next_;
  double most_ = 0;
};

}  // namespace

double PartitionCosts::stage_bytes_floor(int stage, int64_t first, int64_t end,
                                         double workspace) const {
  return bytes_floor(*this, stage, first, end, workspace);
}

PartitionCosts::Choice PartitionCosts::choose(int stage, int64_t first, int64_t end,
                                              double workspace) const {
  const double base = stage_s(stage, first, end);
  if (memory_capacity_bytes <= 0) return {base, kRecomputeNone};
  const double fixed = fixed_bytes(*this, stage, first, end, workspace);
  if (bytes_of_kind(*this, stage, first, end, kRecomputeNone, fixed) <= memory_capacity_bytes) {
    return {base, kRecomputeNone};
  }
  // by time: selective runs part of the forward again, full all of it
  if (selective_allowed(*this, first, end) &&
      bytes_of_kind(*this, stage, first, end, kRecomputeSelective, fixed) <= memory_capacity_bytes) {
    return {base + between(prefix_selective_recompute_s, first, end), kRecomputeSelective};
  }
  if (!prefix_full_recompute_s.empty() &&
      bytes_of_kind(*this, stage, first, end, kRecomputeFull, fixed) <= memory_capacity_bytes) {
    return {base + between(prefix_full_recompute_s, first, end), kRecomputeFull};
  }
  return {kInf, kRecomputeFull};
}

bool PartitionCosts::fits(int stage, int64_t first, int64_t end) const {
  return choose(stage, first, end, workspace_max(first, end)).time_s < kInf;
}

std::optional<Partition> optimal_partition(const PartitionCosts& costs,
                                           const std::vector<std::vector<int64_t>>& hints) {
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
  double upper = balanced_split_bottleneck(costs);
  for (const std::vector<int64_t>& starts : hints) {
    HP_INTERNAL_ASSERT(starts.size() == static_cast<size_t>(k + 1) && starts.front() == 0 &&
                           starts.back() == n,
                       "a hint is a split of the positions into the stages");
    upper = std::min(upper, partition_bottleneck_s(costs, starts));
  }
  const double bound = upper * (1 + 1e-9) + std::numeric_limits<double>::min();
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
  // kind[s][j]: the recompute kind of stage s in best[s][j]'s split
  std::vector<std::vector<StageRecompute>> kind(k, std::vector<StageRecompute>(n + 1, kRecomputeNone));
  const bool limited = costs.memory_capacity_bytes > 0;
  const bool workspaces = !costs.workspace_bytes.empty();
  // The scans below stop where the memory floor (stage_bytes_floor, growing with the stage)
  // plus the bytes fixed for the scan exceed the capacity: a stage's receive buffers at its
  // fixed end, or at least the fewest of any place to cut; the first and last stages' own.
  double fewest_received = 0;
  if (!costs.receive_bytes.empty() && k > 1) {
    fewest_received = kInf;
    for (int64_t p = 1; p < n; ++p) {
      if (costs.cut_allowed(p)) fewest_received = std::min(fewest_received, costs.receive_bytes[p]);
    }
  }
  const double capacity = costs.memory_capacity_bytes;
  // Under a memory limit only the ends a split of stages within it can have (end_windows): a
  // state outside them is on no split that fits, and decides none (a start another state
  // takes lies on the split it completes).
  std::optional<EndWindows> windows;
  if (limited) {
    windows = end_windows(costs, capacity);
    if (!windows) return std::nullopt;
  }
  const auto lowest = [&](int s) { return windows ? windows->lo[s] : int64_t{0}; };
  const auto highest = [&](int s) { return windows ? windows->hi[s] : n; };
  {
    auto [j, last] = ends(0, std::max<int64_t>(1, lowest(0)), std::min(n - (k - 1), highest(0)));
    double workspace = costs.workspace_max(0, j - 1);  // [0, j) as j grows, below
    const double fixed = costs.first_stage_bytes + (k > 1 ? fewest_received
                                                          : costs.activation_multiplier[0] * costs.last_stage_bytes);
    for (; j <= last; ++j) {
      if (workspaces) workspace = std::max(workspace, costs.workspace_bytes[j - 1]);
      if (limited && bytes_floor(costs, 0, 0, j, workspace) + fixed > capacity) break;
      const PartitionCosts::Choice c = costs.choose(0, 0, j, workspace);
      best[0][j] = c.time_s;
      kind[0][j] = c.recompute;
    }
  }
  for (int s = 1; s < k; ++s) {
    // The starts stage s can take: where stage s - 1's state is below `bound` (the others
    // are skipped by every scan below, and end none of them early: what stops a scan only
    // grows as the start decreases, and nothing before them lowers b).
    const auto [first_start, last_start] = finite_span(best[s - 1], std::max<int64_t>(s, lowest(s - 1)), bound);
    WorkspaceAbove above(last_start);
    // Stage s ends at j; stages after it need at least k-1-s positions.
    for (auto [j, last] = ends(s, std::max<int64_t>(s + 1, lowest(s)),
                               std::min(n - (k - 1 - s), highest(s)));
         j <= last; ++j) {
      const double out_s = s + 1 < k ? costs.boundary_s[s][j] : 0.0;
      double b = bound;
      int64_t b_arg = -1;
      StageRecompute b_kind = kRecomputeNone;
      // over [i, j) as i decreases, from the latest start stage s - 1's state allows
      const int64_t from = std::min(j - 1, last_start);
      double workspace = above.over(costs, from + 1, j);
      const double fixed =
          fewest_received + (s + 1 < k ? (costs.receive_bytes.empty() ? 0.0 : costs.receive_bytes[j])
                                       : costs.activation_multiplier[s] * costs.last_stage_bytes);
      for (int64_t i = from; i >= first_start; --i) {
        if (workspaces) workspace = std::max(workspace, costs.workspace_bytes[i]);
        const double compute_s = costs.prefix_compute_s[j] - costs.prefix_compute_s[i];
        // compute_s and the memory floor only grow as i decreases: nothing further left can
        // win or fit.
        if (compute_s + out_s >= b) break;
        if (limited && bytes_floor(costs, s, i, j, workspace) + fixed > capacity) break;
        const double prev = best[s - 1][i];
        if (prev >= b || !costs.cut_allowed(i)) continue;
        // without a limit every stage keeps its activations: stage_s, inlined (the same sum)
        const PartitionCosts::Choice c =
            limited ? costs.choose(s, i, j, workspace)
                    : PartitionCosts::Choice{compute_s + costs.boundary_s[s - 1][i] + out_s, kRecomputeNone};
        const double cand = std::max(prev, c.time_s);
        if (cand < b) {
          b = cand;
          b_arg = i;
          b_kind = c.recompute;
        }
      }
      best[s][j] = b;
      arg[s][j] = b_arg;
      kind[s][j] = b_kind;
    }
  }
  if (best[k - 1][n] == kInf) return std::nullopt;

  Partition p = walk_back(arg, kind, k, n);
  p.bottleneck_s = best[k - 1][n];
  return p;
}

std::optional<Partition> least_memory_partition(const PartitionCosts& costs) {
  const int64_t n = costs.num_positions();
  const int k = costs.num_stages();
  HP_INTERNAL_ASSERT(k >= 1, "need at least one stage");
  if (n < k) return std::nullopt;
  const bool workspaces = !costs.workspace_bytes.empty();
  // the least bytes of stage s on [i, j) over the kinds, and that kind
  const auto least = [&](int s, int64_t i, int64_t j, double workspace) {
    const double fixed = fixed_bytes(costs, s, i, j, workspace);
    std::pair<double, StageRecompute> out{bytes_of_kind(costs, s, i, j, kRecomputeNone, fixed), kRecomputeNone};
    if (selective_allowed(costs, i, j)) {
      const double b = bytes_of_kind(costs, s, i, j, kRecomputeSelective, fixed);
      if (b < out.first) out = {b, kRecomputeSelective};
    }
    if (!costs.prefix_full_recompute_s.empty()) {
      const double b = bytes_of_kind(costs, s, i, j, kRecomputeFull, fixed);
      if (b < out.first) out = {b, kRecomputeFull};
    }
    return out;
  };
  // An upper bound on the answer: the fullest stage of the splits at equal shares of compute,
  // of parameter state and of activations, each stage at its least kind (the DP's own value of
  // that split, so the answer is at most it), with a slack for rounding. Only states worth at
  // most `upper` can lie on the answer's split or decide which split it is (its stages' values
  // are at most the answer; a state's choice is the latest start of the least value, and a
  // start whose value exceeds `upper` is never that): a state worth more stays above `upper`
  // (+infinity or a value over it) and is not computed exactly. Scans stop where the stage alone
  // exceeds `upper` instead of where it exceeds the state's best so far, which with many stages
  // shortens them from most of the chain to a few stages' width.
  double upper = kInf;
  for (const std::vector<double>* prefix :
       {&costs.prefix_compute_s, &costs.prefix_static_bytes, &costs.prefix_activation_bytes}) {
    if (prefix->size() != static_cast<size_t>(n + 1)) continue;
    const std::optional<std::vector<int64_t>> starts = balanced_starts(costs, *prefix);
    if (!starts) continue;
    double fullest = 0;
    for (int s = 0; s < k; ++s) {
      const int64_t i = (*starts)[s], j = (*starts)[s + 1];
      fullest = std::max(fullest, least(s, i, j, costs.workspace_max(i, j)).first);
    }
    upper = std::min(upper, fullest);
  }
  upper = upper * (1 + 1e-9) + std::numeric_limits<double>::min();
  // Stage s ends at j only where stages 0..s can hold the parameter state before j and stages
  // s+1..k-1 the rest, each at most `upper` (a stage's bytes are at least its parameter state).
  const std::vector<double>& state = costs.prefix_static_bytes;
  const auto ends = [&](int s, int64_t first, int64_t last) {
    if (upper < kInf) {
      const double after = (k - 1 - s) * upper, upto = (s + 1) * upper;
      first = std::max<int64_t>(
          first, std::lower_bound(state.begin(), state.end(), state[n] - after) - state.begin());
      last = std::min<int64_t>(last,
                               std::upper_bound(state.begin(), state.end(), upto) - state.begin() - 1);
    }
    return std::make_pair(first, last);
  };
  // and only the ends a split of stages within `upper` can have (end_windows)
  std::optional<EndWindows> windows;
  if (upper < kInf) windows = end_windows(costs, upper);
  HP_INTERNAL_ASSERT(upper == kInf || windows, "the split `upper` comes from is within it");
  const auto lowest = [&](int s) { return windows ? windows->lo[s] : int64_t{0}; };
  const auto highest = [&](int s) { return windows ? windows->hi[s] : n; };
  double fewest_received = 0;  // as optimal_partition's scans
  if (!costs.receive_bytes.empty() && k > 1) {
    fewest_received = kInf;
    for (int64_t p = 1; p < n; ++p) {
      if (costs.cut_allowed(p)) fewest_received = std::min(fewest_received, costs.receive_bytes[p]);
    }
  }
  std::vector<std::vector<double>> best(k, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int64_t>> arg(k, std::vector<int64_t>(n + 1, -1));
  std::vector<std::vector<StageRecompute>> kind(k, std::vector<StageRecompute>(n + 1, kRecomputeNone));
  {
    const auto [first, last] = ends(0, std::max<int64_t>(1, lowest(0)), std::min(n - (k - 1), highest(0)));
    double workspace = costs.workspace_max(0, first - 1);  // [0, j) as j grows, below
    for (int64_t j = first; j <= last; ++j) {
      if (workspaces) workspace = std::max(workspace, costs.workspace_bytes[j - 1]);
      // the stage's floor only grows with j: no later end is worth at most `upper`
      if (bytes_floor(costs, 0, 0, j, workspace) > upper) break;
      std::tie(best[0][j], kind[0][j]) = least(0, 0, j, workspace);
    }
  }
  for (int s = 1; s < k; ++s) {
    // the starts whose stage s - 1 state is within `upper` (as optimal_partition's scans)
    const auto [first_start, last_start] =
        finite_span(best[s - 1], std::max<int64_t>(s, lowest(s - 1)), std::nextafter(upper, kInf));
    WorkspaceAbove above(last_start);
    for (auto [j, last] = ends(s, std::max<int64_t>(s + 1, lowest(s)),
                               std::min(n - (k - 1 - s), highest(s)));
         j <= last; ++j) {
      const double fixed =
          fewest_received + (s + 1 < k ? (costs.receive_bytes.empty() ? 0.0 : costs.receive_bytes[j])
                                       : costs.activation_multiplier[s] * costs.last_stage_bytes);
      double b = kInf;
      const int64_t from = std::min(j - 1, last_start);
      double workspace = above.over(costs, from + 1, j);
      for (int64_t i = from; i >= first_start; --i) {
        if (workspaces) workspace = std::max(workspace, costs.workspace_bytes[i]);
        // the stage's floor only grows as i decreases: nothing further left needs less, or
        // stays within `upper`
        const double floor = bytes_floor(costs, s, i, j, workspace) + fixed;
        if (floor >= b || floor > upper) break;
        const double prev = best[s - 1][i];
        if (prev >= b || prev > upper || !costs.cut_allowed(i)) continue;
        const auto [bytes, r] = least(s, i, j, workspace);
        const double cand = std::max(prev, bytes);
        if (cand < b) {
          b = cand;
          arg[s][j] = i;
          kind[s][j] = r;
        }
      }
      best[s][j] = b;
    }
  }
  if (best[k - 1][n] == kInf) return std::nullopt;
  Partition p = walk_back(arg, kind, k, n);
  p.fullest_bytes = best[k - 1][n];
  for (int s = 0; s < k; ++s) {
    const int64_t i = p.stage_starts[s], j = p.stage_starts[s + 1];
    const double again = p.recompute[s] == kRecomputeFull        ? between(costs.prefix_full_recompute_s, i, j)
                         : p.recompute[s] == kRecomputeSelective ? between(costs.prefix_selective_recompute_s, i, j)
                                                                 : 0.0;
    p.bottleneck_s = std::max(p.bottleneck_s, costs.stage_s(s, i, j) + again);
  }
  return p;
}

Partition partition_of(const PartitionCosts& costs, const std::vector<int64_t>& starts) {
  Partition p;
  p.stage_starts = starts;
  p.recompute.assign(costs.num_stages(), kRecomputeNone);
  for (int s = 0; s < costs.num_stages(); ++s) {
    const PartitionCosts::Choice c =
        s > 0 && !costs.cut_allowed(starts[s])
            ? PartitionCosts::Choice{kInf, kRecomputeNone}
            : costs.choose(s, starts[s], starts[s + 1], costs.workspace_max(starts[s], starts[s + 1]));
    p.recompute[s] = c.recompute;
    p.bottleneck_s = std::max(p.bottleneck_s, c.time_s);
  }
  return p;
}

double partition_bottleneck_s(const PartitionCosts& costs, const std::vector<int64_t>& starts) {
  return partition_of(costs, starts).bottleneck_s;
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
