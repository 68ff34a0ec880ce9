#include "planner/optimizer_cost.h"

namespace hybridplan {

int64_t optimizer_bytes_touched_per_param_byte(Optimizer optimizer) {
  switch (optimizer) {
    case Optimizer::kSgd: return 3;
    case Optimizer::kSgdMomentum: return 5;
    case Optimizer::kAdam: return 7;
  }
  return 3;
}

double optimizer_step_s(const Cluster& cluster, Optimizer optimizer, double param_bytes) {
  const double bandwidth = cluster.device.memory_bandwidth_bytes_per_s;
  if (bandwidth <= 0 || param_bytes <= 0) return 0.0;
  return param_bytes * static_cast<double>(optimizer_bytes_touched_per_param_byte(optimizer)) / bandwidth;
}

}  // namespace hybridplan
