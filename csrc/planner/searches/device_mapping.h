// Device mapping: which global devices form each replica (Plan::mesh) and in which order.
//
// A placement replica, driven by one process, stays inside a node (mp divides
// devices_per_node), and so does a pipeline whose mp divides devices_per_node; the question is
// then how to cut a node's devices into groups of mp. Every node is cut the same way. A grouping
// is scored
//   group score    = (slowest link between two group members, sum of member-to-member bandwidth)
//   grouping score = (min over groups of the slowest link, sum over groups of the bandwidth sums)
// compared lexicographically, and the best grouping of the node's devices wins (all groupings are
// enumerated while there are at most kMaxGroupings of them, else groups are picked greedily).
// Inside a group the order is the one whose consecutive links (stage s -> s+1 of a pipeline) are
// fastest: maximise the slowest consecutive link, then their sum (all mp! orders for mp <= 8).
// Replica r lives on node r / (devices_per_node / mp) and takes that node's groups in turn, so
// replicas fill whole nodes before the next node is used. On a DGX-1 (hybrid cube-mesh NVLink)
// mp = 4 gives the two fully NVLink-connected quads {0,1,2,3} and {4,5,6,7}.
//
// A pipeline may also span nodes (Megatron-LM's pipelines across nodes): mp a multiple of
// devices_per_node, each replica k = mp / devices_per_node whole nodes. Replica r takes nodes
// r*k .. r*k+k-1, its pipeline ranks node by node, and on every node the node's devices in their
// best pipeline order (best_local_groups of one group of the whole node), so consecutive stages
// on one node share its fastest links and the k-1 stage boundaries between nodes use the
// inter-node link (Cluster::link).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/documents/cluster.h"

namespace hybridplan {

struct DeviceMapping {
  std::vector<std::vector<DeviceIndex>> mesh;  // mesh[replica][local] = global device index
  std::string note;                            // which devices and why, for Plan::device_mapping_note
  double slowest_link_bytes_per_s = 0;         // slowest link between two devices of one replica
};

// dp * mp devices of `cluster`, dp * mp <= num_devices, mp dividing devices_per_node or (a
// pipeline spanning nodes) a multiple of it.
//
// With tensor parallelism (tp > 1; Plan::tp), every position is a TP group of tp consecutive
// devices of one node, starting at a multiple of tp: the mapping above runs on the node's
// devices_per_node / tp groups as devices (group g is devices g*tp .. g*tp+tp-1, linked to group
// h as device g*tp is to h*tp), and mesh entries are the groups' first devices. dp * mp * tp
// devices, tp dividing devices_per_node, mp * tp dividing it or a multiple of it (a pipeline
// spanning mp * tp / devices_per_node nodes, their TP groups in the best pipeline order).
DeviceMapping map_devices(const Cluster& cluster, int64_t dp, int64_t mp, int64_t tp = 1);

// The best `count` disjoint groups of `mp` local devices of one node, each in pipeline order
// (see above). Exposed for tests.
std::vector<std::vector<int64_t>> best_local_groups(const Cluster& cluster, int64_t mp,
                                                    int64_t count);

}  // namespace hybridplan
