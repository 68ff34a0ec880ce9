#include "planner/costs/optimizer_cost.h"

#include <algorithm>

namespace hybridplan {

double optimizer_bytes_touched_per_param_byte(const OptimizerState& optimizer) {
  const auto k = static_cast<double>(optimizer_state_copies(optimizer.optimizer));
  return optimizer.mixed_precision() ? 2 + 2 * optimizer.master_ratio * (1 + k) : 3 + 2 * k;
}

double optimizer_step_s(const Cluster& cluster, const OptimizerState& optimizer, double param_bytes,
                        double param_tensors, bool sharded) {
  const double bandwidth = cluster.device.memory_bandwidth_bytes_per_s;
  const Runtime& runtime = cluster.runtime;
  const double tensor_s = runtime.optimizer_tensor_s_for(optimizer_name(optimizer.optimizer), sharded);
  const double per_tensor_s = std::max(0.0, param_tensors) * tensor_s;
  if (bandwidth <= 0 || param_bytes <= 0) return per_tensor_s;
  return param_bytes * optimizer_bytes_touched_per_param_byte(optimizer) / bandwidth +
         per_tensor_s;
}

}  // namespace hybridplan
