#include "planner/costs/compute_cost.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "common/error.h"

namespace hybridplan {
namespace {

double between(double t0, double b0, double t1, double b1, double b) {
  return t0 + (t1 - t0) * (b - b0) / (b1 - b0);
}

// The node's points for one pass (forward or backward), sorted by batch.
std::vector<CurvePoint> curve_of(const Graph& graph, const Node& node, double Node::*pass_s,
                                 double BatchTime::*point_s) {
  std::vector<CurvePoint> points;
  points.reserve(node.batch_times.size() + 1);
  for (const BatchTime& p : node.batch_times) {
    points.push_back({static_cast<double>(p.batch_size), p.*point_s});
  }
  points.push_back({static_cast<double>(graph.profiled.batch_size), node.*pass_s});
  std::sort(points.begin(), points.end(),
            [](const CurvePoint& a, const CurvePoint& b) { return a.batch < b.batch; });
  return points;
}

std::string describe(const Graph& graph, double floor_s) {
  std::set<int64_t> sizes{graph.profiled.batch_size};
  for (const Node& n : graph.nodes)
    for (const BatchTime& p : n.batch_times) sizes.insert(p.batch_size);
  std::ostringstream os;
  if (sizes.size() > 1) {
    os << "measured at batch sizes";
    for (int64_t b : sizes) os << (b == *sizes.begin() ? " " : ", ") << b;
    os << " (piecewise linear, clamped extrapolation)";
  } else if (floor_s > 0) {
    os << "one batch size (" << graph.profiled.batch_size << "): per-call floor " << floor_s
       << " s from device.call_floor_s";
  } else {
    os << "one batch size (" << graph.profiled.batch_size
       << "): linear in the batch (the cluster gives no device.call_floor_s)";
  }
  return os.str();
}

}  // namespace

double batch_scale(const Graph& graph, double batch_samples) {
  return batch_samples / static_cast<double>(graph.profiled.batch_size);
}

double curve_time_s(const std::vector<CurvePoint>& points, double batch, double floor_s) {
  HP_INTERNAL_ASSERT(!points.empty(), "a curve needs a point");
  const CurvePoint& first = points.front();
  const CurvePoint& last = points.back();
  if (points.size() == 1) {
    const double floor = std::min(floor_s, first.seconds);
    return floor + (first.seconds - floor) * batch / first.batch;
  }
  if (batch < first.batch) {
    const double line = between(first.seconds, first.batch, points[1].seconds, points[1].batch, batch);
    return std::clamp(line, first.seconds * batch / first.batch, first.seconds);
  }
  if (batch > last.batch) {
    const CurvePoint& before = points[points.size() - 2];
    const double line = between(before.seconds, before.batch, last.seconds, last.batch, batch);
    return std::clamp(line, last.seconds, last.seconds * batch / last.batch);
  }
  const auto hi = std::lower_bound(points.begin(), points.end(), batch,
                                   [](const CurvePoint& p, double b) { return p.batch < b; });
  if (hi->batch == batch) return hi->seconds;
  const auto lo = hi - 1;
  return between(lo->seconds, lo->batch, hi->seconds, hi->batch, batch);
}

double NodeTimes::total_s() const {
  double total = 0;
  for (size_t v = 0; v < forward_s.size(); ++v) total += forward_s[v] + backward_s[v];
  return total;
}

ComputeModel::ComputeModel(const Graph& graph, const Cluster& cluster)
    : floor_s_(cluster.device.call_floor_s), description_(describe(graph, cluster.device.call_floor_s)) {
  forward_.reserve(graph.nodes.size());
  backward_.reserve(graph.nodes.size());
  for (const Node& node : graph.nodes) {
    forward_.push_back(curve_of(graph, node, &Node::forward_s, &BatchTime::forward_s));
    backward_.push_back(curve_of(graph, node, &Node::backward_s, &BatchTime::backward_s));
  }
}

NodeTimes ComputeModel::at_batch(double batch_samples) const {
  NodeTimes t;
  t.batch = batch_samples;
  t.forward_s.reserve(forward_.size());
  t.backward_s.reserve(backward_.size());
  for (size_t v = 0; v < forward_.size(); ++v) {
    t.forward_s.push_back(curve_time_s(forward_[v], batch_samples, floor_s_));
    t.backward_s.push_back(curve_time_s(backward_[v], batch_samples, floor_s_));
  }
  return t;
}

std::vector<int64_t> default_profile_batch_sizes(int64_t batch) {
  std::vector<int64_t> sizes;
  for (int64_t size = batch / 2; size >= 1; size = (size == 2 || size == 3) ? 1 : size / 2) {
    sizes.push_back(size);
    if (size == 1) break;
  }
  std::reverse(sizes.begin(), sizes.end());
  return sizes;
}

double single_device_compute_s(const ComputeModel& model, double batch_samples) {
  return model.at_batch(batch_samples).total_s();
}

}  // namespace hybridplan
