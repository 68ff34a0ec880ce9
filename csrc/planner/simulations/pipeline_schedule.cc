#include "planner/simulations/pipeline_schedule.h"

#include <algorithm>

#include "common/error.h"
#include "planner/costs/compute_cost.h"

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
  const auto forward = [&](int64_t i) { passes.push_back({PassKind::kForward, i, stage}); };
  const auto backward = [&](int64_t i) { passes.push_back({PassKind::kBackward, i, stage}); };
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
    default:
      break;
  }
  throw InputError(std::string("a pipeline schedule must be gpipe or 1f1b (got ") +
                   schedule_name(schedule) + ")");
}

namespace {

// torch's _get_1f1b_rank_ops for ScheduleInterleaved1F1B (zero_bubble false) and
// ScheduleInterleavedZeroBubble (true), without the None padding that only aligns torch's
// lockstep simulation (the simulator here waits on data instead).
std::vector<PipelinePass> interleaved_passes(bool zero_bubble, int64_t mp, int64_t v, int64_t m,
                                             int64_t rank) {
  const int64_t rounds = std::max<int64_t>(1, m / mp);
  const int64_t per_round = m / rounds;
  // _get_warmup_ops: (v-1) rounds on the last rank, plus 2 (1F1B) or 1 (ZB) per hop from it
  const int64_t warmup =
      std::min((v - 1) * per_round + (zero_bubble ? 1 : 2) * (mp - 1 - rank), m * v);
  const int64_t microbatch_ops = v * m;
  const int64_t fwd_bwd = microbatch_ops - warmup;
  const int64_t total = warmup + fwd_bwd + warmup;  // cool-down = warm-up
  const int64_t num_stages = mp * v;
  const auto forward_stage = [&](int64_t step) { return ((step / per_round) % v) * mp + rank; };
  const auto backward_stage = [&](int64_t step) {
    return (v - 1 - ((step - warmup) / per_round) % v) * mp + rank;
  };
  const int64_t plain_1f1b = zero_bubble ? rank : 0;  // num_1f1b_microbatches
  std::vector<int64_t> fwd_mb(num_stages, 0), bwd_mb(num_stages, 0), weight_mb(num_stages, 0);
  std::vector<int64_t> backward_ops;
  size_t weight_count = 0;
  std::vector<PipelinePass> out;
  out.reserve((zero_bubble ? 3 : 2) * microbatch_ops);
  const PassKind backward_kind = zero_bubble ? PassKind::kBackwardInput : PassKind::kBackward;
  const auto add = [&](PassKind kind, int64_t stage, std::vector<int64_t>& counter) {
    out.push_back({kind, counter[stage]++, stage});
  };
  const auto weight = [&]() {
    add(PassKind::kBackwardWeight, backward_stage(backward_ops[weight_count++]), weight_mb);
  };
  for (int64_t op = 0; op < total; ++op) {
    if (op < warmup) {
      add(PassKind::kForward, forward_stage(op), fwd_mb);
      continue;
    }
    if (op < warmup + fwd_bwd) add(PassKind::kForward, forward_stage(op), fwd_mb);
    add(backward_kind, backward_stage(op), bwd_mb);
    backward_ops.push_back(op);
    if (zero_bubble && op - warmup >= plain_1f1b) weight();
  }
  while (zero_bubble && weight_count < backward_ops.size()) weight();
  return out;
}

// torch's ScheduleZBVZeroBubble._calculate_single_rank_operations: two stages per rank in a V,
// chunk 0 = stage rank, chunk 1 = stage 2mp-1-rank.
std::vector<PipelinePass> zbv_passes(int64_t mp, int64_t m, int64_t rank) {
  const int64_t n = std::max(2 * mp - 1, m);
  const int64_t chunk0 = rank, chunk1 = 2 * mp - 1 - rank;
  int64_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  std::vector<PipelinePass> out;
  const auto add = [&](PassKind kind, int64_t stage, int64_t microbatch) {
    if (microbatch < m) out.push_back({kind, microbatch, stage});  // torch drops mb >= M
  };
  const PassKind F = PassKind::kForward, I = PassKind::kBackwardInput, W = PassKind::kBackwardWeight;
  for (int64_t k = 0; k < 2 * (mp - rank) - 1; ++k) add(F, chunk0, f0++);
  for (int64_t k = 0; k < rank; ++k) {
    add(F, chunk1, f1++);
    add(F, chunk0, f0++);
  }
  for (int64_t k = 0; k < mp - rank; ++k) {
    add(F, chunk1, f1++);
    add(I, chunk1, b1);
    add(W, chunk1, b1++);
  }
  while (f1 < f0 || f0 < n) {
    if (f0 < n) add(F, chunk0, f0++);
    add(I, chunk0, b0);
    add(W, chunk0, b0++);
    add(F, chunk1, f1++);
    add(I, chunk1, b1);
    add(W, chunk1, b1++);
  }
  int64_t w0 = b0, w1 = b1;
  for (int64_t k = 0; k < rank; ++k) {
    add(I, chunk0, b0++);
    add(I, chunk1, b1++);
  }
  for (int64_t k = 0; k < mp - rank; ++k) {
    add(I, chunk0, b0++);
    add(W, chunk0, w0++);
  }
  while (w1 < b1) add(W, chunk1, w1++);
  while (w0 < b0) add(W, chunk0, w0++);
  return out;
}

}  // namespace

std::vector<PipelinePass> rank_passes(Schedule schedule, PipelineShape shape, int64_t rank) {
  const int64_t ranks = shape.ranks();
  const int64_t m = shape.num_microbatches;
  if (ranks < 1 || rank < 0 || rank >= ranks) {
    throw InputError("pipeline rank must be in 0..num_ranks-1 (got rank " + std::to_string(rank) +
                     " of " + std::to_string(ranks) + ")");
  }
  if (m < 1) throw InputError("num_microbatches must be >= 1 (got " + std::to_string(m) + ")");
  if (!schedule_is_multi_stage(schedule)) {
    if (shape.num_stages != ranks) {
      throw InputError(std::string("schedule ") + schedule_name(schedule) +
                       " runs one stage per rank (got " + std::to_string(shape.num_stages) +
                       " stages on " + std::to_string(ranks) + " ranks)");
    }
    return stage_passes(schedule, shape, rank);
  }
  if (shape.num_stages % ranks != 0 || shape.num_stages / ranks < 2 ||
      (schedule == Schedule::kZBV && shape.num_stages != 2 * ranks)) {
    throw InputError(std::string("schedule ") + schedule_name(schedule) + " needs " +
                     (schedule == Schedule::kZBV ? "exactly 2" : "a whole number >= 2 of") +
                     " stages per rank (got " + std::to_string(shape.num_stages) + " stages on " +
                     std::to_string(ranks) + " ranks)");
  }
  if (schedule == Schedule::kZBV) return zbv_passes(ranks, m, rank);
  return interleaved_passes(schedule == Schedule::kInterleavedZB, ranks, shape.num_stages / ranks,
                            m, rank);
}

void stage_input_region(const Graph& graph, const std::vector<int32_t>& assignment,
                        std::vector<char>& carries, std::vector<char>& region) {
  const size_t n = graph.nodes.size();
  carries.assign(n, 0);
  region.assign(n, 0);
  for (NodeIndex v : graph.topo_order) {
    carries[v] = graph.nodes[v].param_bytes > 0 ? 1 : 0;
    for (int32_t k : graph.in_edges[v]) {
      const NodeIndex u = graph.edges[k].src;
      if (!carries[u]) continue;
      carries[v] = 1;
      if (assignment[u] != assignment[v] || region[u]) region[v] = 1;
    }
  }
}

std::string passes_to_string(const std::vector<PipelinePass>& passes) {
  bool multi = false;
  for (const PipelinePass& p : passes) multi = multi || p.stage != passes.front().stage;
  std::string out;
  for (const PipelinePass& p : passes) {
    if (!out.empty()) out += ' ';
    switch (p.kind) {
      case PassKind::kForward: out += 'F'; break;
      case PassKind::kBackward: out += 'B'; break;
      case PassKind::kBackwardInput: out += 'I'; break;
      case PassKind::kBackwardWeight: out += 'W'; break;
    }
    out += std::to_string(p.microbatch);
    if (multi) {
      out += 's';
      out += std::to_string(p.stage);
    }
  }
  return out;
}

double peak_activation_bytes(const std::vector<PipelinePass>& passes,
                             const std::vector<double>& activation_bytes,
                             const std::vector<double>& split_held_bytes,
                             const std::vector<double>& workspace_bytes,
                             const std::vector<double>& weight_workspace_bytes) {
  double held = 0, peak = 0;
  for (const PipelinePass& p : passes) {
    const double bytes = activation_bytes[p.stage];
    const double between = split_held_bytes.empty() ? 0.0 : split_held_bytes[p.stage];
    const double workspace = workspace_bytes.empty() ? 0.0 : workspace_bytes[p.stage];
    if (p.kind == PassKind::kForward) {
      held += bytes;
      peak = std::max(peak, held);
    } else if (p.kind == PassKind::kBackwardInput) {
      // the output gradients it keeps for W are made inside its workspace: the pass needs the
      // larger of the two above what is held, and they stay held after it
      peak = std::max(peak, held + std::max(workspace, between));
      held += between;
    } else if (p.kind == PassKind::kBackward) {
      peak = std::max(peak, held + workspace);
      held -= bytes;
    } else if (p.kind == PassKind::kBackwardWeight) {
      if (!weight_workspace_bytes.empty()) peak = std::max(peak, held + weight_workspace_bytes[p.stage]);
      held -= bytes + between;
    }
  }
  return peak;
}

namespace {

constexpr double kNotYet = -1.0;

// When pass p of stage s can start as far as its input is concerned; false if that input is not
// computed yet (the dependencies in pipeline_schedule.h).
bool input_ready_s(const PipelinePass& p, int64_t num_stages, int64_t m,
                   const std::vector<double>& p2p_s, const PipelineScratch& scratch,
                   double& ready_s) {
  const std::vector<double>& ff = scratch.forward_finish_s;
  const std::vector<double>& bf = scratch.backward_finish_s;
  const int64_t s = p.stage, i = p.microbatch;
  double source = 0;
  switch (p.kind) {
    case PassKind::kForward:
      if (s == 0) {
        ready_s = 0;
        return true;
      }
      source = ff[(s - 1) * m + i];
      ready_s = source + p2p_s[s - 1];
      break;
    case PassKind::kBackward:
    case PassKind::kBackwardInput:
      if (s == num_stages - 1) {
        source = ready_s = ff[s * m + i];
      } else {
        source = bf[(s + 1) * m + i];
        ready_s = source + p2p_s[s];
      }
      break;
    case PassKind::kBackwardWeight:
      source = ready_s = bf[s * m + i];
      break;
  }
  return source != kNotYet;
}

// torch's ScheduleGPipe and Schedule1F1B._step_microbatches (torch/distributed/pipelining/
// schedules.py) for stage s, as the runs, message posts and waits of its rank (pipeline_schedule.h):
// what they post together, and what they wait on before which pass.
void single_stage_program(Schedule schedule, int64_t num_stages, int64_t m, int64_t s,
                          const std::vector<PipelinePass>& passes, PipelineScratch& scratch,
                          std::vector<RankOp>& out) {
  out.clear();
  std::vector<int32_t> forward_at(m), backward_at(m);
  for (size_t k = 0; k < passes.size(); ++k) {
    (passes[k].kind == PassKind::kForward ? forward_at : backward_at)[passes[k].microbatch] =
        static_cast<int32_t>(k);
  }
  using Batch = std::vector<MessageOp>;
  const bool first = s == 0, last = s == num_stages - 1;
  // what stage s sends and receives for micro-batch i (nothing past either end)
  const auto activation_in = [&](int64_t i) {
    return first ? Batch{} : Batch{{static_cast<int32_t>((2 * (s - 1)) * m + i), false}};
  };
  const auto activation_out = [&](int64_t i) {
    return last ? Batch{} : Batch{{static_cast<int32_t>((2 * s) * m + i), true}};
  };
  const auto gradient_in = [&](int64_t i) {
    return last ? Batch{} : Batch{{static_cast<int32_t>((2 * s + 1) * m + i), false}};
  };
  const auto gradient_out = [&](int64_t i) {
    return first ? Batch{} : Batch{{static_cast<int32_t>((2 * (s - 1) + 1) * m + i), true}};
  };
  const auto append = [&](RankOp::Kind kind, const Batch& batch) {
    if (batch.empty()) return;
    out.push_back({kind, static_cast<int32_t>(scratch.message_ops.size()),
                   static_cast<int32_t>(batch.size())});
    scratch.message_ops.insert(scratch.message_ops.end(), batch.begin(), batch.end());
  };
  const auto post = [&](const Batch& batch) { append(RankOp::kPost, batch); };
  const auto wait = [&](const Batch& batch) { append(RankOp::kWait, batch); };
  const auto post_and_wait = [&](const Batch& batch) {
    post(batch);
    wait(batch);
  };
  const auto run = [&](int32_t pass) { out.push_back({RankOp::kRun, pass, 0}); };
  const auto joined = [](Batch a, const Batch& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };

  if (schedule == Schedule::kGpipe) {
    // all forwards, then all backwards; each phase waits on its sends at its end
    const auto phase = [&](const auto& in, const auto& sent, const std::vector<int32_t>& at) {
      Batch sends;
      for (int64_t i = 0; i < m; ++i) {
        post_and_wait(in(i));
        run(at[i]);
        post(sent(i));
        sends = joined(sends, sent(i));
      }
      wait(sends);
    };
    phase(activation_in, activation_out, forward_at);
    phase(gradient_in, gradient_out, backward_at);
    return;
  }
  HP_INTERNAL_ASSERT(schedule == Schedule::k1F1B, "single-stage schedule " << schedule_name(schedule));
  const int64_t warmup = std::min(m, num_stages - s);
  int64_t forward = 0, backward = 0;
  Batch in_flight, forward_sends, backward_sends;
  for (int64_t k = 0; k < warmup; ++k, ++forward) {
    post_and_wait(activation_in(forward));
    run(forward_at[forward]);
    wait(in_flight);  // the previous forward's send
    in_flight.clear();
    forward_sends = activation_out(forward);
    if (k != warmup - 1) {  // the last warm-up send goes with the first backward's receive
      post(forward_sends);
      in_flight = forward_sends;
    }
  }
  while (true) {
    post_and_wait(joined(forward_sends, gradient_in(backward)));
    run(backward_at[backward]);
    backward_sends = gradient_out(backward);
    ++backward;
    if (forward == m) break;
    post_and_wait(joined(backward_sends, activation_in(forward)));
    run(forward_at[forward]);
    forward_sends = activation_out(forward);
    ++forward;
  }
  post(backward_sends);
  in_flight = backward_sends;
  for (; backward < m; ++backward) {
    post_and_wait(gradient_in(backward));
    run(backward_at[backward]);
    wait(in_flight);
    in_flight = gradient_out(backward);
    post(in_flight);
  }
  wait(in_flight);
}

// GPipe and 1F1B message by message (pipeline_schedule.h): ranks advance in the order of their
// clocks, so a message's two postings are seen in the order they happen.
template <class Duration, class FinishSlot>
double simulate_messages(Schedule schedule, int64_t num_stages, int64_t m,
                         const std::vector<double>& p2p_s, const Duration& duration,
                         const FinishSlot& finish_slot, PipelineScratch& scratch) {
  const int64_t ranks = num_stages;
  scratch.message_ops.clear();
  scratch.program.resize(ranks);
  for (int64_t r = 0; r < ranks; ++r) {
    single_stage_program(schedule, num_stages, m, r, scratch.passes[r], scratch, scratch.program[r]);
  }
  const size_t messages = static_cast<size_t>(std::max<int64_t>(0, num_stages - 1) * 2 * m);
  scratch.send_posted_s.assign(messages, kNotYet);
  scratch.receive_posted_s.assign(messages, kNotYet);
  scratch.message_done_s.assign(messages, kNotYet);
  scratch.rank_clock_s.assign(ranks, 0.0);
  std::vector<double>& clock = scratch.rank_clock_s;
  std::vector<int64_t>& next = scratch.next_op;
  const auto message_p2p_s = [&](int32_t message) { return p2p_s[message / (2 * m)]; };
  const auto runnable = [&](int64_t r) {
    const RankOp& op = scratch.program[r][next[r]];
    if (op.kind != RankOp::kWait) return true;
    for (int32_t k = op.first; k < op.first + op.count; ++k) {
      if (scratch.message_done_s[scratch.message_ops[k].message] == kNotYet) return false;
    }
    return true;
  };
  double length_s = 0;
  std::vector<int64_t> backward_passes_left(num_stages, m);
  while (true) {
    int64_t r = -1;
    bool unfinished = false;
    for (int64_t q = 0; q < ranks; ++q) {
      if (next[q] >= static_cast<int64_t>(scratch.program[q].size())) continue;
      unfinished = true;
      if ((r < 0 || clock[q] < clock[r]) && runnable(q)) r = q;
    }
    if (!unfinished) break;
    HP_INTERNAL_ASSERT(r >= 0, "pipeline schedule deadlocked on its messages");
    const RankOp& op = scratch.program[r][next[r]++];
    switch (op.kind) {
      case RankOp::kRun: {
        const PipelinePass& p = scratch.passes[r][op.first];
        const double start_s = clock[r];
        clock[r] += duration(p);
        finish_slot(p) = clock[r];
        if (p.kind == PassKind::kBackward && --backward_passes_left[p.stage] == 0) {
          scratch.last_backward_start_s[p.stage] = start_s;
        }
        break;
      }
      case RankOp::kPost:
        for (int32_t k = op.first; k < op.first + op.count; ++k) {
          const MessageOp& mo = scratch.message_ops[k];
          double& done = scratch.message_done_s[mo.message];
          if (mo.send) {
            scratch.send_posted_s[mo.message] = clock[r];
            if (scratch.receive_posted_s[mo.message] != kNotYet) {
              clock[r] += message_p2p_s(mo.message);  // written on the sender's thread
              done = clock[r];
            }
          } else {
            scratch.receive_posted_s[mo.message] = clock[r];
            if (scratch.send_posted_s[mo.message] != kNotYet) {
              done = clock[r] + message_p2p_s(mo.message);  // the sender's Gloo thread writes it
            }
          }
        }
        break;
      case RankOp::kWait:
        for (int32_t k = op.first; k < op.first + op.count; ++k) {
          clock[r] = std::max(clock[r], scratch.message_done_s[scratch.message_ops[k].message]);
        }
        break;
    }
    length_s = std::max(length_s, clock[r]);
  }
  return length_s;
}

}  // namespace

PipelineTimes simulate_pipeline(Schedule schedule, PipelineShape shape, const StagePassTimes& times,
                                PipelineScratch& scratch) {
  const auto num_stages = static_cast<int64_t>(times.forward_s.size());
  const int64_t m = shape.num_microbatches;
  const int64_t ranks = shape.ranks();
  HP_INTERNAL_ASSERT(num_stages >= 1 && m >= 1 && num_stages == shape.num_stages,
                     "stages " << num_stages << ", micro-batches " << m);
  const bool split = schedule_splits_backward(schedule);
  HP_INTERNAL_ASSERT(!split || static_cast<int64_t>(times.weight_s.size()) == num_stages,
                     "a split backward needs W per stage");
  scratch.forward_finish_s.assign(num_stages * m, kNotYet);
  scratch.backward_finish_s.assign(num_stages * m, kNotYet);
  scratch.weight_finish_s.assign(split ? num_stages * m : 0, kNotYet);
  scratch.next_op.assign(ranks, 0);
  scratch.last_backward_start_s.assign(num_stages, 0.0);
  scratch.last_backward_is_weight.assign(num_stages, split ? 1 : 0);
  std::vector<int64_t> weight_passes_left(num_stages, m);

  scratch.passes.resize(ranks);
  int64_t remaining = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    scratch.passes[r] = rank_passes(schedule, shape, r);
    remaining += static_cast<int64_t>(scratch.passes[r].size());
  }
  const auto duration = [&](const PipelinePass& p) {
    switch (p.kind) {
      case PassKind::kForward: return times.forward_s[p.stage];
      case PassKind::kBackward: return times.backward_s[p.stage];
      case PassKind::kBackwardInput: return times.backward_s[p.stage] - times.weight_s[p.stage];
      case PassKind::kBackwardWeight: return times.weight_s[p.stage];
    }
    return 0.0;
  };
  const auto finish_slot = [&](const PipelinePass& p) -> double& {
    const int64_t at = p.stage * m + p.microbatch;
    if (p.kind == PassKind::kForward) return scratch.forward_finish_s[at];
    if (p.kind == PassKind::kBackwardWeight) return scratch.weight_finish_s[at];
    return scratch.backward_finish_s[at];
  };
  // Over Gloo, the multi-stage schedules' sends find their receives posted (torch's runtime
  // posts each receive as soon as its sender's pass is scheduled) and are written on the
  // sender's thread: the rank is busy for the transfer after a pass whose output goes to
  // another rank (p2p_s is 0 between two stages of one rank).
  const auto send_s = [&](const PipelinePass& p) {
    if (!times.gloo_messages) return 0.0;
    if (p.kind == PassKind::kForward) return p.stage + 1 < num_stages ? times.p2p_s[p.stage] : 0.0;
    if (p.kind == PassKind::kBackwardWeight || p.stage == 0) return 0.0;
    return times.p2p_s[p.stage - 1];
  };
  double length_s = 0;
  if (times.gloo_messages && !schedule_is_multi_stage(schedule)) {
    length_s = simulate_messages(schedule, num_stages, m, times.p2p_s, duration, finish_slot, scratch);
    remaining = 0;
  }
  // Advance every rank as far as its inputs allow, until all are done. Each sweep completes
  // at least one pass for a valid schedule (the dependency graph is acyclic).
  while (remaining > 0) {
    int64_t progressed = 0;
    for (int64_t r = 0; r < ranks; ++r) {
      const std::vector<PipelinePass>& passes = scratch.passes[r];
      int64_t& op = scratch.next_op[r];
      // the rank's previous pass and the writing of what it sent
      double free_s = op > 0 ? finish_slot(passes[op - 1]) + send_s(passes[op - 1]) : 0.0;
      for (; op < static_cast<int64_t>(passes.size()); ++op, ++progressed, --remaining) {
        const PipelinePass& p = passes[op];
        double ready_s = 0;
        if (!input_ready_s(p, num_stages, m, times.p2p_s, scratch, ready_s)) break;
        const double start_s = std::max(ready_s, free_s);
        finish_slot(p) = start_s + duration(p);
        free_s = finish_slot(p) + send_s(p);
        length_s = std::max(length_s, free_s);
        const bool final_gradient = split ? p.kind == PassKind::kBackwardWeight
                                          : p.kind == PassKind::kBackward;
        if (final_gradient && --weight_passes_left[p.stage] == 0) {
          scratch.last_backward_start_s[p.stage] = start_s;
        }
      }
    }
    HP_INTERNAL_ASSERT(progressed > 0, "pipeline schedule deadlocked");
  }

  PipelineTimes out;
  out.compute_s = length_s;
  // The bubble: idle time of the busiest rank (the sum of its stages' F + B per micro-batch).
  std::vector<double> rank_work(ranks, 0.0);
  for (int64_t s = 0; s < num_stages; ++s) {
    rank_work[stage_rank(schedule, ranks, s)] += times.forward_s[s] + times.backward_s[s];
  }
  const double busiest_s = *std::max_element(rank_work.begin(), rank_work.end());
  out.bubble_s = std::max(0.0, length_s - static_cast<double>(m) * busiest_s);
  double p2p_total_s = 0;
  for (double t : times.p2p_s) p2p_total_s += t;
  out.transfer_s = static_cast<double>(m) * 2.0 * p2p_total_s;
  return out;
}

}  // namespace hybridplan
