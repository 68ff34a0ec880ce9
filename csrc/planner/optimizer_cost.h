// Optimizer step: after the gradients are reduced, every device updates the parameters it holds.
// The update is a few streaming passes over parameter-sized tensors, bound by memory bandwidth:
//   optimizer_step_s = param_bytes * bytes_touched_per_param_byte / device.memory_bandwidth
//   bytes touched per parameter byte (reads + writes of parameter, gradient and state):
//     sgd           read p, g; write p                       = 3
//     sgd_momentum  read p, g, m; write m, p                 = 5
//     adam          read p, g, m, v; write p, m, v           = 7
// A device without memory_bandwidth_bytes_per_s in the cluster costs 0 here (the plan's
// `compute_model` says so); the devices of a step update concurrently, so a step pays the
// largest device's update.
#pragma once
#include <cstdint>

#include "planner/cluster.h"
#include "planner/job.h"

namespace hybridplan {

int64_t optimizer_bytes_touched_per_param_byte(Optimizer optimizer);

// Seconds to update `param_bytes` of parameters on one device of `cluster`.
double optimizer_step_s(const Cluster& cluster, Optimizer optimizer, double param_bytes);

}  // namespace hybridplan
