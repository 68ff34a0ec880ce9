// Device mapping: which global devices form each replica (Plan::mesh) and in which order.
//
// Model parallelism stays inside a node (mp divides devices_per_node), so the question is how to
// cut a node's devices into groups of mp. Every node is cut the same way. A grouping is scored
//   group score    = (slowest link between two group members, sum of member-to-member bandwidth)
//   grouping score = (min over groups of the slowest link, sum over groups of the bandwidth sums)
// compared lexicographically, and the best grouping of the node's devices wins (all groupings are
// enumerated while there are at most kMaxGroupings of them, else groups are picked greedily).
// Inside a group the order is the one whose consecutive links (stage s -> s+1 of a pipeline) are
// fastest: maximise the slowest consecutive link, then their sum (all mp! orders for mp <= 8).
// Replica r lives on node r / (devices_per_node / mp) and takes that node's groups in turn, so
// replicas fill whole nodes before the next node is used. On a DGX-1 (hybrid cube-mesh NVLink)
// mp = 4 gives the two fully NVLink-connected quads {0,1,2,3} and {4,5,6,7}.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/cluster.h"

namespace hybridplan {

struct DeviceMapping {
  std::vector<std::vector<DeviceIndex>> mesh;  // mesh[replica][local] = global device index
  std::string note;                            // which devices and why, for Plan::device_mapping_note
  double slowest_link_bytes_per_s = 0;         // slowest link between two devices of one replica
};

// dp * mp devices of `cluster`, mp dividing devices_per_node, dp * mp <= num_devices.
//
// With tensor parallelism (tp > 1; Plan::tp), every position is a TP group of tp consecutive
// devices of one node, starting at a multiple of tp: the mapping above runs on the node's
// devices_per_node / tp groups as devices (group g is devices g*tp .. g*tp+tp-1, linked to group
// h as device g*tp is to h*tp), and mesh entries are the groups' first devices. dp * mp * tp
// devices, mp * tp dividing devices_per_node.
DeviceMapping map_devices(const Cluster& cluster, int64_t dp, int64_t mp, int64_t tp = 1);

// The best `count` disjoint groups of `mp` local devices of one node, each in pipeline order
// (see above). Exposed for tests.
std::vector<std::vector<int64_t>> best_local_groups(const Cluster& cluster, int64_t mp,
                                                    int64_t count);

}  // namespace hybridplan
