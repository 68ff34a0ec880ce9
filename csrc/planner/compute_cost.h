// Compute cost: how a node's profiled numbers change with the batch it runs at.
//
// Assumption (docs/formats.md "Graph"): times and activation sizes are measured for profiled.batch_size
// samples on one device and scale linearly with the batch; parameter bytes do not scale.
//   forward_s(b)  = forward_s  * b / profiled.batch_size
//   backward_s(b) = backward_s * b / profiled.batch_size
//   bytes(b)      = bytes      * b / profiled.batch_size     (output_bytes, edges[].bytes)
// Linear scaling ignores the poor utilisation of very small batches; for micro-batches much
// smaller than the profiled batch this is optimistic for pipelines.
#pragma once
#include <cstdint>

#include "planner/graph.h"

namespace hybridplan {

// The linear factor b / profiled.batch_size for a (micro-)batch of `batch_samples`.
double batch_scale(const Graph& graph, double batch_samples);

// profiled_s * scale: a node's forward or backward time at the batch of `scale`.
inline double scaled_time_s(double profiled_s, double scale) { return profiled_s * scale; }

// profiled_bytes * scale: activation or edge bytes at the batch of `scale`.
inline double scaled_bytes(int64_t profiled_bytes, double scale) {
  return static_cast<double>(profiled_bytes) * scale;
}

// Forward + backward of the whole graph on one device at `batch_samples`: the compute of a
// pure data-parallel replica (sum over nodes of (forward_s + backward_s) * scale).
double single_device_compute_s(const Graph& graph, double batch_samples);

}  // namespace hybridplan
