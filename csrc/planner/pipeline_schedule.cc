#include "planner/pipeline_schedule.h"

#include <algorithm>

#include "common/error.h"
#include "planner/compute_cost.h"

namespace hybridplan {

void pipeline_stage_costs(const Graph& graph, const std::vector<int32_t>& assignment,
                          int64_t num_stages, const NodeTimes& micro_times, double bytes_scale,
                          double action_s, PipelineStages& stages) {
  stages.forward_s.assign(num_stages, action_s);
  stages.backward_s.assign(num_stages, action_s);
  stages.boundary_bytes.assign(num_stages > 1 ? num_stages - 1 : 0, 0.0);
  stages.boundary_tensors.assign(stages.boundary_bytes.size(), 0.0);
  const size_t n = graph.nodes.size();
  for (size_t v = 0; v < n; ++v) {
    const int32_t s = assignment[v];
    stages.forward_s[s] += micro_times.forward_s[v];
    stages.backward_s[s] += micro_times.backward_s[v];
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
      const double scaled = scaled_bytes(bytes, bytes_scale);
      stages.boundary_bytes[s] += scaled;
      stages.boundary_tensors[s] += 1;
      if (last_stage < num_stages - 1) {
        stages.boundary_bytes[last_stage] -= scaled;
        stages.boundary_tensors[last_stage] -= 1;
      }
    }
  }
  for (size_t b = 1; b < stages.boundary_bytes.size(); ++b) {
    stages.boundary_bytes[b] += stages.boundary_bytes[b - 1];
    stages.boundary_tensors[b] += stages.boundary_tensors[b - 1];
  }
}

std::vector<PipelinePass> stage_passes(Schedule schedule, PipelineShape shape, int64_t stage) {
  const int64_t m = shape.num_microbatches;
  const int64_t num_stages = shape.num_stages;
  if (num_stages < 1 || stage < 0 || stage >= num_stages) {
    throw InputError("pipeline stage must be in 0..num_stages-1 (got stage " +
                     std::to_string(stage) + " of " + std::to_string(num_stages) + ")");
  }
  if (m < 1) throw InputError("num_microbatches must be >= 1 (got " + std::to_string(m) + ")");
  std::vector<PipelinePass> passes;
  passes.reserve(2 * m);
  const auto forward = [&](int64_t i) { passes.push_back({PassKind::kForward, i}); };
  const auto backward = [&](int64_t i) { passes.push_back({PassKind::kBackward, i}); };
  switch (schedule) {
    case Schedule::kGpipe:  // F0..F(M-1), B0..B(M-1)
      for (int64_t i = 0; i < m; ++i) forward(i);
      for (int64_t i = 0; i < m; ++i) backward(i);
      return passes;
    case Schedule::k1F1B: {  // warm-up forwards, F(warmup+j) B(j) pairs, cool-down backwards
      const int64_t warmup = std::min(num_stages - stage - 1, m);
      for (int64_t i = 0; i < warmup; ++i) forward(i);
      for (int64_t j = 0; j < m - warmup; ++j) {
        forward(warmup + j);
        backward(j);
      }
      for (int64_t i = m - warmup; i < m; ++i) backward(i);
      return passes;
    }
    case Schedule::kNone:
      break;
  }
  throw InputError(std::string("a pipeline schedule must be gpipe or 1f1b (got ") +
                   schedule_name(schedule) + ")");
}

std::string passes_to_string(const std::vector<PipelinePass>& passes) {
  std::string out;
  for (const PipelinePass& p : passes) {
    if (!out.empty()) out += ' ';
    out += (p.kind == PassKind::kForward ? 'F' : 'B') + std::to_string(p.microbatch);
  }
  return out;
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
  scratch.passes.resize(num_stages);
  for (int64_t s = 0; s < num_stages; ++s) {
    scratch.passes[s] = stage_passes(schedule, {.num_stages = num_stages, .num_microbatches = m}, s);
  }
  int64_t remaining = num_stages * 2 * m;
  double length_s = 0;
  while (remaining > 0) {
    int64_t progressed = 0;
    for (int64_t s = 0; s < num_stages; ++s) {
      const std::vector<PipelinePass>& passes = scratch.passes[s];
      int64_t& op = scratch.next_op[s];
      double free_s = 0;  // the stage is free when its previous operation finished
      if (op > 0) {
        const PipelinePass& prev = passes[op - 1];
        free_s = (prev.kind == PassKind::kForward ? scratch.forward_finish_s
                                                  : scratch.backward_finish_s)[s * m + prev.microbatch];
      }
      for (; op < 2 * m; ++op, ++progressed, --remaining) {
        const bool is_forward = passes[op].kind == PassKind::kForward;
        const int64_t i = passes[op].microbatch;
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
