#include "planner/simulations/placement_simulation.h"

#include <algorithm>
#include <queue>

#include "common/error.h"
#include "planner/costs/compute_cost.h"

namespace hybridplan {
namespace {

// Kahn's algorithm (graph.h) over `succs` taking the ready node with the highest level first.
std::vector<NodeIndex> highest_level_first(const std::vector<std::vector<NodeIndex>>& succs,
                                           const std::vector<std::vector<NodeIndex>>& preds,
                                           const std::vector<double>& node_s,
                                           const std::vector<NodeIndex>& topo_of_succs) {
  const size_t n = succs.size();
  // level(v) = node_s(v) + max over successors level(w): walk a topological order backwards.
  std::vector<double> level(n, 0.0);
  for (auto it = topo_of_succs.rbegin(); it != topo_of_succs.rend(); ++it) {
    double tail_s = 0;
    for (NodeIndex w : succs[*it]) tail_s = std::max(tail_s, level[w]);
    level[*it] = node_s[*it] + tail_s;
  }
  const auto later = [&](NodeIndex a, NodeIndex b) {  // true: b runs before a
    if (level[a] != level[b]) return level[a] < level[b];
    return a > b;
  };
  std::vector<NodeIndex> order = kahn_order(succs, preds, later);
  HP_INTERNAL_ASSERT(order.size() == n, "graph is not a DAG (was it finalized?)");
  return order;
}

}  // namespace

PlacementOrder placement_priority_order(const Graph& graph, const NodeTimes& times) {
  const size_t n = graph.nodes.size();
  HP_INTERNAL_ASSERT(graph.topo_order.size() == n, "Graph::finalize() was not called");
  HP_INTERNAL_ASSERT(times.forward_s.size() == n, "node times for another graph");
  std::vector<NodeIndex> reverse_topo(graph.topo_order.rbegin(), graph.topo_order.rend());
  PlacementOrder order;
  order.forward = highest_level_first(graph.succs, graph.preds, times.forward_s, graph.topo_order);
  order.backward = highest_level_first(graph.preds, graph.succs, times.backward_s, reverse_topo);
  return order;
}

void fill_local_links(const Cluster& cluster, const std::vector<DeviceIndex>& devices,
                      LocalLinks& links) {
  const auto m = static_cast<int64_t>(devices.size());
  links.num_devices = m;
  links.latency_s.assign(m * m, 0.0);
  links.seconds_per_byte.assign(m * m, 0.0);
  for (int64_t a = 0; a < m; ++a) {
    for (int64_t b = 0; b < m; ++b) {
      if (a == b) continue;
      const Link link = cluster.link(devices[a], devices[b]);
      links.latency_s[a * m + b] = link.latency_s;
      links.seconds_per_byte[a * m + b] = 1.0 / link.bandwidth_bytes_per_s;
    }
  }
}

namespace {

// One pass of the list schedule: nodes in `order`, each on its device once the device is free
// and every input has arrived (producer finish + transfer). `inputs_of[v]` are the edges feeding
// v in this pass and `producer(e)` the node at their far end: (in_edges, src) forward, and
// (out_edges, dst) backward, where gradients flow along reversed edges with the same bytes.
// Returns the pass's makespan; adds every cross-device transfer to transfer_s.
template <typename Producer>
double list_schedule_pass(const Graph& graph, const std::vector<NodeIndex>& order,
                          const std::vector<std::vector<int32_t>>& inputs_of, Producer producer,
                          const std::vector<double>& node_s, const std::vector<int32_t>& assignment,
                          const LocalLinks& links, double bytes_scale, std::vector<double>& finish_s,
                          std::vector<double>& device_free_s, double& transfer_s) {
  device_free_s.assign(links.num_devices, 0.0);
  double makespan_s = 0;
  for (NodeIndex v : order) {
    const int32_t d = assignment[v];
    double ready_s = device_free_s[d];
    for (int32_t k : inputs_of[v]) {
      const NodeIndex u = producer(graph.edges[k]);
      const double xfer_s =
          links.transfer_s(assignment[u], d, scaled_bytes(graph.edges[k].bytes, bytes_scale));
      transfer_s += xfer_s;
      ready_s = std::max(ready_s, finish_s[u] + xfer_s);
    }
    finish_s[v] = ready_s + node_s[v];
    device_free_s[d] = finish_s[v];
    makespan_s = std::max(makespan_s, finish_s[v]);
  }
  return makespan_s;
}

}  // namespace

PlacementTimes simulate_placement(const Graph& graph, const PlacementOrder& order,
                                  const std::vector<int32_t>& assignment, const LocalLinks& links,
                                  const NodeTimes& node_times, double bytes_scale,
                                  PlacementScratch& scratch) {
  const size_t n = graph.nodes.size();
  scratch.forward_finish_s.assign(n, 0.0);
  scratch.backward_finish_s.assign(n, 0.0);
  PlacementTimes times;
  times.forward_s = list_schedule_pass(
      graph, order.forward, graph.in_edges, [](const Edge& e) { return e.src; }, node_times.forward_s,
      assignment, links, bytes_scale, scratch.forward_finish_s, scratch.device_free_s, times.transfer_s);
  times.backward_s = list_schedule_pass(
      graph, order.backward, graph.out_edges, [](const Edge& e) { return e.dst; }, node_times.backward_s,
      assignment, links, bytes_scale, scratch.backward_finish_s, scratch.device_free_s, times.transfer_s);
  return times;
}

}  // namespace hybridplan
