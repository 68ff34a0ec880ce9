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
//
// Sequence parallelism (Plan::sequence_parallel, with tp > 1; graph.h SequenceParallel;
// docs/tensor_parallel.md "Sequence parallelism"): Megatron-LM's split of the tokens between
// the TP regions over the same TP group (Korthikanti et al. 2022, arXiv 2205.05198). With it on,
// every node with sequence_parallel, by its role, at t = tp:
//
//   per_token    time forward_s(b) * sp_ratio_f(t), backward_s(b) * sp_ratio_b(t), sp_ratio(t)
//                from sequence_parallel.split_times exactly as ratio(t) above from
//                tensor_parallel.split_times (none measured: 1 / t); kept activations / t
//   gather       time unchanged (it runs whole on the gathered sequence)
//   colwise,     the TP split's time (above); its tensor_parallel forward_collective /
//   rowwise      backward_collective are not run: the lists below replace them
//   all roles    + the sum of forward_collectives after the forward and of
//                backward_collectives after the backward, each priced as the TP collectives
//                above (the same TP group, bytes(b) = bytes * b / profiled.batch_size):
//                  all_gather, reduce_scatter    (t-1)/t * bytes / bw +  (t-1) * alpha
//                  all_reduce                   2(t-1)/t * bytes / bw + 2(t-1) * alpha
//                (a collective with fixed_bytes, a parameter gradient's: bytes, whatever b),
//                on the critical path (inside forward_s / backward_s, and forward_comm_s /
//                backward_comm_s like the TP collectives; Prediction::tp_comm_s counts them)
//
// Everything else (nodes without sequence_parallel, parameters, stage boundaries) is as under
// tensor parallelism alone.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/costs/allreduce_cost.h"
#include "planner/costs/compute_cost.h"
#include "planner/documents/cluster.h"
#include "planner/documents/graph.h"

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
// receive the collectives alone (0 for the nodes that run whole). With `sequence_parallel`
// (a plan that sequence_parallel_refusal accepts), the nodes with sequence_parallel get the
// terms of "Sequence parallelism" above instead. No-op for tp = 1.
void apply_tensor_parallel(const Graph& graph, const TpCollectives& collectives, int64_t tp,
                           double batch_scale, NodeTimes& times, bool sequence_parallel = false);

// ---- sequence parallelism ----

// Why a plan with tp (> 1) may not turn sequence parallelism on for `graph`, as Plan::
// validate_fit's rule text ("must be false: ..."); nullopt when it may: the graph has a node
// with sequence_parallel, tp divides every such node's max_degree, and every "colwise" /
// "rowwise" one splits at tp (tp_split_mask; its TP collectives are what SP replaces).
std::optional<std::string> sequence_parallel_refusal(const Graph& graph, int64_t tp);

// sp_ratio(t) above of a "per_token" node's backward (`backward`) or forward at degree tp; 1 for
// any other node or tp <= 1.
double sp_time_ratio(const Node& node, int64_t tp, bool backward);

// The factor on the kept activations of each node under (tp, sequence_parallel):
// tp_activation_share at its tp_node_degrees degree, and 1 / tp for a "per_token" node under
// sequence parallelism. What memory_cost.h's activations are multiplied by.
std::vector<double> tp_activation_shares(const Graph& graph, int64_t tp, bool sequence_parallel);

}  // namespace hybridplan
