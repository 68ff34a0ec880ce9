// Optimizer step: after the gradients are reduced, every device updates the parameters it holds.
// The update is a few streaming passes over parameter-sized tensors, bound by memory bandwidth:
//   optimizer_step_s = param_bytes * bytes_touched_per_param_byte / device.memory_bandwidth
//   bytes touched per parameter byte (reads + writes of parameter, gradient and state):
//     sgd           read p, g; write p                       = 3
//     sgd_momentum  read p, g, m; write m, p                 = 5
//     adam          read p, g, m, v; write p, m, v           = 7
//   i.e. 3 + 2 k_opt; with mixed precision (a 16-bit Job::precision, memory_cost.h OptimizerState:
//   an fp32 master copy and fp32 state, r = 4 / the graph's dtype bytes): read g, the master
//   and the state, write them and the parameters cast back to the graph's dtype
//                   2 + 2 r (1 + k_opt)                      (Adam, fp16: 14, 28 B a parameter)
//   (a sharded plan's shards are fp32 masters gathered in the compute dtype: the same bytes
//   within one parameter copy, which the formula keeps)
// plus a fixed cost per parameter tensor (the optimizer's loop over its tensors: torch.optim's
// for-loop implementation, the default on CPU, pays it per tensor and state):
//   + param_tensors * Cluster runtime.optimizer_tensor_s_for(the Job's optimizer)
//                                                          (measured by calibrate; 0 if not)
// Graph nodes carry param_tensors when the profiler counted them (absent: 0 here). Measured on
// 2 CPU ranks before this term: branchy_cnn's 72 tensors took 0.26-0.42 ms per SGD-momentum step
// against 0.03 ms predicted from bandwidth alone.
// A device without memory_bandwidth_bytes_per_s in the cluster costs 0 for the bytes (the plan's
// `compute_model` says so); the devices of a step update concurrently, so a step pays the
// slowest device's update.
#pragma once
#include <cstdint>

#include "planner/costs/memory_cost.h"
#include "planner/documents/cluster.h"
#include "planner/documents/job.h"

namespace hybridplan {

double optimizer_bytes_touched_per_param_byte(const OptimizerState& optimizer);

// Seconds to update `param_bytes` of parameters in `param_tensors` tensors on one device.
// `sharded`: the tensors are shards (DTensors): the sharded per-tensor cost where measured
// (Runtime::optimizer_tensor_s_for), else the unsharded one.
double optimizer_step_s(const Cluster& cluster, const OptimizerState& optimizer, double param_bytes,
                        double param_tensors, bool sharded = false);

}  // namespace hybridplan
