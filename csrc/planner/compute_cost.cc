#include "planner/compute_cost.h"

namespace hybridplan {

double batch_scale(const Graph& graph, double batch_samples) {
  return batch_samples / static_cast<double>(graph.profiled.batch_size);
}

double single_device_compute_s(const Graph& graph, double batch_samples) {
  const double scale = batch_scale(graph, batch_samples);
  double total_s = 0;
  for (const Node& node : graph.nodes) {
    total_s += scaled_time_s(node.forward_s + node.backward_s, scale);
  }
  return total_s;
}

}  // namespace hybridplan
