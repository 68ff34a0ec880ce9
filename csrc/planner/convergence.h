// Statistical efficiency: epochs to reach the target accuracy as a function of the global
// batch B, and the end-to-end time to train.
//
// critical_batch (McCandlish et al., https://arxiv.org/abs/1812.06162):
//   epochs(B) = epochs_min * (1 + B / critical_batch)
// table: points (B_i, E_i), B ascending, interpolated piecewise-linearly in log B:
//   epochs(B) = E_i + (E_{i+1} - E_i) * (ln B - ln B_i) / (ln B_{i+1} - ln B_i),  B_i <= B <= B_{i+1}
//   clamped outside the table: E_0 below B_0, E_last above B_last (we do not extrapolate a
//   measurement). Piecewise-linear interpolation is monotone wherever the points are.
// time to train:
//   time_to_train_s = epochs(B) * ceil(samples_per_epoch / B) * step_s
#pragma once
#include <cstdint>

#include "planner/job.h"

namespace hybridplan {

// Epochs to target at global batch `global_batch`; 0 when the job has no convergence model.
double epochs_to_target(const Convergence& convergence, double global_batch);

// Steps per epoch: ceil(samples_per_epoch / global_batch) (the last partial batch is a step).
int64_t steps_per_epoch(int64_t samples_per_epoch, int64_t global_batch);

// epochs * steps_per_epoch * step_s.
double time_to_train_s(double epochs, int64_t samples_per_epoch, int64_t global_batch,
                       double step_s);

}  // namespace hybridplan
