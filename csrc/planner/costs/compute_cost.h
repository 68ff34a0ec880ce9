// Compute cost: a node's forward and backward time at any batch size. A micro-batch of 1 costs
// more than 1/b of a batch of b (kernel launches, framework dispatch, poor utilisation of small
// operands), so time is never silently linear in the batch.
//
// Measured curve: the node's profiled point (profiled.batch_size, forward_s, backward_s) plus its
// batch_times, sorted by batch. Between measured batch sizes b_i <= b <= b_j, piecewise linear:
//   t(b) = t_i + (t_j - t_i) * (b - b_i) / (b_j - b_i)
// Outside the measured range, the line through the two nearest points, clamped between flat
// (the nearest point's time) and proportional scaling (t_near * b / b_near):
//   b < b_first: t_first * b / b_first <= t(b) <= t_first
//   b > b_last:  t_last <= t(b) <= t_last * b / b_last
// so an extrapolated batch is never cheaper per sample than the measurements suggest, and never
// dearer than linear scaling from the nearest measurement.
//
// One batch size only (e.g. PipeDream imports): the per-call floor of the cluster's device,
// device.call_floor_s = f_half / peak for a device that reaches half its FLOP rate at f_half
// FLOPs per call (time = (f + f_half) / peak), anchored at the profiled time t0:
//   t(b) = floor + (t0 - floor) * b / b0,   floor = min(device.call_floor_s, t0)
// call_floor_s = 0 is linear scaling; the plan's `compute_model` says which model was used.
//
// Activation and edge bytes are sizes, exactly linear in the batch:
//   bytes(b) = bytes * b / profiled.batch_size
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/documents/cluster.h"
#include "planner/documents/graph.h"

namespace hybridplan {

// The linear factor b / profiled.batch_size for a (micro-)batch of `batch_samples` (bytes only).
double batch_scale(const Graph& graph, double batch_samples);

// profiled_bytes * scale: activation or edge bytes at the batch of `scale`.
inline double scaled_bytes(int64_t profiled_bytes, double scale) {
  return static_cast<double>(profiled_bytes) * scale;
}

// What `node` keeps for its backward at the batch of `scale`: its activation bytes, scaled, and
// its fixed_saved_bytes (autocast's weight copies, precision_cost.h), which the batch leaves as
// they are.
inline double kept_bytes(const Node& node, double scale) {
  return scaled_bytes(node.activation_bytes(), scale) + static_cast<double>(node.fixed_saved_bytes);
}

// One measured (or profiled) point of a node's curve.
struct CurvePoint {
  double batch = 0;
  double seconds = 0;
};

// t(b) from points sorted by batch (at least one), by the rules above; `floor_s` is used only
// when there is a single point.
double curve_time_s(const std::vector<CurvePoint>& points, double batch, double floor_s);

// Every node's forward and backward seconds at one batch size.
// A node's backward split in two for the zero-bubble schedules (pipeline_schedule.h) by the
// executor (executor/split_backward.py): I, the input gradient the previous stage waits for,
// and W, the weight gradient. A node outside its stage's input region (no path to it from a
// stage input that needs a gradient: every node of the first stage; stage_input_region) has no
// input gradient to compute: its plain backward runs in W and I is empty. Inside it, the split
// costs the plain backward plus Node::split_backward_extra_s (the split's own bookkeeping per
// micro-batch, which does not grow with the batch: a step-by-step LSTM's autograd nodes walked
// in Python; slowed like compute by `slowdown`), of which W takes the measured share
// (Node::weight_backward_fraction), else half for a node with parameters (a Linear's X^T dY
// and dY W^T are the same matrix product) and nothing for a node without.
struct SplitBackward {
  double input_s = 0;
  double weight_s = 0;
};
inline SplitBackward split_backward(const Node& node, double backward_s, double slowdown,
                                    bool in_input_region) {
  if (!in_input_region) return {0.0, backward_s};
  const double total =
      backward_s + (node.split_backward_extra_s > 0 ? node.split_backward_extra_s * slowdown : 0.0);
  const double share = node.weight_backward_fraction >= 0 ? node.weight_backward_fraction
                       : node.param_bytes > 0             ? 0.5
                                                          : 0.0;
  return {(1.0 - share) * total, share * total};
}

// What selective recompute adds to a node's backward beyond running its cheap ops again
// (Node::selective_recompute_fraction of its forward): torch's policy is a Python dispatch
// mode that sees each of the node's aten ops in the forward and again in the recompute,
//   selective_ops * runtime.selective_op_s
// per forward+backward (per micro-batch; the ops do not grow with the batch). 0 where either
// was not measured.
inline double selective_dispatch_s(const Node& node, const Runtime& runtime) {
  return node.selective_ops > 0 ? static_cast<double>(node.selective_ops) * runtime.selective_op_s
                                : 0.0;
}

struct NodeTimes {
  double batch = 0;
  std::vector<double> forward_s;
  std::vector<double> backward_s;
  // Under tensor parallelism (tensor_parallel_cost.h), the part of each node's forward_s /
  // backward_s that is its TP collective; empty without tensor parallelism.
  std::vector<double> forward_comm_s;
  std::vector<double> backward_comm_s;
  double total_s() const;  // sum of both, the single-device compute of the batch
};

// The compute model of one graph on one cluster's device: builds each node's curves once and
// answers node times at any batch. Cheap to query repeatedly for the same few batch sizes
// (the evaluator keeps what it asked for).
class ComputeModel {
 public:
  ComputeModel(const Graph& graph, const Cluster& cluster);

  NodeTimes at_batch(double batch_samples) const;
  // "measured at batch sizes 1, 2, 4, 8 (piecewise linear)" or "one batch size (64): per-call
  // floor 2e-05 s from device.call_floor_s" or "... linear (the cluster gives no call_floor_s)".
  const std::string& description() const { return description_; }

 private:
  std::vector<std::vector<CurvePoint>> forward_, backward_;  // per node, sorted by batch
  double floor_s_ = 0;
  std::string description_;
};

// The batch sizes a profile measures besides its example batch b, smallest first: halving b
// (rounding down; 3 halves to 1) down to 1, e.g. 32 -> 1, 2, 4, 8, 16 and 48 -> 1, 3, 6, 12, 24.
// The Python and C++ profilers both use this rule (tests/python hold Python's twin to it).
std::vector<int64_t> default_profile_batch_sizes(int64_t batch);

// Forward + backward of the whole graph on one device at `batch_samples`: the compute of a pure
// data-parallel replica.
double single_device_compute_s(const ComputeModel& model, double batch_samples);

}  // namespace hybridplan
