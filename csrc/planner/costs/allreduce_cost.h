// Gradient all-reduce cost of one data-parallel group, and its overlap with the backward pass.
//
// Groups: the DP group of local device (placement) or stage (pipeline) k is {mesh[r][k] : r};
// it all-reduces only the gradient bytes of the nodes assigned to k.
//
// Every collective here costs fixed_s + per_byte_s * bytes (AllReduceCost):
// - ring (all members on one node), Patarasuk & Yuan 2009, as in NCCL/Gloo:
//     t = 2(p-1)/p * bytes / bw + 2(p-1) * alpha
//   bw is the slowest hop of the ring (with a pairwise bandwidth matrix, e.g. a DGX-1 cube mesh,
//   a ring runs at its slowest hop), alpha the largest hop latency, both of
//   Cluster::allreduce_link (the calibrated collective link where the cluster gives one).
//   The ring is the one the collective library runs (Cluster::collectives):
//     NCCL: the order of the node's members that maximises the slowest hop (NCCL searches the
//           topology for its best ring; exact by a bottleneck Hamiltonian-cycle search over the
//           members of one node, ties broken by the larger sum of hop bandwidths);
//     Gloo: rank order, i.e. the group's members in mesh (replica) order.
// - hierarchical (members on n > 1 nodes, at most g per node), as Horovod/NCCL do:
//     intra-node reduce-scatter  (g-1)/g * bytes / bw_intra + (g-1) * alpha_intra
//     inter-node all-reduce of each 1/g shard, g shards at once:
//                                2(n-1)/n * (bytes/g) / (bw_inter / (g * G)) + 2(n-1) * alpha_inter
//     intra-node all-gather      (g-1)/g * bytes / bw_intra + (g-1) * alpha_intra
//   inter_node bandwidth is the node's injection bandwidth, shared by the g shard rings of each
//   of the G groups that reduce concurrently across nodes from that node (G = the number of DP
//   groups with gradient bytes that span nodes and have a member there; all are assumed to
//   overlap, which is pessimistic when their backward passes end at different times).
//
// Overlap (DDP buckets, https://arxiv.org/abs/2006.15704): gradients become ready during the
// backward pass in reverse order; they are packed into buckets in the order they become ready by
// the one bucket policy (bucket_policy.h: DDP's 1 MiB first bucket, then 25 MiB; a bucket closes
// once it holds its cap); a bucket is reduced when its last gradient is ready and the previous
// bucket's reduction is done (one communication stream):
//     start_k = max(ready_k, end_{k-1}),  end_k = start_k + t(bytes_k)
// Only the part that ends after the backward pass is exposed: exposed = max(0, end_last - end_bwd).
#pragma once
#include <cstdint>
#include <vector>

#include "planner/costs/bucket_policy.h"
#include "planner/documents/cluster.h"

namespace hybridplan {

struct AllReduceCost {
  double fixed_s = 0;     // latency terms
  double per_byte_s = 0;  // bandwidth terms
  // 0 for no bytes: nothing is reduced.
  double time_s(double bytes) const { return bytes > 0 ? fixed_s + per_byte_s * bytes : 0.0; }
};

// ring: 2(p-1)/p * bytes / bandwidth + 2(p-1) * latency; zero cost for p <= 1.
AllReduceCost ring_allreduce(int64_t p, double bandwidth_bytes_per_s, double latency_s);

// hierarchical over `num_nodes` nodes with `per_node` members each (formula above).
AllReduceCost hierarchical_allreduce(int64_t num_nodes, int64_t per_node, const Link& intra,
                                     const Link& inter, int64_t concurrent_groups_per_node);

// The order in which the collective library runs a ring over `members` (global devices of one
// node, in rank order): NCCL's best ring (see above; exact up to kMaxExactRingMembers members,
// a greedy nearest-neighbour ring beyond), Gloo's rank order.
constexpr int64_t kMaxExactRingMembers = 16;
std::vector<DeviceIndex> ring_order(const Cluster& cluster, const std::vector<DeviceIndex>& members);

// The cost for the group `devices` (global indices in rank order) on `cluster`: ring when on one
// node, hierarchical otherwise. `concurrent_groups_per_node` is G above (>= 1). When `rings` is
// given it receives the members in the order the rings run (node by node).
AllReduceCost group_allreduce(const Cluster& cluster, const std::vector<DeviceIndex>& devices,
                              int64_t concurrent_groups_per_node,
                              std::vector<DeviceIndex>* rings = nullptr);

// Sharded data parallelism's collectives (docs/sharding.md), over a ring of p members:
//   all-gather / reduce-scatter:  (p-1)/p * bytes / bw + (p-1) * alpha
// where bytes is the unsharded size (each member sends and receives p-1 shards of bytes/p),
// bw the ring's slowest hop and alpha its largest latency, both of the kind's link
// (Cluster::collective_link: the calibrated all-gather or reduce-scatter link, else the
// all-reduce one). A group on several nodes runs one ring through them (as NCCL does for these
// collectives), whose inter-node hops get the node's injection bandwidth / G (G as above).
AllReduceCost ring_shard_collective(int64_t p, double bandwidth_bytes_per_s, double latency_s);
AllReduceCost group_shard_collective(const Cluster& cluster, const std::vector<DeviceIndex>& devices,
                                     Collective kind, int64_t concurrent_groups_per_node);

// Bucketed all-reduce overlapped with backward: feed gradients in the order they become
// ready, then end_s() gives when the last bucket's reduction finishes (0 if no bytes).
class BucketedAllReduce {
 public:
  BucketedAllReduce() = default;
  BucketedAllReduce(AllReduceCost cost, BucketCaps caps) : cost_(cost), caps_(caps) {}

  void add_gradient(double ready_s, double bytes);
  double end_s();  // flushes the last partial bucket

 private:
  void launch();
  AllReduceCost cost_;
  BucketCaps caps_;
  int64_t launched_ = 0;
  double bucket_bytes_ = 0;
  double bucket_ready_s_ = 0;
  double stream_free_s_ = 0;
};

}  // namespace hybridplan
