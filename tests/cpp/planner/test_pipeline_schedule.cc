#include "catch.h"
#include "model_fixtures.h"
#include "planner/simulations/pipeline_schedule.h"

using namespace hybridplan;

TEST_CASE("1F1B operation order: warm-up, steady 1F1B, cool-down", "[pipeline_schedule]") {
  const auto ops = [](Schedule schedule, int64_t stages, int64_t stage, int64_t m) {
    return passes_to_string(stage_passes(schedule, {.num_stages = stages, .num_microbatches = m}, stage));
  };
  // S=4, M=6: stage 0 warms up with 3 forwards, the last stage with none.
  REQUIRE(ops(Schedule::k1F1B, 4, 0, 6) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  REQUIRE(ops(Schedule::k1F1B, 4, 2, 6) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  REQUIRE(ops(Schedule::k1F1B, 4, 3, 6) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer micro-batches than the warm-up depth: all forwards, then all backwards.
  REQUIRE(ops(Schedule::k1F1B, 4, 0, 2) == "F0 F1 B0 B1");
  REQUIRE(ops(Schedule::kGpipe, 4, 0, 3) == "F0 F1 F2 B0 B1 B2");
}

TEST_CASE("GPipe and 1F1B pass orders", "[pipeline_schedule]") {
  CHECK(passes_to_string(stage_passes(Schedule::kGpipe, {.num_stages = 2, .num_microbatches = 4}, 0)) == "F0 F1 F2 F3 B0 B1 B2 B3");
  CHECK(passes_to_string(stage_passes(Schedule::kGpipe, {.num_stages = 2, .num_microbatches = 4}, 1)) == "F0 F1 F2 F3 B0 B1 B2 B3");
  // Stage 0 of 2: one warm-up forward, then 1F1B, then the last backward.
  CHECK(passes_to_string(stage_passes(Schedule::k1F1B, {.num_stages = 2, .num_microbatches = 4}, 0)) == "F0 F1 B0 F2 B1 F3 B2 B3");
  CHECK(passes_to_string(stage_passes(Schedule::k1F1B, {.num_stages = 2, .num_microbatches = 4}, 1)) == "F0 B0 F1 B1 F2 B2 F3 B3");
  // Warm-up is capped by the micro-batch count: stage 0 of 4 with 2 micro-batches.
  CHECK(passes_to_string(stage_passes(Schedule::k1F1B, {.num_stages = 4, .num_microbatches = 2}, 0)) == "F0 F1 B0 B1");
  CHECK_THROWS_WITH(stage_passes(Schedule::kNone, {.num_stages = 2, .num_microbatches = 4}, 0),
                    "a pipeline schedule must be gpipe or 1f1b (got none)");
  CHECK_THROWS_WITH(stage_passes(Schedule::kGpipe, {.num_stages = 2, .num_microbatches = 4}, 2),
                    "pipeline stage must be in 0..num_stages-1 (got stage 2 of 2)");
}

// Simulates S stages with blocking receives and asynchronous sends: F(i) on stage s > 0 needs
// stage s-1's F(i); B(i) on stage s < S-1 needs stage s+1's B(i). Every schedule must finish,
// and 1F1B must keep at most S - s micro-batches in flight on stage s.
TEST_CASE("pipeline schedules never deadlock", "[pipeline_schedule]") {
  for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B}) {
    for (int64_t S = 1; S <= 4; ++S) {
      for (int64_t m = 1; m <= 6; ++m) {
        std::vector<std::vector<PipelinePass>> passes;
        for (int64_t s = 0; s < S; ++s) passes.push_back(stage_passes(schedule, {.num_stages = S, .num_microbatches = m}, s));
        std::vector<size_t> next(S, 0);
        std::vector<std::vector<bool>> fwd_done(S, std::vector<bool>(m)), bwd_done = fwd_done;
        bool progress = true;
        while (progress) {
          progress = false;
          for (int64_t s = 0; s < S; ++s) {
            if (next[s] == passes[s].size()) continue;
            const PipelinePass p = passes[s][next[s]];
            const bool ready = p.kind == PassKind::kForward
                                   ? (s == 0 || fwd_done[s - 1][p.microbatch])
                                   : (s == S - 1 || bwd_done[s + 1][p.microbatch]) && fwd_done[s][p.microbatch];
            if (!ready) continue;
            (p.kind == PassKind::kForward ? fwd_done : bwd_done)[s][p.microbatch] = true;
            ++next[s];
            progress = true;
          }
        }
        for (int64_t s = 0; s < S; ++s) {
          INFO(schedule_name(schedule) << " S=" << S << " m=" << m << " stage " << s);
          CHECK(next[s] == passes[s].size());
          CHECK(passes[s].size() == static_cast<size_t>(2 * m));
          if (schedule == Schedule::k1F1B) {
            int64_t in_flight = 0, peak = 0;
            for (const PipelinePass& p : passes[s]) {
              in_flight += p.kind == PassKind::kForward ? 1 : -1;
              peak = std::max(peak, in_flight);
            }
            CHECK(peak <= S - s);
          }
        }
      }
    }
  }
}

TEST_CASE("the timelines drawn in pipeline_schedule.h", "[pipeline_schedule]") {
  // S=3, M=4, F=1, B=2, no transfers.
  PipelineScratch scratch;
  const std::vector<double> f{1, 1, 1}, b{2, 2, 2}, p2p{0, 0};

  const PipelineTimes gpipe = simulate_pipeline(Schedule::kGpipe, {.num_stages = static_cast<int64_t>(f.size()), .num_microbatches = 4}, {f, b, {}, p2p}, scratch);
  // stage 2 finishes forwards at 3..6 and backwards at 8, 10, 12, 14; stage 0 at 12..18.
  REQUIRE(std::vector<double>(scratch.forward_finish_s.begin() + 8, scratch.forward_finish_s.end()) ==
          std::vector<double>{3, 4, 5, 6});
  REQUIRE(std::vector<double>(scratch.backward_finish_s.begin() + 8, scratch.backward_finish_s.end()) ==
          std::vector<double>{8, 10, 12, 14});
  REQUIRE(std::vector<double>(scratch.backward_finish_s.begin(), scratch.backward_finish_s.begin() + 4) ==
          std::vector<double>{12, 14, 16, 18});
  REQUIRE(gpipe.compute_s == 18);
  REQUIRE(gpipe.bubble_s == 6);  // 18 - 4 * (1 + 2)

  const PipelineTimes one_f_one_b = simulate_pipeline(Schedule::k1F1B, {.num_stages = static_cast<int64_t>(f.size()), .num_microbatches = 4}, {f, b, {}, p2p}, scratch);
  // stage 0: F0 0-1 F1 1-2 F2 2-3 | B0 7-9 F3 9-10 B1 10-12 | B2 13-15 B3 16-18
  REQUIRE(std::vector<double>(scratch.forward_finish_s.begin(), scratch.forward_finish_s.begin() + 4) ==
          std::vector<double>{1, 2, 3, 10});
  REQUIRE(std::vector<double>(scratch.backward_finish_s.begin(), scratch.backward_finish_s.begin() + 4) ==
          std::vector<double>{9, 12, 15, 18});
  // stage 1: F0 1-2 F1 2-3 | B0 5-7 F2 7-8 B1 8-10 F3 10-11 B2 11-13 | B3 14-16
  REQUIRE(std::vector<double>(scratch.forward_finish_s.begin() + 4, scratch.forward_finish_s.begin() + 8) ==
          std::vector<double>{2, 3, 8, 11});
  REQUIRE(std::vector<double>(scratch.backward_finish_s.begin() + 4, scratch.backward_finish_s.begin() + 8) ==
          std::vector<double>{7, 10, 13, 16});
  // stage 2: F0 2-3 B0 3-5 F1 5-6 B1 6-8 F2 8-9 B2 9-11 F3 11-12 B3 12-14
  REQUIRE(std::vector<double>(scratch.backward_finish_s.begin() + 8, scratch.backward_finish_s.end()) ==
          std::vector<double>{5, 8, 11, 14});
  REQUIRE(one_f_one_b.compute_s == 18);
  REQUIRE(one_f_one_b.bubble_s == 6);
  REQUIRE(scratch.last_backward_start_s == std::vector<double>{16, 14, 12});
}

TEST_CASE("transfers delay the next stage", "[pipeline_schedule]") {
  // S=2, M=2, F=1, B=2, 0.5 s per boundary crossing.
  PipelineScratch scratch;
  const std::vector<double> f{1, 1}, b{2, 2}, p2p{0.5};
  // GPipe: stage 0 F 0-1, 1-2; stage 1 F 1.5-2.5, 2.5-3.5, B 3.5-5.5, 5.5-7.5;
  //        stage 0 B ready 5.5+0.5 = 6 -> 6-8, then ready 8 -> 8-10.
  const PipelineTimes gpipe = simulate_pipeline(Schedule::kGpipe, {.num_stages = static_cast<int64_t>(f.size()), .num_microbatches = 2}, {f, b, {}, p2p}, scratch);
  REQUIRE(gpipe.compute_s == 10);
  REQUIRE(gpipe.bubble_s == 4);       // 10 - 2 * 3
  REQUIRE(gpipe.transfer_s == 2);     // 2 micro-batches * 2 directions * 0.5
  REQUIRE(scratch.last_backward_start_s == std::vector<double>{8, 5.5});
  // 1F1B: stage 1 F0 1.5-2.5 B0 2.5-4.5 F1 4.5-5.5 B1 5.5-7.5; stage 0 B0 5-7, B1 8-10.
  const PipelineTimes one_f_one_b = simulate_pipeline(Schedule::k1F1B, {.num_stages = static_cast<int64_t>(f.size()), .num_microbatches = 2}, {f, b, {}, p2p}, scratch);
  REQUIRE(one_f_one_b.compute_s == 10);
  REQUIRE(scratch.backward_finish_s == std::vector<double>{7, 10, 4.5, 7.5});
}

TEST_CASE("over Gloo a message moves once both ends posted it", "[pipeline_schedule]") {
  // The case above on CPU ranks: a send posted after its receive keeps the sender busy while it
  // is written, and a message moves only once its receive is posted.
  PipelineScratch scratch;
  const std::vector<double> f{1, 1}, b{2, 2}, p2p{0.5};
  const PipelineShape shape{.num_stages = 2, .num_microbatches = 2};
  // GPipe: stage 0 F0 0-1, writes A0 1-1.5 (stage 1 posted its receive at 0), F1 1.5-2.5, posts
  //        A1 at 2.5 as stage 1 posts its receive: A1 there at 3; stage 0 waits for it, posts
  //        its gradient receives. Stage 1 F0 1.5-2.5 F1 3-4 B0 4-6, writes G0 6-6.5, B1 6.5-8.5,
  //        writes G1 8.5-9 (stage 0, B0 6.5-8.5, posted its receive at 8.5); stage 0 B1 9-11.
  const PipelineTimes gpipe = simulate_pipeline(Schedule::kGpipe, shape, {f, b, {}, p2p, true}, scratch);
  REQUIRE(gpipe.compute_s == 11);
  REQUIRE(gpipe.bubble_s == 5);  // 11 - 2 * 3
  REQUIRE(scratch.last_backward_start_s == std::vector<double>{9, 6.5});
  REQUIRE(scratch.forward_finish_s == std::vector<double>{1, 2.5, 2.5, 4});
  // 1F1B: stage 0 F0 0-1, writes A0 1-1.5, F1 1.5-2.5, then posts A1 with G0's receive and waits
  //   for both. Stage 1 F0 1.5-2.5 B0 2.5-4.5, then posts G0 (written 4.5-5) with A1's receive:
  //   only now does A1 move (there at 5.5, though computed at 2.5). Stage 1 F1 5.5-6.5
  //   B1 6.5-8.5, writes G1 8.5-9; stage 0 B0 5.5-7.5, B1 9-11.
  const PipelineTimes one_f_one_b = simulate_pipeline(Schedule::k1F1B, shape, {f, b, {}, p2p, true}, scratch);
  REQUIRE(one_f_one_b.compute_s == 11);
  REQUIRE(scratch.backward_finish_s == std::vector<double>{7.5, 11, 4.5, 8.5});
  REQUIRE(scratch.forward_finish_s == std::vector<double>{1, 2.5, 2.5, 6.5});
  // With no transfer time the order alone decides, as without Gloo (the timelines above).
  const std::vector<double> f3{1, 1, 1}, b3{2, 2, 2}, none{0, 0};
  for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B}) {
    const PipelineShape three{.num_stages = 3, .num_microbatches = 4};
    const double plain = simulate_pipeline(schedule, three, {f3, b3, {}, none}, scratch).compute_s;
    const std::vector<double> finish = scratch.backward_finish_s;
    CHECK(simulate_pipeline(schedule, three, {f3, b3, {}, none, true}, scratch).compute_s == plain);
    CHECK(scratch.backward_finish_s == finish);
  }
  // Multi-stage schedules keep the dataflow rule; each sender writes what it sends to another
  // rank: that can only lengthen the step.
  const std::vector<double> f4{0.5, 0.5, 0.5, 0.5}, b4{1, 1, 1, 1}, p4{0.5, 0.5, 0.5};
  const PipelineShape four{.num_stages = 4, .num_microbatches = 4, .num_ranks = 2};
  const double dataflow = simulate_pipeline(Schedule::kInterleaved1F1B, four, {f4, b4, {}, p4}, scratch).compute_s;
  CHECK(simulate_pipeline(Schedule::kInterleaved1F1B, four, {f4, b4, {}, p4, true}, scratch).compute_s > dataflow);
}

TEST_CASE("stage costs count each value once per boundary it crosses", "[pipeline_schedule]") {
  // a(0) -> b(0) -> c(1) -> d(2); a -> c and a -> d skip ahead. Output bytes a=100, b=50, c=30.
  const Graph g = test::make_graph(
      {{"a", 1, 2, 0, 100}, {"b", 2, 4, 0, 50}, {"c", 3, 6, 0, 30}, {"d", 4, 8, 0, 0}},
      {{0, 1, 100}, {1, 2, 50}, {2, 3, 30}, {0, 2, 100}, {0, 3, 100}}, 4);
  PipelineStages stages;
  // micro-batch of 2 at profiled 4, linear times (no call floor), 0.25 s per schedule action
  const NodeTimes micro = ComputeModel(g, test::make_cluster(1, 3)).at_batch(2);
  pipeline_stage_costs(g, {0, 0, 1, 2}, 3, micro, 0.5, 0.25, stages);
  REQUIRE(stages.forward_s == std::vector<double>{1.75, 1.75, 2.25});  // (1+2)/2, 3/2, 4/2 + 0.25
  REQUIRE(stages.backward_s == std::vector<double>{3.25, 3.25, 4.25});
  // boundary 0|1: a (once, though consumed by c and d) 100 + b 50 = 150, halved = 75
  // boundary 1|2: a forwarded 100 + c 30 = 130, halved = 65
  REQUIRE(stages.boundary_bytes == std::vector<double>{75, 65});
  // each value is its own message: a and b cross 0|1, a and c cross 1|2
  REQUIRE(stages.boundary_tensors == std::vector<double>{2, 2});
}

TEST_CASE("multi-stage schedules: order and simulation", "[pipeline_schedule]") {
  const auto order = [](Schedule s, int64_t stages, int64_t m, int64_t ranks, int64_t rank) {
    return passes_to_string(rank_passes(s, {.num_stages = stages, .num_microbatches = m, .num_ranks = ranks}, rank));
  };
  // torch's ScheduleInterleaved1F1B, 2 ranks x 2 stages, 2 micro-batches (the Python parity
  // test checks every shape against torch itself): rank 0 holds stages 0 and 2.
  CHECK(order(Schedule::kInterleaved1F1B, 4, 2, 2, 0) == "F0s0 F1s0 F0s2 F1s2 B0s2 B1s2 B0s0 B1s0");
  CHECK(order(Schedule::kInterleaved1F1B, 4, 2, 2, 1) == "F0s1 F1s1 F0s3 B0s3 F1s3 B1s3 B0s1 B1s1");
  // ZB-V: rank 0 holds stages 0 and 3, rank 1 stages 1 and 2.
  CHECK(order(Schedule::kZBV, 4, 2, 2, 1) == "F0s1 F0s2 F1s1 F1s2 I0s2 W0s2 I0s1 W0s1 I1s2 W1s2 I1s1 W1s1");
  CHECK_THROWS_WITH(rank_passes(Schedule::kZBV, {.num_stages = 6, .num_microbatches = 2, .num_ranks = 2}, 0),
                    "schedule zbv needs exactly 2 stages per rank (got 6 stages on 2 ranks)");
  CHECK_THROWS_WITH(rank_passes(Schedule::k1F1B, {.num_stages = 4, .num_microbatches = 2, .num_ranks = 2}, 0),
                    "schedule 1f1b runs one stage per rank (got 4 stages on 2 ranks)");

  // The same model (F = 1, B = 2 per micro-batch on each of 2 ranks) cut into 4 stages of
  // half the work: interleaving shrinks the fill and drain, and the weight passes of the
  // zero-bubble schedules fill what is left.
  PipelineScratch scratch;
  const std::vector<double> f2{1, 1}, b2{2, 2}, p2{0};
  const std::vector<double> f4{0.5, 0.5, 0.5, 0.5}, b4{1, 1, 1, 1}, w4{0.5, 0.5, 0.5, 0.5}, p4{0, 0, 0};
  const double one_f_one_b =
      simulate_pipeline(Schedule::k1F1B, {.num_stages = 2, .num_microbatches = 4}, {f2, b2, {}, p2}, scratch).compute_s;
  const PipelineShape four{.num_stages = 4, .num_microbatches = 4, .num_ranks = 2};
  const PipelineTimes interleaved = simulate_pipeline(Schedule::kInterleaved1F1B, four, {f4, b4, {}, p4}, scratch);
  const PipelineTimes zb = simulate_pipeline(Schedule::kInterleavedZB, four, {f4, b4, w4, p4}, scratch);
  const PipelineTimes zbv = simulate_pipeline(Schedule::kZBV, four, {f4, b4, w4, p4}, scratch);
  INFO("1f1b " << one_f_one_b << " interleaved " << interleaved.compute_s << " zb " << zb.compute_s
               << " zbv " << zbv.compute_s);
  CHECK(one_f_one_b == 15);  // (M + S - 1) (F + B)
  CHECK(interleaved.compute_s < one_f_one_b);
  CHECK(zbv.compute_s < interleaved.compute_s);
  for (double t : {interleaved.compute_s, zb.compute_s, zbv.compute_s}) CHECK(t >= 12);  // M * 2 * 1.5 per rank
  // zbv's turn (stages 1 and 2 on rank 1) sends nothing: a transfer there changes nothing.
  const std::vector<double> turn{0, 5, 0};
  CHECK(simulate_pipeline(Schedule::kZBV, four, {f4, b4, w4, turn}, scratch).compute_s > zbv.compute_s);
}

TEST_CASE("activation peak follows the pass order", "[pipeline_schedule]") {
  // stage bytes 10 (stage 0) and 1 (stage 2) on rank 0 of interleaved-1f1b, 2 micro-batches:
  // F0s0 F1s0 F0s2 F1s2 hold 22 before the first backward.
  const auto passes = rank_passes(Schedule::kInterleaved1F1B, {.num_stages = 4, .num_microbatches = 2, .num_ranks = 2}, 0);
  CHECK(peak_activation_bytes(passes, {10, 0, 1, 0}) == 22);
  // A split backward frees at W, not at I.
  const std::vector<PipelinePass> split{{PassKind::kForward, 0, 0}, {PassKind::kBackwardInput, 0, 0},
                                        {PassKind::kForward, 1, 0}, {PassKind::kBackwardWeight, 0, 0}};
  CHECK(peak_activation_bytes(split, {3}) == 6);
  // ... and holds the recorded output gradients (here 1) from I to W: F0 3, I0 4, F1 7, W0 3.
  CHECK(peak_activation_bytes(split, {3}, {1}) == 7);
  // A backward pass needs its stage's workspace above what is held (here 5): F0 3, I0 3 + 5,
  // then I0 holds its output gradients (1, made inside the workspace), F1 7, W0 3.
  CHECK(peak_activation_bytes(split, {3}, {1}, {5}) == 8);
  // ... and an I whose held gradients outgrow its workspace needs them: 3 + max(0.5, 2).
  const std::vector<PipelinePass> alone{{PassKind::kForward, 0, 0}, {PassKind::kBackwardInput, 0, 0},
                                        {PassKind::kBackwardWeight, 0, 0}};
  CHECK(peak_activation_bytes(alone, {3}, {2}, {0.5}) == 5);
  CHECK(peak_activation_bytes(alone, {3}, {2}) == 5);
  // ... and a W that runs a whole backward (a first stage's) needs its workspace: 3 + 4.
  CHECK(peak_activation_bytes(alone, {3}, {0}, {0}, {4}) == 7);
  // A full backward frees what the micro-batch held: F0 3, B0 3 + 5, F1 3 -> 8.
  const std::vector<PipelinePass> full{{PassKind::kForward, 0, 0}, {PassKind::kBackward, 0, 0},
                                       {PassKind::kForward, 1, 0}, {PassKind::kBackward, 1, 0}};
  CHECK(peak_activation_bytes(full, {3}, {}, {5}) == 8);
  // One stage per rank: the peak is in_flight_microbatches' count.
  const auto one = stage_passes(Schedule::k1F1B, {.num_stages = 4, .num_microbatches = 8}, 1);
  CHECK(peak_activation_bytes(one, {0, 1, 0, 0}) == 3);
}

TEST_CASE("stage_input_region: nodes a stage input that needs a gradient reaches", "[pipeline]") {
  // emb (params) -> act -> lin (params) -> out; mask (no params, from the batch) -> lin and
  // -> only_mask. Stages: emb, act, mask on 0; lin, out, only_mask on 1.
  const Graph g = test::make_graph({{"emb", 1, 2, 100, 10}, {"act", 1, 2, 0, 10}, {"mask", 1, 2, 0, 10},
                                    {"lin", 1, 2, 100, 10}, {"out", 1, 2, 0, 10}, {"only_mask", 1, 2, 0, 10}},
                                   {{0, 1, 10}, {1, 3, 10}, {2, 3, 10}, {3, 4, 10}, {2, 5, 10}});
  std::vector<char> carries, region;
  stage_input_region(g, {0, 0, 0, 1, 1, 1}, carries, region);
  // the first stage's inputs are the batch: none of its nodes; lin receives act's gradient-
  // carrying value from stage 0, out follows lin; only_mask receives the mask, which carries none
  CHECK(region == std::vector<char>{0, 0, 0, 1, 1, 0});
  // one stage: nothing comes in from another stage
  stage_input_region(g, {0, 0, 0, 0, 0, 0}, carries, region);
  CHECK(region == std::vector<char>(6, 0));
  // a cut after emb: act is reached from stage 0's emb, and lin and out through it
  stage_input_region(g, {0, 1, 1, 1, 1, 1}, carries, region);
  CHECK(region == std::vector<char>{0, 1, 0, 1, 1, 0});
}
