// The order in which one pipeline stage runs its micro-batches' forward and backward passes.
// Torch-free, so schedules are tested as plain sequences.
//
// The order is the planner's (planner/pipeline_schedule.h, pipeline_operation), so the executor
// runs exactly the schedule whose length the cost model predicted.
// GPipe (Huang et al. 2019, https://arxiv.org/abs/1811.06965): all forwards, then all backwards.
//   stage 0: F0 F1 F2 F3 .  .  .  .  .  .  B0 B1 B2 B3
//   stage 1: .  F0 F1 F2 F3 .  .  .  B0 B1 B2 B3
// 1F1B (PipeDream-Flush, Narayanan et al. 2021, https://arxiv.org/abs/2006.09503): stage s of S
// runs min(S - 1 - s, M) warm-up forwards, then alternates one forward and one backward, then
// drains the remaining backwards. At most S - s micro-batches are in flight on stage s.
//   stage 0: F0 F1 .  .  B0 F2 .  B1 F3 .  B2 .  B3
//   stage 1: .  F0 B0 F1 B1 .  F2 B2 .  F3 B3
// Both run every micro-batch's forward before its backward and process micro-batches in the
// same order on every stage, so blocking receives matched by asynchronous sends never deadlock.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/plan.h"

namespace hybridplan {

enum class PassKind { kForward, kBackward };

struct PipelinePass {
  PassKind kind = PassKind::kForward;
  int64_t microbatch = 0;
  bool operator==(const PipelinePass&) const = default;
};

// Passes of `stage` (0..num_stages-1) for `num_microbatches` micro-batches under `schedule`
// (kGpipe or k1F1B). Throws InputError for out-of-range arguments or Schedule::kNone.
std::vector<PipelinePass> stage_passes(Schedule schedule, int64_t stage, int64_t num_stages,
                                       int64_t num_microbatches);

// "F0 F1 B1 B0": compact form for messages and tests.
std::string passes_to_string(const std::vector<PipelinePass>& passes);

}  // namespace hybridplan
