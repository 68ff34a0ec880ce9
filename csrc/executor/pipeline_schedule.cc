#include "executor/pipeline_schedule.h"

#include "common/error.h"
#include "planner/pipeline_schedule.h"

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
  if (schedule != Schedule::kGpipe && schedule != Schedule::k1F1B) {
    throw InputError(std::string("a pipeline schedule must be gpipe or 1f1b (got ") +
                     schedule_name(schedule) + ")");
  }
  // The planner's definition (planner/pipeline_schedule.h) is the one the cost model simulated;
  // running the same order here keeps predicted and executed schedules identical.
  std::vector<PipelinePass> passes;
  for (int64_t op = 0; op < 2 * num_microbatches; ++op) {
    bool is_forward = false;
    int64_t microbatch = 0;
    pipeline_operation(schedule, num_stages, stage, num_microbatches, op, is_forward, microbatch);
    passes.push_back({is_forward ? PassKind::kForward : PassKind::kBackward, microbatch});
  }
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
