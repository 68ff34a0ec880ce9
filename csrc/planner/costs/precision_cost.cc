#include "planner/costs/precision_cost.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"

namespace hybridplan {
namespace {

int64_t half(int64_t bytes, double ratio) {
  return bytes < 0 ? bytes : static_cast<int64_t>(std::llround(static_cast<double>(bytes) * ratio));
}

void convert_collectives(std::vector<TpCollective>& collectives, double ratio) {
  for (TpCollective& c : collectives) c.bytes = half(c.bytes, ratio);
}

void convert_split_times(std::vector<TpSplitTime>& times, double speedup) {
  for (TpSplitTime& t : times) {
    t.forward_s /= speedup;
    t.backward_s /= speedup;
  }
}

}  // namespace

bool converts_graph(const Problem& problem) {
  const std::optional<int64_t> bytes = dtype_bytes(problem.graph.profiled.dtype);
  return problem.job.mixed_precision() && bytes && *bytes == 4;
}

std::optional<double> compute_speedup(const Cluster& cluster, Precision precision) {
  for (const auto& [name, x] : cluster.device.compute_speedup) {
    if (name == precision_name(precision)) return x;
  }
  return std::nullopt;
}

PrecisionPolicy precision_policy(const Plan& plan) {
  return plan.mode == MpMode::kPlacement && plan.sharding != Sharding::kNone ? PrecisionPolicy::kFsdp
                                                                             : PrecisionPolicy::kAutocast;
}

bool records_autocast(const Problem& problem) {
  const Precision p = problem.job.precision;
  if (problem.graph.profiled.autocast_loss_backward_bytes.of(p) >= 0) return true;
  for (const Node& n : problem.graph.nodes) {
    if (n.autocast_saved_bytes.of(p) >= 0) return true;
  }
  return false;
}

std::string memory_model(const Problem& problem, PrecisionPolicy policy) {
  if (!converts_graph(problem)) return "";
  const std::string name = precision_name(problem.job.precision);
  if (policy == PrecisionPolicy::kFsdp) {
    return "kept activations at half the float32 profile's (FSDP2's MixedPrecisionPolicy computes "
           "in " + name + " throughout)";
  }
  if (!records_autocast(problem)) {
    return "kept activations estimated at half the float32 profile's: the graph has no autocast " +
           name + " recording (profile it again to measure what torch.autocast keeps)";
  }
  return "kept activations as profiled under torch.autocast in " + name +
         " (fp32 layer-norm inputs and loss, the weight copies)";
}

Problem in_job_precision(const Problem& problem, const std::string& source, PrecisionPolicy policy) {
  if (!converts_graph(problem)) return problem;
  const Precision precision = problem.job.precision;
  const std::optional<double> speedup = compute_speedup(problem.cluster, precision);
  if (!speedup) {
    throw_input_error(source, std::string("device.compute_speedup.") + precision_name(precision),
                      std::string("is needed to plan the job's precision \"") +
                          precision_name(precision) + "\" on graph \"" + problem.graph.name +
                          "\" (profiled in float32): measure it with `hybridplan calibrate` "
                          "(docs/calibration.md) or give the device's measured rate ratio",
                      "absent");
  }
  const double s = *speedup;
  const double r = static_cast<double>(precision_bytes(precision)) / 4.0;
  Problem out = problem;
  Graph& g = out.graph;
  g.profiled.dtype = precision_dtype(precision);
  g.profiled.input_bytes = half(g.profiled.input_bytes, r);
  const bool autocast = policy == PrecisionPolicy::kAutocast;
  const int64_t loss_autocast = g.profiled.autocast_loss_backward_bytes.of(precision);
  g.profiled.loss_backward_bytes = autocast && loss_autocast >= 0
                                       ? loss_autocast
                                       : half(g.profiled.loss_backward_bytes, r);
  for (Node& n : g.nodes) {
    n.forward_s /= s;
    n.backward_s /= s;
    for (BatchTime& b : n.batch_times) {
      b.forward_s /= s;
      b.backward_s /= s;
    }
    n.param_bytes = half(n.param_bytes, r);
    n.output_bytes = half(n.output_bytes, r);
    const int64_t saved_autocast = n.autocast_saved_bytes.of(precision);
    if (autocast && saved_autocast >= 0) {  // as recorded under torch.autocast (the header)
      n.saved_bytes = saved_autocast;
      n.fixed_saved_bytes = std::max<int64_t>(0, n.autocast_weight_copy_bytes.of(precision));
    } else {
      n.saved_bytes = half(n.saved_bytes, r);
    }
    n.backward_workspace_bytes = half(n.backward_workspace_bytes, r);
    n.split_held_bytes = half(n.split_held_bytes, r);
    n.selective_saved_bytes = half(n.selective_saved_bytes, r);
    if (n.tensor_parallel) {
      TensorParallel& tp = *n.tensor_parallel;
      tp.split_param_bytes = half(tp.split_param_bytes, r);
      if (tp.forward_collective) tp.forward_collective->bytes = half(tp.forward_collective->bytes, r);
      if (tp.backward_collective) tp.backward_collective->bytes = half(tp.backward_collective->bytes, r);
      convert_split_times(tp.split_times, s);
    }
    if (n.sequence_parallel) {
      SequenceParallel& sp = *n.sequence_parallel;
      convert_collectives(sp.forward_collectives, r);
      convert_collectives(sp.backward_collectives, r);
      convert_split_times(sp.split_times, s);
    }
  }
  for (Edge& e : g.edges) e.bytes = half(e.bytes, r);
  for (TiedParams& t : g.tied_params) t.bytes = half(t.bytes, r);
  return out;
}

double gradient_reduce_ratio(const Problem& problem) {
  return converts_graph(problem) ? 4.0 / static_cast<double>(precision_bytes(problem.job.precision))
                                 : 1.0;
}

}  // namespace hybridplan
