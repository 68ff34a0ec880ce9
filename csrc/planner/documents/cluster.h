// Cluster: devices and links (kind "hybridplan.cluster"). Global device index
// d = node * devices_per_node + local; devices of one node share the intra-node links.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hybridplan {

using Json = nlohmann::json;
using DeviceIndex = int64_t;  // global device index, 0..num_nodes*devices_per_node-1

struct DeviceSpec {
  std::string name;
  // "cuda" (an accelerator: a process drives several concurrently) or "cpu" (a CPU rank: the
  // devices one process drives run its work one after another, see placement_simulation.h).
  std::string type = "cuda";
  int64_t memory_bytes = 0;
  double peak_flops = 0;
  // Optional (0 = not given). Memory bandwidth prices the optimizer step (optimizer_cost.h);
  // call_floor_s is what one node's forward or backward pass costs however small its batch
  // (kernel launches, framework dispatch), used for graphs measured at one batch size only
  // (compute_cost.h). The plan says when either is missing.
  double memory_bandwidth_bytes_per_s = 0;
  double call_floor_s = 0;
  // Optional (JSON "compute_speedup": {"bf16": x, "fp16": y}; empty = none measured): how many
  // times faster the device computes a float32-profiled graph's nodes in that 16-bit dtype
  // (autocast) than in float32. `hybridplan calibrate` measures it on a CPU (the profiled
  // matmuls in each dtype); costs/precision_cost.h divides node times by it. Needed to plan a
  // 16-bit Job precision on a float32 graph.
  std::vector<std::pair<std::string, double>> compute_speedup;
};

struct Link {
  double bandwidth_bytes_per_s = 0;  // per direction
  double latency_s = 0;
};

// Which collective library the executor uses, which decides how a group is ordered into a ring
// (allreduce_cost.h): NCCL searches the node's topology for its best ring, Gloo follows rank
// order.
enum class CollectiveLibrary { kNccl, kGloo };

// The collectives the cost model prices: DDP's gradient all-reduce, and sharded data
// parallelism's parameter all-gather and gradient reduce-scatter (docs/sharding.md).
enum class Collective { kAllReduce, kAllGather, kReduceScatter };

// What the executor's runtime pays beyond compute and communication, measured by
// `hybridplan calibrate` on the machine itself (0 where not measured):
//   step_s        once per training step per process of a plan whose replicas synchronise
//                 gradients through a data-parallel wrapper (dp > 1: DDP's reducer, FSDP's or
//                 replicate's hooks, the step's bookkeeping around them); a plan of one
//                 replica has no wrapper and does not pay it (step_overhead_s)
//   action_s      per pipeline schedule action: one forward or one backward of one micro-batch
//                 on one stage (micro-batch slicing, p2p posting and waiting, autograd setup)
//   schedule_action_s  action_s measured per schedule ("gpipe", "1f1b"), where the runtime's
//                 schedules pay differently for an action: torch's ScheduleGPipe posts every
//                 send and receive on its own and leaves its sends in flight while it computes,
//                 Schedule1F1B posts a send with the next receive and waits for both. A schedule
//                 listed here uses its own value, any other action_s.
//   action_sample_s, schedule_action_sample_s  the part of an action's cost that grows with the
//                 micro-batch: seconds per sample of the micro-batch, beside action_s (the same
//                 scalar-or-per-schedule rule; unset: 0). Measured on transformer_lm's own 1x2
//                 pipelines (batch 32, 2 CPU ranks): GPipe's cost per action came out 2.0, 2.5,
//                 3.4 and 4.1 ms at 2, 4, 8 and 16 samples a micro-batch, so a fixed cost fitted
//                 at 2-4 samples priced 16-sample pipelines 17-22 % fast
//   optimizer_tensor_s  per parameter tensor per optimizer step: the optimizer's loop over its
//                 tensors (torch.optim's for-loop implementation on CPU), beyond the
//                 memory-bound update of the bytes (optimizer_cost.h)
//   sharded_optimizer_tensor_s  the same for a sharded parameter (a DTensor shard: every op of
//                 the update goes through DTensor's dispatch); unset (0): optimizer_tensor_s
//   optimizer_tensor_s_by_optimizer, sharded_optimizer_tensor_s_by_optimizer  the two measured
//                 per Job optimizer ("sgd", "sgd_momentum", "adam"): each dispatches its own
//                 number of ops per tensor (on 2 CPU ranks, sharded: SGD 14 us, SGD-momentum
//                 67 us, Adam 222 us a tensor). An optimizer listed uses its own value, any
//                 other the scalar
//   sharded_compute_slowdown  the fraction a sharded placement replica's compute adds to its
//                 step (0: none): each unit's collective makes the ranks meet, so every unit
//                 waits for the slower rank's compute since the last one, and the collectives'
//                 threads take core time from compute (on this CPU host aten::mm ran 14-19 %
//                 slower under zero2 than under DDP); it grows with the compute, not the bytes
//   selective_op_s  per aten op of a node recomputed selectively, per forward+backward:
//                 torch's selective activation checkpointing is a Python dispatch mode that sees
//                 every op of the forward and again of the recompute (Node::selective_ops)
//   shared_host_slowdown[k]: compute time multiplier when k processes of the job compute on one
//                 node at once (CPU ranks share cores, caches and memory bandwidth; GPUs: 1)
struct Runtime {
  double step_s = 0;
  double action_s = 0;
  double optimizer_tensor_s = 0;
  double sharded_optimizer_tensor_s = 0;
  double sharded_compute_slowdown = 0;
  double selective_op_s = 0;
  std::vector<std::pair<std::string, double>> schedule_action_s;  // (schedule name, seconds)
  double action_sample_s = 0;
  std::vector<std::pair<std::string, double>> schedule_action_sample_s;  // (schedule, s a sample)
  std::vector<std::pair<std::string, double>> optimizer_tensor_s_by_optimizer;  // (Job optimizer, s)
  std::vector<std::pair<std::string, double>> sharded_optimizer_tensor_s_by_optimizer;
  std::vector<std::pair<int64_t, double>> shared_host_slowdown;  // (processes, factor), k ascending

  // The cost per action of `schedule` ("gpipe", "1f1b"): its schedule_action_s entry, else
  // action_s.
  double action_s_for(const std::string& schedule) const;
  // The per-sample part of `schedule`'s action cost: its schedule_action_sample_s entry, else
  // action_sample_s.
  double action_sample_s_for(const std::string& schedule) const;
  // What one action of `schedule` costs on a micro-batch of `microbatch_samples`:
  // action_s_for + action_sample_s_for * samples (pipeline_schedule.h).
  double action_cost_s(const std::string& schedule, double microbatch_samples) const {
    return action_s_for(schedule) + action_sample_s_for(schedule) * microbatch_samples;
  }

  // The optimizer's fixed cost per parameter tensor for the Job optimizer `optimizer` ("sgd"):
  // its entry where measured, else the scalar; `sharded` (DTensor shards): the sharded entry,
  // else sharded_optimizer_tensor_s, else the unsharded value.
  double optimizer_tensor_s_for(const std::string& optimizer, bool sharded) const;

  // The fixed cost per step of a plan with `dp` replicas: step_s where dp > 1, else 0. The
  // executor wraps replicas in DDP (or shards or replicates them) only where there is more than
  // one; calibrate measures step_s as a data-parallel step's residual, and the tiny model's
  // one-replica pipelines over 1-32 micro-batches fit to a fixed cost of ~0 beside it
  // (docs/calibration.md).
  double step_overhead_s(int64_t dp) const { return dp > 1 ? step_s : 0.0; }

  // The multiplier for `processes` computing at once on a node: the table's entry for the
  // largest k <= processes (1 below the table).
  double slowdown(int64_t processes) const;
};

struct Cluster {
  std::string name;
  int64_t num_nodes = 1;
  int64_t devices_per_node = 1;
  DeviceSpec device;
  Link intra_node;  // used where bandwidth_matrix is empty
  // bandwidth_matrix[i][j]: bytes/s from local device i to j inside a node (0 on the diagonal).
  std::vector<std::vector<double>> bandwidth_matrix;
  Link inter_node;
  // Link parameters that make the ring formula reproduce the all-reduce the executor really
  // runs (calibrated: Gloo on loopback is not its p2p link); unset: the links above.
  std::optional<Link> intra_node_allreduce;
  std::optional<Link> inter_node_allreduce;
  // The same for sharded data parallelism's all-gather and reduce-scatter (the ring formulas of
  // allreduce_cost.h): "allgather" and "reduce_scatter" beside "allreduce". Gloo emulates
  // reduce-scatter with an all-reduce; the calibrated link carries that. Unset: the
  // all-reduce link of the same level.
  std::optional<Link> intra_node_allgather;
  std::optional<Link> intra_node_reduce_scatter;
  std::optional<Link> inter_node_allgather;
  std::optional<Link> inter_node_reduce_scatter;
  // Tensor parallelism's collectives as the executor runs them (DTensor: the collective, its
  // copies and the dispatch of the split layers' ops; calibrate's "intra_node.tp_allreduce"),
  // the link that makes the ring all-reduce formula reproduce one of them. A TP group is on one
  // node. Unset: the collective links above (tensor_parallel_cost.h).
  std::optional<Link> intra_node_tp_allreduce;
  CollectiveLibrary collectives = CollectiveLibrary::kNccl;
  Runtime runtime;
  Json sources = Json::array();  // citations for the numbers, carried through untouched
  Json measured;                 // calibration's raw points and fit residuals, carried through

  int64_t num_devices() const { return num_nodes * devices_per_node; }
  // Point-to-point link between two global devices (intra: matrix entry or intra_node).
  Link link(DeviceIndex a, DeviceIndex b) const;
  // The link the all-reduce of a group behaves as: the calibrated override where given.
  Link allreduce_link(DeviceIndex a, DeviceIndex b) const;
  // The link `kind` behaves as between two devices: its calibrated override, else
  // allreduce_link.
  Link collective_link(Collective kind, DeviceIndex a, DeviceIndex b) const;
  void validate(const std::string& source) const;
};

const char* collective_library_name(CollectiveLibrary library);  // "nccl" | "gloo"

Cluster cluster_from_json(const Json& j, const std::string& source);
Json cluster_to_json(const Cluster& c);
// A file path, or a preset name (planner/documents/presets.h) when no such file exists.
Cluster load_cluster(const std::string& path_or_preset);

}  // namespace hybridplan
