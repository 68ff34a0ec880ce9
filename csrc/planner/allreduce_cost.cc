#include "planner/allreduce_cost.h"

#include <algorithm>
#include <limits>
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

AllReduceCost group_allreduce(const Cluster& cluster, const std::vector<DeviceIndex>& devices,
                              int64_t concurrent_groups_per_node) {
  const auto p = static_cast<int64_t>(devices.size());
  if (p <= 1) return {};
  // Members per node, in ring order; nodes in order of first appearance.
  std::vector<std::pair<int64_t, std::vector<DeviceIndex>>> by_node;
  std::unordered_map<int64_t, size_t> node_entry;  // node -> index in by_node: O(p), not O(p n)
  for (DeviceIndex d : devices) {
    const int64_t node = d / cluster.devices_per_node;
    const auto [it, fresh] = node_entry.emplace(node, by_node.size());
    if (fresh) by_node.push_back({node, {}});
    by_node[it->second].second.push_back(d);
  }
  // Slowest hop of the ring(s) inside each node.
  Link slowest{std::numeric_limits<double>::infinity(), 0.0};
  int64_t per_node = 0;
  for (const auto& [node, members] : by_node) {
    per_node = std::max<int64_t>(per_node, static_cast<int64_t>(members.size()));
    for (size_t i = 0; members.size() > 1 && i < members.size(); ++i) {
      const Link hop = cluster.link(members[i], members[(i + 1) % members.size()]);
      slowest.bandwidth_bytes_per_s = std::min(slowest.bandwidth_bytes_per_s, hop.bandwidth_bytes_per_s);
      slowest.latency_s = std::max(slowest.latency_s, hop.latency_s);
    }
  }
  if (by_node.size() == 1) return ring_allreduce(p, slowest.bandwidth_bytes_per_s, slowest.latency_s);
  return hierarchical_allreduce(static_cast<int64_t>(by_node.size()), per_node, slowest,
                                cluster.inter_node, concurrent_groups_per_node);
}

void BucketedAllReduce::launch() {
  const double start_s = std::max(bucket_ready_s_, stream_free_s_);
  stream_free_s_ = start_s + cost_.time_s(bucket_bytes_);
  bucket_bytes_ = 0;
  bucket_ready_s_ = 0;
}

void BucketedAllReduce::add_gradient(double ready_s, double bytes) {
  if (bytes <= 0) return;
  bucket_bytes_ += bytes;
  bucket_ready_s_ = std::max(bucket_ready_s_, ready_s);
  if (bucket_bytes_ >= bucket_cap_bytes_) launch();
}

double BucketedAllReduce::end_s() {
  if (bucket_bytes_ > 0) launch();
  return stream_free_s_;
}

}  // namespace hybridplan
