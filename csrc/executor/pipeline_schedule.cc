#include "executor/pipeline_schedule.h"

#include <algorithm>

#include "common/error.h"

namespace hybridplan {

std::vector<PipelinePass> stage_passes(Schedule schedule, int64_t stage, int64_t num_stages,
                                       int64_t num_microbatches) {
  if (num_stages < 1 || stage < 0 || stage >= num_stages) {
    throw InputError("pipeline stage must be in 0..num_stages-1 (got stage " + std::to_string(stage) +
                     " of " + std::to_string(num_stages) + ")");
  }
  if (num_microbatches < 1) {
    throw InputError("num_microbatches must be >= 1 (got " + std::to_string(num_microbatches) + ")");
  }
  std::vector<PipelinePass> passes;
  const int64_t m = num_microbatches;
  if (schedule == Schedule::kGpipe) {
    for (int64_t i = 0; i < m; ++i) passes.push_back({PassKind::kForward, i});
    for (int64_t i = m - 1; i >= 0; --i) passes.push_back({PassKind::kBackward, i});
    return passes;
  }
  if (schedule != Schedule::k1F1B) {
    throw InputError(std::string("a pipeline schedule must be gpipe or 1f1b (got ") +
                     schedule_name(schedule) + ")");
  }
  const int64_t warmup = std::min(num_stages - 1 - stage, m);
  int64_t next_forward = 0;
  int64_t next_backward = 0;
  for (; next_forward < warmup; ++next_forward) passes.push_back({PassKind::kForward, next_forward});
  while (next_forward < m) {
    passes.push_back({PassKind::kForward, next_forward++});
    passes.push_back({PassKind::kBackward, next_backward++});
  }
  while (next_backward < m) passes.push_back({PassKind::kBackward, next_backward++});
  return passes;
}

std::string passes_to_string(const std::vector<PipelinePass>& passes) {
  std::string out;
  for (const PipelinePass& p : passes) {
    if (!out.empty()) out += ' ';
    out += (p.kind == PassKind::kForward ? 'F' : 'B') + std::to_string(p.microbatch);
  }
  return out;
}

}  // namespace hybridplan
