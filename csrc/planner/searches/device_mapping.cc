#include "planner/searches/device_mapping.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>
#include <sstream>

#include "common/error.h"

namespace hybridplan {

namespace {

constexpr int64_t kMaxGroupings = 200000;  // exhaustive grouping search budget (leaves)
constexpr int64_t kMaxOrderSearch = 8;     // all mp! stage orders up to this mp

// Lexicographic (slowest link, total bandwidth); larger is better.
struct Score {
  double slowest_bytes_per_s = std::numeric_limits<double>::infinity();
  double total_bytes_per_s = 0;
  bool better_than(const Score& o) const {
    if (slowest_bytes_per_s != o.slowest_bytes_per_s)
      return slowest_bytes_per_s > o.slowest_bytes_per_s;
    return total_bytes_per_s > o.total_bytes_per_s;
  }
};

class NodeLinkTable {
 public:
  explicit NodeLinkTable(const Cluster& c) : n_(c.devices_per_node), bw_(n_ * n_, 0) {
    for (int64_t i = 0; i < n_; ++i)
      for (int64_t j = 0; j < n_; ++j)
        if (i != j) bw_[i * n_ + j] = c.link(i, j).bandwidth_bytes_per_s;
  }
  double bw(int64_t i, int64_t j) const { return bw_[i * n_ + j]; }
  int64_t size() const { return n_; }
  bool uniform() const {
    for (int64_t i = 0; i < n_; ++i)
      for (int64_t j = 0; j < n_; ++j)
        if (i != j && bw(i, j) != bw(0, n_ > 1 ? 1 : 0)) return false;
    return true;
  }
  Score group_score(const std::vector<int64_t>& g) const {
    Score s;
    for (int64_t a : g)
      for (int64_t b : g)
        if (a != b) {
          s.slowest_bytes_per_s = std::min(s.slowest_bytes_per_s, bw(a, b));
          s.total_bytes_per_s += bw(a, b);
        }
    return s;
  }

 private:
  int64_t n_;
  std::vector<double> bw_;
};

Score combine(const std::vector<Score>& scores) {
  Score s;
  for (const auto& g : scores) {
    s.slowest_bytes_per_s = std::min(s.slowest_bytes_per_s, g.slowest_bytes_per_s);
    s.total_bytes_per_s += g.total_bytes_per_s;
  }
  return s;
}

// Exhaustive: groups in canonical order (increasing smallest member, members increasing).
// Returns false when the budget ran out.
bool exhaustive_groups(const NodeLinkTable& links, int64_t mp, int64_t count,
                       std::vector<std::vector<int64_t>>& best) {
  const int64_t n = links.size();
  std::vector<char> used(n, 0);
  std::vector<std::vector<int64_t>> chosen;
  std::vector<Score> scores;
  Score best_score;
  bool have = false;
  int64_t leaves = 0;
  std::vector<int64_t> group;
  std::function<bool(int64_t)> pick_group;  // first member must be >= min_first

  // Extend `group` with members > last, then recurse to the next group.
  std::function<bool(int64_t, int64_t)> extend = [&](int64_t next, int64_t first) -> bool {
    if (static_cast<int64_t>(group.size()) == mp) {
      chosen.push_back(group);
      scores.push_back(links.group_score(group));
      const bool ok = pick_group(first + 1);  // reuses `group` for the next group
      group = chosen.back();
      chosen.pop_back();
      scores.pop_back();
      return ok;
    }
    for (int64_t d = next; d < n; ++d) {
      if (used[d]) continue;
      used[d] = 1;
      group.push_back(d);
      const bool ok = extend(d + 1, first);
      group.pop_back();
      used[d] = 0;
      if (!ok) return false;
    }
    return true;
  };
  pick_group = [&](int64_t min_first) -> bool {
    if (static_cast<int64_t>(chosen.size()) == count) {
      if (++leaves > kMaxGroupings) return false;
      const Score s = combine(scores);
      if (!have || s.better_than(best_score)) {
        best_score = s;
        best = chosen;
        have = true;
      }
      return true;
    }
    for (int64_t first = min_first; first < n; ++first) {
      if (used[first]) continue;
      used[first] = 1;
      group.assign(1, first);
      const bool ok = extend(first + 1, first);
      used[first] = 0;
      if (!ok) return false;
    }
    return true;
  };
  return pick_group(0) && have;
}

// Greedy fallback for large nodes: repeatedly take the best group among unused devices.
std::vector<std::vector<int64_t>> greedy_groups(const NodeLinkTable& links, int64_t mp,
                                                int64_t count) {
  const int64_t n = links.size();
  std::vector<char> used(n, 0);
  std::vector<std::vector<int64_t>> out;
  for (int64_t g = 0; g < count; ++g) {
    std::vector<int64_t> free_devices;
    for (int64_t d = 0; d < n; ++d)
      if (!used[d]) free_devices.push_back(d);
    // Members: the first free device plus its mp-1 best-connected free peers.
    std::vector<int64_t> group{free_devices[0]};
    std::vector<int64_t> rest(free_devices.begin() + 1, free_devices.end());
    const int64_t head = free_devices[0];
    std::stable_sort(rest.begin(), rest.end(), [&](int64_t a, int64_t b) {
      return std::min(links.bw(head, a), links.bw(a, head)) >
             std::min(links.bw(head, b), links.bw(b, head));
    });
    group.insert(group.end(), rest.begin(), rest.begin() + (mp - 1));
    std::sort(group.begin(), group.end());
    for (int64_t d : group) used[d] = 1;
    out.push_back(group);
  }
  return out;
}

// Stage order inside a group: maximise the slowest consecutive link, then the sum.
std::vector<int64_t> pipeline_order(const NodeLinkTable& links, std::vector<int64_t> group) {
  if (static_cast<int64_t>(group.size()) > kMaxOrderSearch) return group;
  std::sort(group.begin(), group.end());
  std::vector<int64_t> best = group;
  Score best_score;
  bool have = false;
  do {
    Score s;
    for (size_t i = 0; i + 1 < group.size(); ++i) {
      const double bw = links.bw(group[i], group[i + 1]);
      s.slowest_bytes_per_s = std::min(s.slowest_bytes_per_s, bw);
      s.total_bytes_per_s += bw;
    }
    if (!have || s.better_than(best_score)) {
      best_score = s;
      best = group;
      have = true;
    }
  } while (std::next_permutation(group.begin(), group.end()));
  return best;
}

std::string join(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "{";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  os << "}";
  return os.str();
}

}  // namespace

namespace {

// map_devices for mp > devices_per_node (a pipeline's replica on k = mp / devices_per_node
// whole nodes; device_mapping.h).
DeviceMapping map_spanning_pipelines(const Cluster& cluster, int64_t dp, int64_t mp) {
  const int64_t per_node = cluster.devices_per_node;
  HP_INTERNAL_ASSERT(mp % per_node == 0, "mp=" << mp << " spans part of a node");
  const int64_t k = mp / per_node;
  HP_INTERNAL_ASSERT(dp >= 1 && dp * k <= cluster.num_nodes, "dp=" << dp << " mp=" << mp);
  // every node's devices in the best pipeline order (one group of the whole node)
  const std::vector<int64_t> order = best_local_groups(cluster, per_node, 1).front();
  DeviceMapping m;
  for (int64_t r = 0; r < dp; ++r) {
    std::vector<DeviceIndex> devs;
    for (int64_t node = r * k; node < r * k + k; ++node) {
      for (int64_t local : order) devs.push_back(node * per_node + local);
    }
    m.mesh.push_back(std::move(devs));
  }
  // consecutive stages on two nodes ride the inter-node link, the slowest of a replica's
  m.slowest_link_bytes_per_s = cluster.link(0, per_node).bandwidth_bytes_per_s;
  const NodeLinkTable links(cluster);
  for (int64_t a = 0; a < per_node; ++a) {
    for (int64_t b = 0; b < per_node; ++b) {
      if (a != b) m.slowest_link_bytes_per_s = std::min(m.slowest_link_bytes_per_s, links.bw(a, b));
    }
  }
  std::ostringstream os;
  os << "each replica's " << mp << " pipeline ranks span " << k << " whole nodes (replica r on "
     << "nodes r*" << k << " .. r*" << k << "+" << k - 1 << ", " << dp * k
     << " node(s) used), its stages node by node, on each node in the order " << join(order);
  if (links.uniform()) {
    os << " (all intra-node links are equal)";
  } else {
    os << " (consecutive stages share the fastest links)";
  }
  os << "; the stages at a node boundary talk over the inter-node link";
  m.note = os.str();
  return m;
}

}  // namespace

std::vector<std::vector<int64_t>> best_local_groups(const Cluster& cluster, int64_t mp,
                                                    int64_t count) {
  HP_INTERNAL_ASSERT(mp >= 1 && count >= 1 && mp * count <= cluster.devices_per_node,
                     "mp=" << mp << " count=" << count);
  const NodeLinkTable links(cluster);
  std::vector<std::vector<int64_t>> groups;
  if (mp == 1) {
    for (int64_t g = 0; g < count; ++g) groups.push_back({g});
    return groups;
  }
  if (!exhaustive_groups(links, mp, count, groups)) groups = greedy_groups(links, mp, count);
  for (auto& g : groups) g = pipeline_order(links, g);
  return groups;
}

DeviceMapping map_devices(const Cluster& cluster, int64_t dp, int64_t mp, int64_t tp) {
  if (tp > 1) {
    HP_INTERNAL_ASSERT(cluster.devices_per_node % tp == 0 &&
                           (cluster.devices_per_node % (mp * tp) == 0 ||
                            (mp * tp) % cluster.devices_per_node == 0),
                       "mp=" << mp << " tp=" << tp);
    Cluster groups = cluster;  // one device per TP group
    groups.devices_per_node = cluster.devices_per_node / tp;
    groups.bandwidth_matrix.assign(groups.devices_per_node,
                                   std::vector<double>(groups.devices_per_node, 0.0));
    for (int64_t g = 0; g < groups.devices_per_node; ++g) {
      for (int64_t h = 0; h < groups.devices_per_node; ++h) {
        if (g != h) groups.bandwidth_matrix[g][h] = cluster.link(g * tp, h * tp).bandwidth_bytes_per_s;
      }
    }
    DeviceMapping m = map_devices(groups, dp, mp);
    for (auto& row : m.mesh) {
      for (DeviceIndex& d : row) d *= tp;  // node * (per_node / tp) + g -> node * per_node + g * tp
    }
    m.note = "tensor-parallel groups of " + std::to_string(tp) + " consecutive devices (group g = "
             "devices g*" + std::to_string(tp) + " .. g*" + std::to_string(tp) + "+" +
             std::to_string(tp - 1) + "; mesh entries are their first devices), mapped as "
             "devices: " + m.note;
    return m;
  }
  const int64_t per_node = cluster.devices_per_node;
  if (mp > per_node) return map_spanning_pipelines(cluster, dp, mp);
  HP_INTERNAL_ASSERT(mp >= 1 && per_node % mp == 0, "mp=" << mp);
  HP_INTERNAL_ASSERT(dp >= 1 && dp * mp <= cluster.num_devices(), "dp=" << dp);
  const int64_t replicas_per_node = per_node / mp;
  // Whole nodes take the best full grouping; a partly used last node (or a single partly used
  // node) takes its best `count` groups, which need not be a subset of the best full grouping.
  const int64_t full_nodes = dp / replicas_per_node;
  const int64_t partial_count = dp % replicas_per_node;
  const auto groups = best_local_groups(cluster, mp, full_nodes > 0 ? replicas_per_node
                                                                    : partial_count);
  const auto partial_groups = full_nodes > 0 && partial_count > 0
                                  ? best_local_groups(cluster, mp, partial_count)
                                  : groups;

  DeviceMapping m;
  for (int64_t r = 0; r < dp; ++r) {
    const int64_t node = r / replicas_per_node;
    const auto& g = node < full_nodes ? groups : partial_groups;
    std::vector<DeviceIndex> devs;
    for (int64_t local : g[r % replicas_per_node]) devs.push_back(node * per_node + local);
    m.mesh.push_back(devs);
  }

  const NodeLinkTable links(cluster);
  m.slowest_link_bytes_per_s = 0;
  if (mp > 1) {
    m.slowest_link_bytes_per_s = std::numeric_limits<double>::infinity();
    for (const auto* gs : {&groups, &partial_groups})
      for (const auto& g : *gs)
        m.slowest_link_bytes_per_s =
            std::min(m.slowest_link_bytes_per_s, links.group_score(g).slowest_bytes_per_s);
  }
  std::ostringstream os;
  const int64_t nodes_used = (dp + replicas_per_node - 1) / replicas_per_node;
  if (mp == 1) {
    os << "one device per replica: devices 0.." << dp - 1 << " (" << nodes_used
       << " node(s) filled in order)";
  } else {
    os << "each replica's " << mp << " devices are local ";
    for (size_t i = 0; i < groups.size(); ++i) os << (i ? " / " : "") << join(groups[i]);
    os << " of its node (" << nodes_used << " node(s) filled in order); ";
    if (links.uniform()) {
      os << "all intra-node links are equal (" << links.bw(0, 1) << " B/s), so consecutive devices";
    } else {
      os << "chosen to maximise the slowest link inside a replica (" << m.slowest_link_bytes_per_s
         << " B/s), ordered so consecutive pipeline stages share the fastest links";
    }
  }
  m.note = os.str();
  return m;
}

}  // namespace hybridplan
