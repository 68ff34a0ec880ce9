#include "planner/convergence.h"

#include <cmath>

namespace hybridplan {

double epochs_to_target(const Convergence& convergence, double global_batch) {
  switch (convergence.model) {
    case Convergence::Model::kNone:
      return 0.0;
    case Convergence::Model::kCriticalBatch:
      return convergence.epochs_min * (1.0 + global_batch / convergence.critical_batch);
    case Convergence::Model::kTable: {
      const auto& points = convergence.points;
      if (points.empty()) return 0.0;
      if (global_batch <= points.front().first) return points.front().second;
      if (global_batch >= points.back().first) return points.back().second;
      size_t i = 1;
      while (points[i].first < global_batch) ++i;  // points[i-1].B < B <= points[i].B
      const auto& [b0, e0] = points[i - 1];
      const auto& [b1, e1] = points[i];
      const double t = (std::log(global_batch) - std::log(b0)) / (std::log(b1) - std::log(b0));
      return e0 + (e1 - e0) * t;
    }
  }
  return 0.0;
}

int64_t steps_per_epoch(int64_t samples_per_epoch, int64_t global_batch) {
  return (samples_per_epoch + global_batch - 1) / global_batch;
}

double time_to_train_s(double epochs, int64_t samples_per_epoch, int64_t global_batch,
                       double step_s) {
  return epochs * static_cast<double>(steps_per_epoch(samples_per_epoch, global_batch)) * step_s;
}

}  // namespace hybridplan
