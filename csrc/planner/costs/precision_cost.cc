#include "planner/costs/precision_cost.h"

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

Problem in_job_precision(const Problem& problem, const std::string& source) {
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
  g.profiled.loss_backward_bytes = half(g.profiled.loss_backward_bytes, r);
  for (Node& n : g.nodes) {
    n.forward_s /= s;
    n.backward_s /= s;
    for (BatchTime& b : n.batch_times) {
      b.forward_s /= s;
      b.backward_s /= s;
    }
    n.param_bytes = half(n.param_bytes, r);
    n.output_bytes = half(n.output_bytes, r);
    n.saved_bytes = half(n.saved_bytes, r);
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
