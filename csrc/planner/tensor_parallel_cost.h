// Tensor parallelism's cost terms (docs/tensor_parallel.md "In the cost model"). With degree t
// (Plan::tp), for a node with Node::tensor_parallel (nodes without it run whole on every rank of
// the TP group and cost what they cost without tensor parallelism; t = 1 changes nothing):
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

// ratio(t) above, of the node's backward (`backward`) or forward. 1 for a node without
// tensor_parallel or t = 1.
double tp_time_ratio(const Node& node, int64_t tp, bool backward);

// The parameter bytes one TP rank holds of the node (param_bytes for a node without
// tensor_parallel or t = 1).
int64_t tp_param_bytes(const Node& node, int64_t tp);

// The factor on the node's kept activations: 1 / t where activation_split, else 1.
double tp_activation_share(const Node& node, int64_t tp);

// The bytes of a tied parameter (graph.h TiedParams) one TP rank holds per copy: bytes / t
// (rounded up) when every node sharing it splits parameters (the tied weights are split
// alike, e.g. a vocab_rowwise embedding and a colwise_gather output projection), else bytes.
int64_t tp_tied_bytes(const Graph& graph, const TiedParams& tied, int64_t tp);

// The degrees >= 2 a plan of `graph` on `cluster` may take: the divisors of devices_per_node
// that divide every tensor_parallel node's max_degree (Plan::validate_fit's rules); empty when
// no node has tensor_parallel.
std::vector<int64_t> tp_degrees(const Graph& graph, const Cluster& cluster);

// The three collectives on a TP group of t devices (see above).
struct TpCollectives {
  AllReduceCost all_reduce, all_gather, reduce_scatter;
  const AllReduceCost& of(Collective op) const;
};
TpCollectives tp_collectives(const Cluster& cluster, int64_t tp);

// Applies the time and collective terms to node times at the batch of `batch_scale`
// (compute_cost.h batch_scale): forward_s / backward_s become the split time plus the
// collective, and times.forward_comm_s / backward_comm_s receive the collectives alone.
// No-op for tp = 1.
void apply_tensor_parallel(const Graph& graph, const TpCollectives& collectives, int64_t tp,
                           double batch_scale, NodeTimes& times);

}  // namespace hybridplan
