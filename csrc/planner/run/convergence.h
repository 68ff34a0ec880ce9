// Statistical efficiency: epochs to reach the target accuracy as a function of the global
// batch B, and the end-to-end time to train.
//
// critical_batch (McCandlish et al., https://arxiv.org/abs/1812.06162):
//   epochs(B) = epochs_min * (1 + B / critical_batch)
// with a critical batch that grows during the run, B_crit(p) for progress p in [0, 1] (the
// fraction of the epochs_min work done; log-linear between the trajectory's points, constant
// beyond its ends), each bit of progress costs epochs_min * (1 + B / B_crit(p)) dp, so a phase
// [p0, p1] run at batch B takes
//   epochs(B, p0, p1) = epochs_min * ((p1 - p0) + B * integral_p0^p1 dp / B_crit(p))
// and the whole run at one B: epochs_min * (1 + B * mean over p of 1 / B_crit(p)).
// table: points (B_i, E_i), B ascending, interpolated piecewise-linearly in log B:
//   epochs(B) = E_i + (E_{i+1} - E_i) * (ln B - ln B_i) / (ln B_{i+1} - ln B_i),  B_i <= B <= B_{i+1}
//   clamped outside the table: E_0 below B_0, E_last above B_last (we do not extrapolate a
//   measurement). Piecewise-linear interpolation is monotone wherever the points are.
// time to train:
//   time_to_train_s = epochs(B) * (samples_per_epoch / B) * step_s
// A plan trains on full global batches only (each replica and micro-batch has a fixed size), so
// the executor's data is one stream of epochs and a step takes its next B samples: an epoch is
// samples_per_epoch / B steps, fractional, with no partial last batch
// (python/hybridplan/convergence/tradeoff.py measures steps to target on the same stream).
#pragma once
#include <cstdint>

#include "planner/documents/job.h"

namespace hybridplan {

// Epochs to target at global batch `global_batch`; 0 when the job has no convergence model.
double epochs_to_target(const Convergence& convergence, double global_batch);

// critical_batch model: the epochs of progress [p0, p1] at `global_batch` (formula above).
double phase_epochs(const Convergence& convergence, double global_batch, double p0, double p1);

// integral over [p0, p1] of 1 / B_crit(p) (the constant critical batch when there is no
// trajectory).
double integral_inverse_critical_batch(const Convergence& convergence, double p0, double p1);

// Steps per epoch: samples_per_epoch / global_batch (fractional: no partial batch).
double steps_per_epoch(int64_t samples_per_epoch, int64_t global_batch);

// epochs * steps_per_epoch * step_s.
double time_to_train_s(double epochs, int64_t samples_per_epoch, int64_t global_batch,
                       double step_s);

}  // namespace hybridplan
