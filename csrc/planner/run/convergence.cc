#include "planner/run/convergence.h"

#include <cmath>

namespace hybridplan {
namespace {

// integral of exp(-(la + (lb - la) t)) over t in [t0, t1], times the segment's length in p.
double inverse_exponential_integral(double la, double lb, double t0, double t1, double length) {
  const double slope = lb - la;
  if (std::fabs(slope) < 1e-12) return std::exp(-la) * (t1 - t0) * length;
  return (std::exp(-la - slope * t0) - std::exp(-la - slope * t1)) / slope * length;
}

}  // namespace

double integral_inverse_critical_batch(const Convergence& c, double p0, double p1) {
  const auto& points = c.critical_batch_trajectory;
  if (points.empty()) return (p1 - p0) / c.critical_batch;
  double total = 0;
  // Below the first point and above the last the critical batch is constant.
  const double first = points.front().first, last = points.back().first;
  if (p0 < first) total += (std::min(p1, first) - p0) / points.front().second;
  if (p1 > last) total += (p1 - std::max(p0, last)) / points.back().second;
  for (size_t i = 1; i < points.size(); ++i) {
    const auto [pa, ba] = points[i - 1];
    const auto [pb, bb] = points[i];
    const double lo = std::max(p0, pa), hi = std::min(p1, pb);
    if (hi <= lo) continue;
    total += inverse_exponential_integral(std::log(ba), std::log(bb), (lo - pa) / (pb - pa),
                                          (hi - pa) / (pb - pa), pb - pa);
  }
  return total;
}

double phase_epochs(const Convergence& c, double global_batch, double p0, double p1) {
  return c.epochs_min * ((p1 - p0) + global_batch * integral_inverse_critical_batch(c, p0, p1));
}

double epochs_to_target(const Convergence& convergence, double global_batch) {
  switch (convergence.model) {
    case Convergence::Model::kNone:
      return 0.0;
    case Convergence::Model::kCriticalBatch:
      return phase_epochs(convergence, global_batch, 0.0, 1.0);
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

double steps_per_epoch(int64_t samples_per_epoch, int64_t global_batch) {
  return static_cast<double>(samples_per_epoch) / static_cast<double>(global_batch);
}

double time_to_train_s(double epochs, int64_t samples_per_epoch, int64_t global_batch,
                       double step_s) {
  return epochs * steps_per_epoch(samples_per_epoch, global_batch) * step_s;
}

}  // namespace hybridplan
