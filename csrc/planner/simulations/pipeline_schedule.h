// Pipeline schedule: one replica split into S = mp contiguous stages (stage s = the nodes with
// assignment s; stages never decrease along an edge), the per-replica batch b split into M
// micro-batches of b/M samples.
//
// Per micro-batch, stage s takes F_s = action_s + sum of its nodes' forward times and
// B_s = action_s + sum of their backward times at b/M samples (compute_cost.h: a micro-batch of
// 1 costs more than 1/b of the batch; action_s is the runtime's cost per schedule action,
// Cluster runtime.action_cost_s(schedule, b/M): a fixed part and a part per sample). Between
// stages s and s+1 every value produced on a stage
// <= s and consumed on a stage > s crosses the boundary (values needed later are forwarded
// stage to stage), counted once per producing node:
//   boundary_bytes[s] = sum over nodes u with stage(u) <= s < max stage of u's consumers of
//                       max bytes of u's out-edges to later stages  (at b/M samples)
//   boundary_tensors[s] = the number of such values (each is its own message)
//   p2p_s[s] = boundary_tensors[s] * latency + boundary_bytes[s] / bandwidth  of
//              Cluster::link(mesh[0][s], mesh[0][s+1])
// and the same bytes go back as gradients, no two transfers sharing a link (no contention);
// when a transfer starts and who waits for it: simulate_pipeline below.
// Each tensor pays the latency: torch.distributed.pipelining sends every tensor of a stage's
// output as its own P2POp (batch_isend_irecv). Measured on 2 CPU ranks (Gloo): 4 tensors across
// the boundary instead of 1 cost 0.42 ms more per micro-batch of 1F1B (M = 32, 8-wide Linears).
//
// Every schedule is simulated as an event schedule: each stage (rank) runs its list of operations in
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
// Multi-stage schedules (Plan::virtual_stages v stages per rank, S = mp * v): the replica's
// model is cut into S stages and rank r runs several of them, so the fill and drain take
// (mp-1) stage-times of a stage v times smaller: the bubble fraction falls from (mp-1)/M to
// (mp-1)/(v M) (Megatron-LM's interleaved 1F1B, https://arxiv.org/abs/2104.04473), for v times
// as many boundary transfers. interleaved-1f1b, interleaved-zb and zbv follow torch's orders
// exactly (rank_passes). The zero-bubble schedules (https://arxiv.org/abs/2401.10241) split
// each backward into I (the input gradient the previous stage waits for) and W (the weight
// gradient, which nothing waits for, run late to fill the bubble). The profiler splits each
// node's backward alone: I + W is its plain backward plus the split's own cost per micro-batch,
// W its measured share of that (else half the backward of a node with parameters), and a node
// outside its stage's input region (a first stage has no input gradient to compute) runs its
// plain backward in W (compute_cost.h split_backward, stage_input_region below); what remains
// of the runtime's cost per pass is in the schedule's calibrated action_s.
//
// compute_s = the schedule's length (last operation's finish); bubble_s = compute_s -
// M * (F_s + B_s) of the busiest stage; transfer_s = M * 2 * sum_s p2p_s[s] (every micro-batch
// sends activations forward and gradients back over each boundary), informative only.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "planner/costs/compute_cost.h"
#include "planner/documents/cluster.h"
#include "planner/documents/graph.h"
#include "planner/documents/plan.h"

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
// (Cluster runtime.action_cost_s(schedule, b/M): the schedule's own values where calibrated).
void pipeline_stage_costs(const Graph& graph, const std::vector<int32_t>& assignment,
                          int64_t num_stages, const NodeTimes& micro_times, double bytes_scale,
                          double action_s, PipelineStages& stages);

// region[v] = 1 where node v lies in its stage's input region under the zero-bubble split
// (executor/split_backward.py): on a path from a stage input that needs a gradient. A value
// needs a gradient when a node with parameters is upstream of it (or its producer has some);
// v is in the region when such a value comes into it from another stage, or from a node in the
// region of its own stage. The first stage's inputs are the batch, so none of its nodes are.
// `carries` is scratch.
void stage_input_region(const Graph& graph, const std::vector<int32_t>& assignment,
                        std::vector<char>& carries, std::vector<char>& region);

struct PipelineTimes {
  double compute_s = 0;
  double bubble_s = 0;
  double transfer_s = 0;
};

// One schedule action: the forward (F) or backward (B) pass of one micro-batch on one stage; a
// zero-bubble schedule splits B into the input-gradient pass (I, what the previous stage waits
// for) and the weight-gradient pass (W, deferred to fill bubbles).
enum class PassKind { kForward, kBackward, kBackwardInput, kBackwardWeight };

struct PipelinePass {
  PassKind kind = PassKind::kForward;
  int64_t microbatch = 0;
  int64_t stage = 0;  // the stage the pass belongs to (several per rank in multi-stage schedules)
  bool operator==(const PipelinePass&) const = default;
};

// The shape of one replica's pipeline. A struct rather than two int64_t arguments, so that a
// caller cannot swap the stage count and the micro-batch count silently. num_ranks = 0 means
// one stage per rank (num_ranks = num_stages).
struct PipelineShape {
  int64_t num_stages = 1;
  int64_t num_microbatches = 1;
  int64_t num_ranks = 0;
  int64_t ranks() const { return num_ranks > 0 ? num_ranks : num_stages; }
};

// The schedule as data: the passes stage `stage` runs, in order, for one training step, for the
// single-stage schedules (GPipe, 1F1B): the C++ executor reads it. Throws InputError for any
// other schedule, a stage outside 0..num_stages-1 or a count < 1.
std::vector<PipelinePass> stage_passes(Schedule schedule, PipelineShape shape, int64_t stage);

// The passes local rank `rank` runs, in order, for any pipeline schedule: the one definition of
// every schedule's order, which the simulator below reads. GPipe and 1F1B: rank r runs stage r's
// stage_passes. interleaved-1f1b, interleaved-zb and zbv: torch.distributed.pipelining's
// ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble and ScheduleZBVZeroBubble orders
// (pipeline_order, ported: tests/python/test_schedule_parity.py holds them equal for every
// shape it tries), with stage s on rank stage_rank(schedule, ranks, s).
std::vector<PipelinePass> rank_passes(Schedule schedule, PipelineShape shape, int64_t rank);

// "F0 F1 B0 B1": compact form for messages and tests; a multi-stage pass also names its stage,
// "F0s2" (stage 2's forward of micro-batch 0), and I and W are the split backward.
std::string passes_to_string(const std::vector<PipelinePass>& passes);

// Peak bytes of activations a rank holds under its pass order: a stage's forward of a
// micro-batch adds activation_bytes[stage]; its backward (B), or its weight pass (W, when the
// backward is split: autograd keeps the graph for the weight gradients until then) frees it.
// A split backward also holds, from a micro-batch's I to its W, the output gradients of the
// stage's nodes with parameters, where W starts (executor/split_backward.py records them):
// split_held_bytes[stage] (empty: none). workspace_bytes[stage] (empty: none) is what a backward
// pass (B, or I) of the stage needs while it runs, above what is held: the peak is the largest of
// held + workspace at each backward pass and held after each forward. An I pass's own held output
// gradients are made inside its workspace (an I workspace counts those recorded before each
// node's backward: memory_cost.h), so they count from the next pass on (the pass itself needs
// the larger of the two). weight_workspace_bytes[stage] (empty: none) is what a W pass
// needs while it runs (a stage outside its input region runs its whole backward in W).
double peak_activation_bytes(const std::vector<PipelinePass>& passes,
                             const std::vector<double>& activation_bytes,
                             const std::vector<double>& split_held_bytes = {},
                             const std::vector<double>& workspace_bytes = {},
                             const std::vector<double>& weight_workspace_bytes = {});

// One step of a rank's program under torch's single-stage schedules (see simulate_pipeline):
// run a pass, post messages (sends and receives, in order), or wait until messages are done.
struct RankOp {
  enum Kind : uint8_t { kRun, kPost, kWait } kind = kRun;
  int32_t first = 0;  // kRun: the pass (index into the rank's passes); else into message_ops
  int32_t count = 0;  // kPost / kWait: how many message_ops from `first`
};
// A message of a single-stage schedule: boundary b's activation (stage b to b+1) or gradient
// (b+1 to b) of micro-batch i, index (2 * b + gradient) * M + i; `send` says which end posts.
struct MessageOp {
  int32_t message = 0;
  bool send = false;
};

struct PipelineScratch {
  std::vector<std::vector<PipelinePass>> passes;  // per rank, from rank_passes
  // single-stage schedules: each rank's program and the messages' post and done times
  std::vector<std::vector<RankOp>> program;
  std::vector<MessageOp> message_ops;
  std::vector<double> send_posted_s, receive_posted_s, message_done_s;
  std::vector<double> rank_clock_s;
  std::vector<double> forward_finish_s;   // [s * M + i]
  std::vector<double> backward_finish_s;  // [s * M + i]: B, or I when the backward is split
  std::vector<double> weight_finish_s;    // [s * M + i]: W (split backward only)
  std::vector<int64_t> next_op;           // per rank
  // After simulate_pipeline: per stage, when its last pass that produces weight gradients (its
  // last B, or its last W) starts, i.e. when its accumulated gradients start to become final
  // (all-reduce can begin); and whether that pass is a W.
  std::vector<double> last_backward_start_s;
  std::vector<uint8_t> last_backward_is_weight;
};

// Per-micro-batch pass times of every stage: F_s, B_s, and for a split backward W_s (the
// weight-gradient part of B_s; I_s = B_s - W_s). weight_s may be empty for schedules that do
// not split. p2p_s: size S-1, 0 where two adjacent stages share a rank.
struct StagePassTimes {
  const std::vector<double>& forward_s;
  const std::vector<double>& backward_s;
  const std::vector<double>& weight_s;
  const std::vector<double>& p2p_s;
  // The ranks exchange messages over Gloo (Cluster collectives "gloo": CPU ranks): a message
  // moves once both ends posted it and the sender's thread writes it (simulate_pipeline).
  // Otherwise (NCCL) a transfer runs on its own stream as soon as its data is there, the
  // receives having been queued ahead by a host that runs ahead of the device.
  bool gloo_messages = false;
};

// Simulates any schedule as an event schedule: each rank runs its passes in order; a pass
// starts when the rank is free and its input is there: F(s,i) needs F(s-1,i) + p2p_s[s-1];
// B or I (s,i) needs B or I (s+1,i) + p2p_s[s] (the last stage: its own F(s,i)); W(s,i) needs
// I(s,i).
//
// With gloo_messages (CPU ranks), GPipe and 1F1B are simulated message by message, as torch's
// ScheduleGPipe and Schedule1F1B post and wait on them (single_stage_program), because there
// the receives are posted only when the data is needed and Gloo moves a message only once both
// ends have posted it (its receiver announces the receive; docs/calibration.md "Where a
// pipeline's messages wait"):
//   - a message is done p2p_s after the later of its send's and its receive's posting;
//   - a send posted after its receive is written on the sender's own thread: the sender is
//     busy for those p2p_s (Gloo's isend returns when it has written the message);
//   - a rank waiting on messages resumes when all of them are done.
// So under 1F1B a stage whose next input was computed long ago still waits p2p_s for it after
// posting its receive, and Schedule1F1B's sender waits until its receiver posts (it waits on a
// send fused with its next receive). The multi-stage schedules (torch's runtime) post every
// receive as early as the sends they match allow: they keep the dataflow rule above, and the
// sender is busy for p2p_s after each pass whose output goes to another rank (it finds the
// receive posted and writes the message).
PipelineTimes simulate_pipeline(Schedule schedule, PipelineShape shape, const StagePassTimes& times,
                                PipelineScratch& scratch);

}  // namespace hybridplan
