// Placement simulation: one replica's forward and backward pass when every node is placed on one
// of the replica's mp devices (the paper's model parallelism: branches run concurrently).
//
// Model (deterministic list schedule with a static priority order, HLFET):
// - Priority: a node's "level" is the longest path from it to a sink counting node times only
//   (forward: forward_s along edges; backward: backward_s along reversed edges). The order is
//   Kahn's topological order that always takes the ready node of highest level (ties: smaller
//   node index). Times are the nodes' times at the batch evaluated (compute_cost.h), so the
//   order is computed per batch size (the evaluator keeps it).
// - Each device runs its nodes one at a time in that order. A node starts when its device is
//   free and all its inputs have arrived:
//     start(v)  = max(device_free(d(v)), max over edges u->v of finish(u) + xfer(u, v))
//     xfer(u,v) = 0 on the same device (or 0 bytes), else latency + bytes / bandwidth of
//                 Cluster::link(mesh[0][d(u)], mesh[0][d(v)])
//   Transfers are delays: links are not exclusive resources (no contention). Each edge is its
//   own transfer (two consumers on another device receive the value twice), as when each
//   submodule moves its inputs to its device.
// - The backward pass runs the same way on the reversed graph with backward_s, after the whole
//   forward pass (the loss needs every output): compute_s = forward makespan + backward makespan.
// - transfer_s reports the SUM of all cross-device transfer times of the step (forward
//   activations and backward gradients), not only those on the critical path: it says how much
//   communication the placement causes; the makespan already contains what is exposed.
#pragma once
#include <cstdint>
#include <vector>

#include "planner/costs/compute_cost.h"
#include "planner/documents/cluster.h"
#include "planner/documents/graph.h"

namespace hybridplan {

struct PlacementOrder {
  std::vector<NodeIndex> forward;   // HLFET order of the forward DAG
  std::vector<NodeIndex> backward;  // HLFET order of the reversed DAG (backward_s levels)
};

PlacementOrder placement_priority_order(const Graph& graph, const NodeTimes& times);

// Point-to-point costs between a replica's local devices: latency_s and 1/bandwidth per pair.
struct LocalLinks {
  int64_t num_devices = 0;
  std::vector<double> latency_s;          // [a * num_devices + b]
  std::vector<double> seconds_per_byte;   // 0 on the diagonal

  // latency + bytes / bandwidth, or 0 on the same device or for an empty transfer.
  double transfer_s(int32_t a, int32_t b, double bytes) const {
    if (a == b || bytes <= 0) return 0.0;
    const size_t k = static_cast<size_t>(a) * num_devices + b;
    return latency_s[k] + bytes * seconds_per_byte[k];
  }
};

// Fills `links` for the devices of one replica (a mesh row), reusing its storage.
void fill_local_links(const Cluster& cluster, const std::vector<DeviceIndex>& devices,
                      LocalLinks& links);

struct PlacementTimes {
  double forward_s = 0;   // forward makespan
  double backward_s = 0;  // backward makespan (measured from the start of the backward pass)
  double transfer_s = 0;  // sum of cross-device transfer times (forward + backward)
};

// Reusable buffers; after simulate_placement, backward_finish_s[v] is when node v's backward
// (and so its gradient) finishes, measured from the start of the backward pass.
struct PlacementScratch {
  std::vector<double> forward_finish_s;
  std::vector<double> backward_finish_s;
  std::vector<double> device_free_s;
};

// The schedule for `assignment[v]` in 0..mp-1 with node times `times` and edge bytes scaled by
// `bytes_scale` (compute_cost.h: batch / profiled.batch_size).
PlacementTimes simulate_placement(const Graph& graph, const PlacementOrder& order,
                                  const std::vector<int32_t>& assignment, const LocalLinks& links,
                                  const NodeTimes& times, double bytes_scale,
                                  PlacementScratch& scratch);

}  // namespace hybridplan
