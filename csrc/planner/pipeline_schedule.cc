#include "planner/pipeline_schedule.h"

#include <algorithm>

#include "common/error.h"
#include "planner/compute_cost.h"

namespace hybridplan {

void pipeline_stage_costs(const Graph& graph, const std::vector<int32_t>& assignment,
                          int64_t num_stages, double microbatch_scale, PipelineStages& stages) {
  stages.forward_s.assign(num_stages, 0.0);
  stages.backward_s.assign(num_stages, 0.0);
  stages.boundary_bytes.assign(num_stages > 1 ? num_stages - 1 : 0, 0.0);
  const size_t n = graph.nodes.size();
  for (size_t v = 0; v < n; ++v) {
    const Node& node = graph.nodes[v];
    const int32_t s = assignment[v];
    stages.forward_s[s] += scaled_time_s(node.forward_s, microbatch_scale);
    stages.backward_s[s] += scaled_time_s(node.backward_s, microbatch_scale);
    // The value of v is sent once per boundary from its own stage to its last consumer's stage:
    // add its bytes to boundaries s..last-1 (a running sum over stages below does the range).
    int32_t last_stage = s;
    int64_t bytes = 0;
    for (int32_t k : graph.out_edges[v]) {
      const Edge& e = graph.edges[k];
      if (assignment[e.dst] > s) {
        last_stage = std::max(last_stage, assignment[e.dst]);
        bytes = std::max(bytes, e.bytes);
      }
    }
    if (last_stage > s) {
      const double scaled = scaled_bytes(bytes, microbatch_scale);
      stages.boundary_bytes[s] += scaled;
      if (last_stage < num_stages - 1) stages.boundary_bytes[last_stage] -= scaled;
    }
  }
  for (size_t b = 1; b < stages.boundary_bytes.size(); ++b) {
    stages.boundary_bytes[b] += stages.boundary_bytes[b - 1];
  }
}

void pipeline_operation(Schedule schedule, int64_t num_stages, int64_t stage,
                        int64_t num_microbatches, int64_t op, bool& is_forward,
                        int64_t& microbatch) {
  const int64_t m = num_microbatches;
  if (schedule != Schedule::k1F1B) {  // GPipe: F0..F(M-1), B0..B(M-1)
    is_forward = op < m;
    microbatch = is_forward ? op : op - m;
    return;
  }
  const int64_t warmup = std::min(num_stages - stage - 1, m);
  if (op < warmup) {
    is_forward = true;
    microbatch = op;
    return;
  }
  const int64_t steady_ops = 2 * (m - warmup);  // F(warmup+j), B(j) pairs
  const int64_t j = op - warmup;
  if (j < steady_ops) {
    is_forward = (j % 2 == 0);
    microbatch = is_forward ? warmup + j / 2 : j / 2;
    return;
  }
  is_forward = false;  // cool-down
  microbatch = (m - warmup) + (j - steady_ops);
}

namespace {

constexpr double kNotYet = -1.0;

// When operation (s, i) can start as far as its input is concerned; false if that input is not
// computed yet. F(s,i) needs F(s-1,i) + p2p; B(s,i) needs B(s+1,i) + p2p (last stage: F(s,i)).
bool input_ready_s(bool is_forward, int64_t s, int64_t i, int64_t num_stages, int64_t m,
                   const std::vector<double>& p2p_s, const PipelineScratch& scratch,
                   double& ready_s) {
  const std::vector<double>& ff = scratch.forward_finish_s;
  const std::vector<double>& bf = scratch.backward_finish_s;
  if (is_forward && s == 0) {
    ready_s = 0;
    return true;
  }
  if (is_forward) {
    ready_s = ff[(s - 1) * m + i] + p2p_s[s - 1];
    return ff[(s - 1) * m + i] != kNotYet;
  }
  if (s == num_stages - 1) {
    ready_s = ff[s * m + i];
    return ready_s != kNotYet;
  }
  ready_s = bf[(s + 1) * m + i] + p2p_s[s];
  return bf[(s + 1) * m + i] != kNotYet;
}

}  // namespace

PipelineTimes simulate_pipeline(Schedule schedule, int64_t num_microbatches,
                                const std::vector<double>& forward_s,
                                const std::vector<double>& backward_s,
                                const std::vector<double>& p2p_s, PipelineScratch& scratch) {
  const auto num_stages = static_cast<int64_t>(forward_s.size());
  const int64_t m = num_microbatches;
  HP_INTERNAL_ASSERT(num_stages >= 1 && m >= 1, "stages " << num_stages << ", micro-batches " << m);
  scratch.forward_finish_s.assign(num_stages * m, kNotYet);
  scratch.backward_finish_s.assign(num_stages * m, kNotYet);
  scratch.next_op.assign(num_stages, 0);
  scratch.last_backward_start_s.assign(num_stages, 0.0);

  // Advance every stage as far as its inputs allow, until all are done. Each sweep completes
  // at least one operation for a valid schedule (the dependency graph is acyclic).
  int64_t remaining = num_stages * 2 * m;
  double length_s = 0;
  while (remaining > 0) {
    int64_t progressed = 0;
    for (int64_t s = 0; s < num_stages; ++s) {
      int64_t& op = scratch.next_op[s];
      double free_s = 0;  // the stage is free when its previous operation finished
      if (op > 0) {
        bool prev_forward = false;
        int64_t prev_i = 0;
        pipeline_operation(schedule, num_stages, s, m, op - 1, prev_forward, prev_i);
        free_s = (prev_forward ? scratch.forward_finish_s : scratch.backward_finish_s)[s * m + prev_i];
      }
      for (; op < 2 * m; ++op, ++progressed, --remaining) {
        bool is_forward = false;
        int64_t i = 0;
        pipeline_operation(schedule, num_stages, s, m, op, is_forward, i);
        double ready_s = 0;
        if (!input_ready_s(is_forward, s, i, num_stages, m, p2p_s, scratch, ready_s)) break;
        const double start_s = std::max(ready_s, free_s);
        free_s = start_s + (is_forward ? forward_s[s] : backward_s[s]);
        (is_forward ? scratch.forward_finish_s : scratch.backward_finish_s)[s * m + i] = free_s;
        if (!is_forward) length_s = std::max(length_s, free_s);
        if (op == 2 * m - 1) scratch.last_backward_start_s[s] = start_s;
      }
    }
    HP_INTERNAL_ASSERT(progressed > 0, "pipeline schedule deadlocked");
  }

  PipelineTimes times;
  times.compute_s = length_s;
  double busiest_s = 0;
  for (int64_t s = 0; s < num_stages; ++s) busiest_s = std::max(busiest_s, forward_s[s] + backward_s[s]);
  times.bubble_s = std::max(0.0, length_s - static_cast<double>(m) * busiest_s);
  double p2p_total_s = 0;
  for (double t : p2p_s) p2p_total_s += t;
  times.transfer_s = static_cast<double>(m) * 2.0 * p2p_total_s;
  return times;
}

}  // namespace hybridplan
