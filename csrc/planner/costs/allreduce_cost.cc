#include "planner/costs/allreduce_cost.h"

#include <algorithm>
#include <limits>
#include <map>
#include <unordered_map>

namespace hybridplan {

AllReduceCost ring_allreduce(int64_t p, double bandwidth_bytes_per_s, double latency_s) {
  if (p <= 1) return {};
  const double steps = 2.0 * static_cast<double>(p - 1);
  return {steps * latency_s, steps / static_cast<double>(p) / bandwidth_bytes_per_s};
}

AllReduceCost hierarchical_allreduce(int64_t num_nodes, int64_t per_node, const Link& intra,
                                     const Link& inter, int64_t concurrent_groups_per_node) {
  const auto g = static_cast<double>(per_node);
  const auto n = static_cast<double>(num_nodes);
  const auto groups = static_cast<double>(std::max<int64_t>(1, concurrent_groups_per_node));
  AllReduceCost cost;
  if (per_node > 1) {  // reduce-scatter + all-gather inside each node
    cost.fixed_s += 2.0 * (g - 1) * intra.latency_s;
    cost.per_byte_s += 2.0 * (g - 1) / g / intra.bandwidth_bytes_per_s;
  }
  if (num_nodes > 1) {  // g shard rings of bytes/g, each getting bw_inter / (g * G)
    cost.fixed_s += 2.0 * (n - 1) * inter.latency_s;
    cost.per_byte_s += 2.0 * (n - 1) / n * groups / inter.bandwidth_bytes_per_s;
  }
  return cost;
}

namespace {

// Lexicographic (slowest hop, sum of hops) of a directed ring; larger is better.
struct RingScore {
  double slowest = -1;
  double total = 0;
  bool better_than(const RingScore& o) const {
    return slowest != o.slowest ? slowest > o.slowest : total > o.total;
  }
};

// Bottleneck Hamiltonian cycle over p <= kMaxExactRingMembers members by dynamic programming on
// subsets (Held-Karp with (min, sum) path scores): best[S][v] = the best path from member 0
// through exactly the members of S, ending at v. Exact for the lexicographic score above,
// because extending a path by an edge is monotone in both components.
std::vector<int64_t> best_ring_exact(const std::vector<std::vector<double>>& bw) {
  const auto p = static_cast<int64_t>(bw.size());
  const int64_t full = (int64_t{1} << p) - 1;
  std::vector<RingScore> best(static_cast<size_t>((full + 1) * p));
  std::vector<int8_t> from(best.size(), -1);
  const auto at = [p](int64_t set, int64_t v) { return static_cast<size_t>(set * p + v); };
  best[at(1, 0)] = {std::numeric_limits<double>::infinity(), 0};
  for (int64_t set = 1; set <= full; set += 2) {  // every path starts at member 0
    for (int64_t v = 0; v < p; ++v) {
      const RingScore here = best[at(set, v)];
      if (here.slowest < 0) continue;
      for (int64_t w = 1; w < p; ++w) {
        if (set & (int64_t{1} << w)) continue;
        const RingScore next{std::min(here.slowest, bw[v][w]), here.total + bw[v][w]};
        const size_t k = at(set | (int64_t{1} << w), w);
        if (next.better_than(best[k])) {
          best[k] = next;
          from[k] = static_cast<int8_t>(v);
        }
      }
    }
  }
  int64_t end = 1;
  RingScore closed;
  for (int64_t v = 1; v < p; ++v) {
    const RingScore path = best[at(full, v)];
    const RingScore ring{std::min(path.slowest, bw[v][0]), path.total + bw[v][0]};
    if (ring.better_than(closed)) {
      closed = ring;
      end = v;
    }
  }
  std::vector<int64_t> order;
  for (int64_t set = full, v = end; v >= 0;) {
    order.push_back(v);
    const int64_t prev = from[at(set, v)];
    set &= ~(int64_t{1} << v);
    v = prev;
  }
  std::reverse(order.begin(), order.end());
  return order;
}

// Greedy nearest neighbour from member 0 (the widest next hop), for nodes too big to search.
std::vector<int64_t> best_ring_greedy(const std::vector<std::vector<double>>& bw) {
  const auto p = static_cast<int64_t>(bw.size());
  std::vector<int64_t> order{0};
  std::vector<char> used(p, 0);
  used[0] = 1;
  while (static_cast<int64_t>(order.size()) < p) {
    int64_t next = -1;
    for (int64_t w = 0; w < p; ++w)
      if (!used[w] && (next < 0 || bw[order.back()][w] > bw[order.back()][next])) next = w;
    used[next] = 1;
    order.push_back(next);
  }
  return order;
}

}  // namespace

std::vector<DeviceIndex> ring_order(const Cluster& cluster, const std::vector<DeviceIndex>& members) {
  const auto p = static_cast<int64_t>(members.size());
  if (cluster.collectives == CollectiveLibrary::kGloo || p <= 2) return members;
  std::vector<std::vector<double>> bw(p, std::vector<double>(p, 0.0));
  for (int64_t i = 0; i < p; ++i)
    for (int64_t j = 0; j < p; ++j)
      if (i != j) bw[i][j] = cluster.allreduce_link(members[i], members[j]).bandwidth_bytes_per_s;
  const std::vector<int64_t> order = p <= kMaxExactRingMembers ? best_ring_exact(bw) : best_ring_greedy(bw);
  std::vector<DeviceIndex> ring;
  ring.reserve(p);
  for (int64_t i : order) ring.push_back(members[i]);
  return ring;
}

namespace {

// The rings a collective of `kind` runs over `devices` (rank order): the slowest hop inside the
// nodes, the link between nodes, and how the members spread over nodes.
struct GroupRings {
  Link slowest_intra{std::numeric_limits<double>::infinity(), 0.0};
  Link inter;
  int64_t num_nodes = 0;
  int64_t per_node = 0;
};

GroupRings group_rings(const Cluster& cluster, const std::vector<DeviceIndex>& devices,
                       Collective kind, std::vector<DeviceIndex>* rings) {
  // Members per node, in rank order; nodes in order of first appearance.
  std::vector<std::pair<int64_t, std::vector<DeviceIndex>>> by_node;
  std::unordered_map<int64_t, size_t> node_entry;  // node -> index in by_node: O(p), not O(p n)
  for (DeviceIndex d : devices) {
    const int64_t node = d / cluster.devices_per_node;
    const auto [it, fresh] = node_entry.emplace(node, by_node.size());
    if (fresh) by_node.push_back({node, {}});
    by_node[it->second].second.push_back(d);
  }
  // Slowest hop of the ring(s) inside each node. Every node holds the same pattern of members
  // in the usual meshes, so the ring search runs once per distinct local pattern.
  GroupRings out;
  std::map<std::vector<int64_t>, std::vector<int64_t>> ring_of_pattern;  // local -> local ring
  for (const auto& [node, members] : by_node) {
    out.per_node = std::max<int64_t>(out.per_node, static_cast<int64_t>(members.size()));
    std::vector<int64_t> local;
    for (DeviceIndex d : members) local.push_back(d % cluster.devices_per_node);
    auto it = ring_of_pattern.find(local);
    if (it == ring_of_pattern.end()) it = ring_of_pattern.emplace(local, ring_order(cluster, local)).first;
    std::vector<DeviceIndex> ring;
    for (int64_t l : it->second) ring.push_back(node * cluster.devices_per_node + l);
    for (size_t i = 0; ring.size() > 1 && i < ring.size(); ++i) {
      const Link hop = cluster.collective_link(kind, ring[i], ring[(i + 1) % ring.size()]);
      out.slowest_intra.bandwidth_bytes_per_s =
          std::min(out.slowest_intra.bandwidth_bytes_per_s, hop.bandwidth_bytes_per_s);
      out.slowest_intra.latency_s = std::max(out.slowest_intra.latency_s, hop.latency_s);
    }
    if (rings) rings->insert(rings->end(), ring.begin(), ring.end());
  }
  out.num_nodes = static_cast<int64_t>(by_node.size());
  if (out.num_nodes > 1) {
    out.inter = cluster.collective_link(kind, by_node[0].second[0], by_node[1].second[0]);
  }
  return out;
}

}  // namespace

AllReduceCost group_allreduce(const Cluster& cluster, const std::vector<DeviceIndex>& devices,
                              int64_t concurrent_groups_per_node, std::vector<DeviceIndex>* rings) {
  const auto p = static_cast<int64_t>(devices.size());
  if (rings) rings->clear();
  if (p <= 1) {
    if (rings) *rings = devices;
    return {};
  }
  const GroupRings g = group_rings(cluster, devices, Collective::kAllReduce, rings);
  if (g.num_nodes == 1) {
    return ring_allreduce(p, g.slowest_intra.bandwidth_bytes_per_s, g.slowest_intra.latency_s);
  }
  return hierarchical_allreduce(g.num_nodes, g.per_node, g.slowest_intra, g.inter,
                                concurrent_groups_per_node);
}

AllReduceCost ring_shard_collective(int64_t p, double bandwidth_bytes_per_s, double latency_s) {
  if (p <= 1) return {};
  const auto steps = static_cast<double>(p - 1);
  return {steps * latency_s, steps / static_cast<double>(p) / bandwidth_bytes_per_s};
}

AllReduceCost group_shard_collective(const Cluster& cluster, const std::vector<DeviceIndex>& devices,
                                     Collective kind, int64_t concurrent_groups_per_node) {
  const auto p = static_cast<int64_t>(devices.size());
  if (p <= 1) return {};
  const GroupRings g = group_rings(cluster, devices, kind, nullptr);
  Link hop = g.slowest_intra;
  if (g.num_nodes > 1) {  // one ring through every node: its inter-node hops share the NIC
    const auto groups = static_cast<double>(std::max<int64_t>(1, concurrent_groups_per_node));
    hop.bandwidth_bytes_per_s = std::min(hop.bandwidth_bytes_per_s, g.inter.bandwidth_bytes_per_s / groups);
    hop.latency_s = std::max(hop.latency_s, g.inter.latency_s);
  }
  return ring_shard_collective(p, hop.bandwidth_bytes_per_s, hop.latency_s);
}

void BucketedAllReduce::launch() {
  const double start_s = std::max(bucket_ready_s_, stream_free_s_);
  stream_free_s_ = start_s + cost_.time_s(bucket_bytes_);
  ++launched_;
  bucket_bytes_ = 0;
  bucket_ready_s_ = 0;
}

void BucketedAllReduce::add_gradient(double ready_s, double bytes) {
  if (bytes <= 0) return;
  bucket_bytes_ += bytes;
  bucket_ready_s_ = std::max(bucket_ready_s_, ready_s);
  const int64_t cap = launched_ == 0 ? caps_.first_bytes : caps_.bytes;
  if (bucket_bytes_ >= static_cast<double>(cap)) launch();
}

double BucketedAllReduce::end_s() {
  if (bucket_bytes_ > 0) launch();
  return stream_free_s_;
}

}  // namespace hybridplan
