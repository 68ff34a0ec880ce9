// Pipeline schedule: one replica split into S = mp contiguous stages (stage s = the nodes with
// assignment s; stages never decrease along an edge), the per-replica batch b split into M
// micro-batches of b/M samples.
//
// Per micro-batch, stage s takes F_s = action_s + sum of its nodes' forward times and
// B_s = action_s + sum of their backward times at b/M samples (compute_cost.h: a micro-batch of
// 1 costs more than 1/b of the batch; action_s is the runtime's fixed cost per schedule action,
// Cluster runtime.action_s_for(schedule)). Between stages s and s+1 every value produced on a stage
// <= s and consumed on a stage > s crosses the boundary (values needed later are forwarded
// stage to stage), counted once per producing node:
//   boundary_bytes[s] = sum over nodes u with stage(u) <= s < max stage of u's consumers of
//                       max bytes of u's out-edges to later stages  (at b/M samples)
//   boundary_tensors[s] = the number of such values (each is its own message)
//   p2p_s[s] = boundary_tensors[s] * latency + boundary_bytes[s] / bandwidth  of
//              Cluster::link(mesh[0][s], mesh[0][s+1])
// and the same bytes go back as gradients. A transfer is a delay on that link (no contention).
// Each tensor pays the latency: torch.distributed.pipelining sends every tensor of a stage's
// output as its own P2POp (batch_isend_irecv). Measured on 2 CPU ranks (Gloo): 4 tensors across
// the boundary instead of 1 cost 0.42 ms more per micro-batch of 1F1B (M = 32, 8-wide Linears).
//
// Both schedules are simulated as event schedules: each stage runs its list of operations in
// order; an operation starts when the stage is free and its input is there:
//   F(s,i) needs F(s-1,i) finished + p2p_s[s-1];  B(s,i) needs B(s+1,i) finished + p2p_s[s]
//   (the last stage's B(S-1,i) needs its own F(S-1,i)).
//
// GPipe (https://arxiv.org/abs/1811.06965): all forwards, then all backwards (flush).
//   S=3, M=4, F=1, B=2, no transfer:
//   stage 0 |F0F1F2F3            B0B0B1B1B2B2B3B3|
//   stage 1 |  F0F1F2F3      B0B0B1B1B2B2B3B3    |
//   stage 2 |    F0F1F2F3B0B0B1B1B2B2B3B3        |
//
// 1F1B / PipeDream-flush (https://arxiv.org/abs/2006.09503): stage s runs min(S-s-1, M)
// warm-up forwards, then alternates one forward and one backward, then cools down with the
// remaining backwards. Same length as GPipe here, but at most min(M, S-s) micro-batches of
// activations are alive on stage s instead of M (memory_cost.h).
//   stage 0 |F0F1F2        B0B0F3B1B1  B2B2  B3B3|
//   stage 1 |  F0F1    B0B0F2B1B1F3B2B2  B3B3    |
//   stage 2 |    F0B0B0F1B1B1F2B2B2F3B3B3        |
//   (tests/cpp/planner/test_pipeline_schedule.cc checks these finish times.)
//
// compute_s = the schedule's length (last operation's finish); bubble_s = compute_s -
// M * (F_s + B_s) of the busiest stage; transfer_s = M * 2 * sum_s p2p_s[s] (every micro-batch
// sends activations forward and gradients back over each boundary), informative only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/cluster.h"
#include "planner/compute_cost.h"
#include "planner/graph.h"
#include "planner/plan.h"

namespace hybridplan {

// One boundary's transfer per micro-batch on `link` (the p2p_s formula above): every tensor
// pays the latency, the bytes the bandwidth.
inline double boundary_p2p_s(const Link& link, double tensors, double bytes) {
  return tensors * link.latency_s + bytes / link.bandwidth_bytes_per_s;
}

// Per-micro-batch stage costs, reusable between calls.
struct PipelineStages {
  std::vector<double> forward_s;       // F_s, size S
  std::vector<double> backward_s;      // B_s, size S
  std::vector<double> boundary_bytes;  // bytes crossing s|s+1 per micro-batch, size S-1
  std::vector<double> boundary_tensors;  // values (messages) crossing s|s+1, size S-1
};

// Fills `stages` for `assignment` (stage per node, 0..num_stages-1) with the nodes' times at the
// micro-batch (`micro_times`, compute_cost.h) and boundary bytes scaled by `bytes_scale`
// ((b/M) / profiled.batch_size); every forward and backward action also pays `action_s`
// (Cluster runtime.action_s_for(schedule): the schedule's own value where calibrated).
void pipeline_stage_costs(const Graph& graph, const std::vector<int32_t>& assignment,
                          int64_t num_stages, const NodeTimes& micro_times, double bytes_scale,
                          double action_s, PipelineStages& stages);

struct PipelineTimes {
  double compute_s = 0;
  double bubble_s = 0;
  double transfer_s = 0;
};

// One schedule action of a stage: the forward or the backward pass of one micro-batch.
enum class PassKind { kForward, kBackward };

struct PipelinePass {
  PassKind kind = PassKind::kForward;
  int64_t microbatch = 0;
  bool operator==(const PipelinePass&) const = default;
};

// The shape of one replica's pipeline. A struct rather than two int64_t arguments, so that a
// caller cannot swap the stage count and the micro-batch count silently.
struct PipelineShape {
  int64_t num_stages = 1;
  int64_t num_microbatches = 1;
};

// The schedule as data: the passes stage `stage` runs, in order, for one training step. The one
// definition of GPipe and 1F1B: the simulator below and the C++ executor both read it, and
// torch.distributed.pipelining's ScheduleGPipe / Schedule1F1B run the same orders (a parity
// test holds them together). Throws InputError for Schedule::kNone, a stage outside
// 0..num_stages-1 or a count < 1.
std::vector<PipelinePass> stage_passes(Schedule schedule, PipelineShape shape, int64_t stage);

// "F0 F1 B0 B1": compact form for messages and tests.
std::string passes_to_string(const std::vector<PipelinePass>& passes);

struct PipelineScratch {
  std::vector<std::vector<PipelinePass>> passes;  // per stage, from stage_passes
  std::vector<double> forward_finish_s;   // [s * M + i]
  std::vector<double> backward_finish_s;  // [s * M + i]
  std::vector<int64_t> next_op;           // per stage
  // After simulate_pipeline: when stage s starts the backward of its last micro-batch, i.e.
  // when its accumulated gradients start to become final (all-reduce can begin).
  std::vector<double> last_backward_start_s;
};

// Simulates GPipe or 1F1B. forward_s/backward_s: F_s, B_s per micro-batch; p2p_s: size S-1.
PipelineTimes simulate_pipeline(Schedule schedule, int64_t num_microbatches,
                                const std::vector<double>& forward_s,
                                const std::vector<double>& backward_s,
                                const std::vector<double>& p2p_s, PipelineScratch& scratch);

}  // namespace hybridplan
