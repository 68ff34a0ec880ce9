// Tensor parallelism's cost terms (docs/tensor_parallel.md "In the cost model"). Under a plan's
// degree tp (Plan::tp) a node splits when tp_splits says so, and then runs at degree t = tp;
// every other node (no tensor_parallel, or a max_degree tp does not divide) runs whole on every
// rank of the TP group, t = 1, and costs what it costs without tensor parallelism (no
// collective). tp_node_degree gives each node's t, which the per-node terms below take:
//
//   time         forward_s(b) * ratio_f(t) and backward_s(b) * ratio_b(t) (compute_cost.h's time at
//                the batch b, times the plan's compute slowdown), where
//                  ratio(t) = the split_times entry at degree t / the node's time at the profiled
//                             batch, interpolated linearly in log2(t) between measured degrees
//                             with ratio(1) = 1;
//                  beyond the largest measured degree t_m: ratio(t_m) * t_m / t (the matrix
//                             products keep shrinking at the efficiency last measured); no
//                             split_times, or a node profiled at 0 s: 1 / t
//   collectives  forward_collective after the forward, backward_collective after the backward,
//                on a TP group (t consecutive devices of one node, the collective link of
//                Cluster::collective_link: calibrated Gloo links on "cpu" clusters), at
//                bytes(b) = bytes * b / profiled.batch_size, allreduce_cost.h's rings:
//                  all_reduce                   2(t-1)/t * bytes / bw + 2(t-1) * alpha
//                  all_gather, reduce_scatter    (t-1)/t * bytes / bw +  (t-1) * alpha
//                bw the ring's slowest hop and alpha its largest latency, on the slowest of the
//                node's devices_per_node / t aligned groups (every TP group starts at a multiple
//                of t; on a uniform node all are alike). Added to the node's forward or backward
//                time: the next op needs the result, so they are on the critical path.
//   memory       parameters per rank param_bytes - split_param_bytes * (1 - 1/t) (rounded up),
//                and with them the gradients, the optimizer state and the DP all-reduce bytes;
//                kept activations (saved_bytes or output_bytes, selective_saved_bytes) / t where
//                activation_split
#pragma once
#include <cstdint>
#include <vector>

#include "planner/allreduce_cost.h"
#include "planner/cluster.h"
#include "planner/compute_cost.h"
#include "planner/graph.h"

namespace hybridplan {

// Which nodes split at degree tp: the one rule (docs/tensor_parallel.md "In the plan"), on
// plain data so that the Python executor applies it too (hybridplan._C.tp_split_mask):
// node i splits when tp > 1, it has tensor_parallel (max_degrees[i] >= 1; 0 = none) and tp
// divides max_degrees[i], and every node of every tied group holding it (a parameter several
// nodes share: graph.h TiedParams) splits so too: a tied group splits as one or runs whole.
// Returns one flag per node; every tied index must name a node (0 .. size - 1).
std::vector<uint8_t> tp_split_mask(const std::vector<int64_t>& max_degrees,
                                   const std::vector<std::vector<NodeIndex>>& tied_groups,
                                   int64_t tp);
// tp_split_mask of a graph's nodes (max_degree of their tensor_parallel; tied_params).
std::vector<uint8_t> tp_split_mask(const Graph& graph, int64_t tp);

// The degree each node runs at under a plan's tp: tp where it splits (tp_split_mask), else 1
// (whole); what the per-node terms below take as `tp`.
std::vector<int64_t> tp_node_degrees(const Graph& graph, int64_t tp);

// ratio(t) above, of the node's backward (`backward`) or forward, at the degree `tp` the node
// runs at (tp_node_degrees). 1 for a node without tensor_parallel or t = 1.
double tp_time_ratio(const Node& node, int64_t tp, bool backward);

// The parameter bytes one TP rank holds of a node running at degree `tp` (tp_node_degrees;
// param_bytes for a node without tensor_parallel or t = 1).
int64_t tp_param_bytes(const Node& node, int64_t tp);

// The factor on the kept activations of a node running at degree `tp`: 1 / t where
// activation_split, else 1.
double tp_activation_share(const Node& node, int64_t tp);

// The bytes of a tied parameter (graph.h TiedParams) one TP rank holds per copy, its nodes
// running at `node_degrees` (tp_node_degrees): bytes / t (rounded up) when they split
// (tp_split_mask splits a tied group as one: the tied weights are split alike, e.g. a
// vocab_rowwise embedding and a colwise_gather output projection), else bytes.
int64_t tp_tied_bytes(const TiedParams& tied, const std::vector<int64_t>& node_degrees);

// The degrees >= 2 a plan of `graph` on `cluster` may take (Plan::validate_fit's rules): the
// divisors of devices_per_node at which at least one node splits (tp_split_mask); empty when
// no node has tensor_parallel.
std::vector<int64_t> tp_degrees(const Graph& graph, const Cluster& cluster);

// The three collectives on a TP group of t devices (see above).
struct TpCollectives {
  AllReduceCost all_reduce, all_gather, reduce_scatter;
  const AllReduceCost& of(Collective op) const;
};
TpCollectives tp_collectives(const Cluster& cluster, int64_t tp);

// The link a pipeline stage boundary's transfer per micro-batch behaves as, from the TP group
// whose first device is `from` to the one at `to`: each of the tp TP ranks sends the whole
// boundary tensor to its peer rank (stages exchange whole, replicated tensors). On one node
// every pair has its own link, as the groups' first devices do (Cluster::link); between nodes
// (a pipeline spanning nodes) the tp transfers share the node's inter-node link, its injection
// bandwidth (allreduce_cost.h): bandwidth / tp. tp = 1: Cluster::link.
Link tp_stage_link(const Cluster& cluster, DeviceIndex from, DeviceIndex to, int64_t tp);

// Applies the time and collective terms to node times at the batch of `batch_scale`
// (compute_cost.h batch_scale): the nodes that split at tp (tp_split_mask) get the split time
// plus the collective in forward_s / backward_s, and times.forward_comm_s / backward_comm_s
// receive the collectives alone (0 for the nodes that run whole). No-op for tp = 1.
void apply_tensor_parallel(const Graph& graph, const TpCollectives& collectives, int64_t tp,
                           double batch_scale, NodeTimes& times);

}  // namespace hybridplan
