#include "planner/costs/memory_cost.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/units.h"
#include "planner/costs/compute_cost.h"

namespace hybridplan {

int64_t optimizer_state_copies(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::kSgd: return 0;
    case Optimizer::kSgdMomentum: return 1;
    case Optimizer::kAdam: return 2;
  }
  return 0;
}

int64_t in_flight_microbatches(Schedule schedule, int64_t num_microbatches, int64_t num_stages,
                               int64_t stage) {
  switch (schedule) {
    case Schedule::kNone: return 1;
    case Schedule::kGpipe: return num_microbatches;
    case Schedule::k1F1B: return std::min(num_microbatches, num_stages - stage);
    // Several stages per rank: the count depends on the rank's pass order; evaluate() and the
    // partition take it from peak_activation_bytes (pipeline_schedule.h). M bounds it.
    case Schedule::kInterleaved1F1B:
    case Schedule::kInterleavedZB:
    case Schedule::kZBV: return num_microbatches;
  }
  return 1;
}

double backward_workspace_bytes(const Graph& graph, NodeIndex v, double scale) {
  const Node& node = graph.nodes[v];
  double bytes = 0;
  if (node.backward_workspace_bytes >= 0) {
    const int64_t fixed = std::min(node.backward_workspace_bytes, node.param_bytes);
    bytes = static_cast<double>(fixed) + scaled_bytes(node.backward_workspace_bytes - fixed, scale);
  } else {
    int64_t gradients = node.output_bytes;
    for (int32_t e : graph.in_edges[v]) gradients += graph.edges[e].bytes;
    bytes = scaled_bytes(gradients, scale);
  }
  if (!graph.topo_order.empty() && graph.topo_order.back() == static_cast<int32_t>(v)) {
    bytes = std::max(bytes, scaled_bytes(graph.profiled.loss_backward_bytes, scale));
  }
  return bytes;
}

double OptimizerState::copies() const {
  const auto k = static_cast<double>(optimizer_state_copies(optimizer));
  return mixed_precision() ? master_ratio * (1 + k) : k;
}

double OptimizerState::shard_copies() const {
  const auto k = static_cast<double>(optimizer_state_copies(optimizer));
  return (mixed_precision() ? master_ratio : 1.0) * (1 + k);
}

OptimizerState optimizer_state(const Job& job, const Graph& graph, const std::string& source) {
  OptimizerState out;
  out.optimizer = job.optimizer;
  if (!job.mixed_precision()) return out;
  const std::optional<int64_t> bytes = dtype_bytes(graph.profiled.dtype);
  if (!bytes || *bytes > 4) {
    throw_input_error(source, "precision",
                      "needs a graph profiled in float32 or a 16-bit dtype (float16, bfloat16): "
                      "graph \"" + graph.name + "\" has profiled.dtype \"" +
                          graph.profiled.dtype + "\"" + (bytes ? "" : " (an unknown dtype)"),
                      std::string("\"") + precision_name(job.precision) + "\"");
  }
  // an fp32 master copy and fp32 state per parameter of the compute dtype (a float32 graph is
  // priced at the precision's bytes: precision_cost.h)
  out.master_ratio = 4.0 / static_cast<double>(precision_bytes(job.precision));
  return out;
}

double parameter_state_bytes(double param_bytes, const OptimizerState& optimizer,
                             const ShardedState& state) {
  const double shards =
      optimizer.shard_copies() * param_bytes / static_cast<double>(std::max<int64_t>(1, state.dp));
  switch (state.sharding) {
    case Sharding::kNone: return param_bytes * (2 + optimizer.copies());
    case Sharding::kZero2:
      if (state.pipeline || state.accumulating) return 2 * param_bytes + shards;
      return param_bytes + shards + state.largest_unit_bytes;
    case Sharding::kZero3: {
      const double units = (state.overlapped ? 3 : 2) - (state.accumulating ? 1 : 0);
      return (state.accumulating ? param_bytes : 0.0) + shards + units * state.largest_unit_bytes;
    }
  }
  return param_bytes * (2 + optimizer.copies());
}

int64_t device_memory_bytes(int64_t param_bytes, double activation_bytes, int64_t in_flight,
                            const OptimizerState& optimizer, double transient_bytes,
                            const ShardedState& state) {
  // In double, saturated at 2^62: activations scaled to a large batch and many micro-batches in
  // flight can exceed int64 (a cast of such a double is undefined); no device has 2^62 bytes,
  // so the plan is infeasible either way, and sums of two such values still fit.
  constexpr double kSaturated = 4611686018427387904.0;  // 2^62
  const double bytes = parameter_state_bytes(static_cast<double>(param_bytes), optimizer, state) +
                       std::ceil(activation_bytes * static_cast<double>(in_flight)) +
                       std::ceil(transient_bytes);
  return bytes < kSaturated ? static_cast<int64_t>(bytes) : static_cast<int64_t>(kSaturated);
}

std::string memory_infeasible_reason(MpMode mode, int64_t local_device, DeviceIndex global_device,
                                     int64_t need_bytes, int64_t have_bytes) {
  const std::string what = mode == MpMode::kPipeline ? "stage " : "device ";
  return what + std::to_string(local_device) + " (global device " + std::to_string(global_device) +
         ") needs " + format_bytes(static_cast<double>(need_bytes)) + " > " +
         format_bytes(static_cast<double>(have_bytes)) + " (over by " +
         format_bytes(static_cast<double>(need_bytes - have_bytes)) + ")";
}

}  // namespace hybridplan
