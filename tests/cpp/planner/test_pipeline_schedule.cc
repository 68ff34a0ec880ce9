#include "catch.h"
#include "model_fixtures.h"
#include "planner/pipeline_schedule.h"

using namespace hybridplan;

TEST_CASE("1F1B operation order: warm-up, steady 1F1B, cool-down", "[pipeline_schedule]") {
  const auto ops = [](Schedule schedule, int64_t stages, int64_t stage, int64_t m) {
    std::string text;
    for (int64_t op = 0; op < 2 * m; ++op) {
      bool forward = false;
      int64_t i = 0;
      pipeline_operation(schedule, stages, stage, m, op, forward, i);
      text += (forward ? "F" : "B") + std::to_string(i) + " ";
    }
    return text;
  };
  // S=4, M=6: stage 0 warms up with 3 forwards, the last stage with none.
  REQUIRE(ops(Schedule::k1F1B, 4, 0, 6) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5 ");
  REQUIRE(ops(Schedule::k1F1B, 4, 2, 6) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5 ");
  REQUIRE(ops(Schedule::k1F1B, 4, 3, 6) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 ");
  // Fewer micro-batches than the warm-up depth: all forwards, then all backwards.
  REQUIRE(ops(Schedule::k1F1B, 4, 0, 2) == "F0 F1 B0 B1 ");
  REQUIRE(ops(Schedule::kGpipe, 4, 0, 3) == "F0 F1 F2 B0 B1 B2 ");
}

TEST_CASE("the timelines drawn in pipeline_schedule.h", "[pipeline_schedule]") {
  // S=3, M=4, F=1, B=2, no transfers.
  PipelineScratch scratch;
  const std::vector<double> f{1, 1, 1}, b{2, 2, 2}, p2p{0, 0};

  const PipelineTimes gpipe = simulate_pipeline(Schedule::kGpipe, 4, f, b, p2p, scratch);
  // stage 2 finishes forwards at 3..6 and backwards at 8, 10, 12, 14; stage 0 at 12..18.
  REQUIRE(std::vector<double>(scratch.forward_finish_s.begin() + 8, scratch.forward_finish_s.end()) ==
          std::vector<double>{3, 4, 5, 6});
  REQUIRE(std::vector<double>(scratch.backward_finish_s.begin() + 8, scratch.backward_finish_s.end()) ==
          std::vector<double>{8, 10, 12, 14});
  REQUIRE(std::vector<double>(scratch.backward_finish_s.begin(), scratch.backward_finish_s.begin() + 4) ==
          std::vector<double>{12, 14, 16, 18});
  REQUIRE(gpipe.compute_s == 18);
  REQUIRE(gpipe.bubble_s == 6);  // 18 - 4 * (1 + 2)

  const PipelineTimes one_f_one_b = simulate_pipeline(Schedule::k1F1B, 4, f, b, p2p, scratch);
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
  const PipelineTimes gpipe = simulate_pipeline(Schedule::kGpipe, 2, f, b, p2p, scratch);
  REQUIRE(gpipe.compute_s == 10);
  REQUIRE(gpipe.bubble_s == 4);       // 10 - 2 * 3
  REQUIRE(gpipe.transfer_s == 2);     // 2 micro-batches * 2 directions * 0.5
  REQUIRE(scratch.last_backward_start_s == std::vector<double>{8, 5.5});
  // 1F1B: stage 1 F0 1.5-2.5 B0 2.5-4.5 F1 4.5-5.5 B1 5.5-7.5; stage 0 B0 5-7, B1 8-10.
  const PipelineTimes one_f_one_b = simulate_pipeline(Schedule::k1F1B, 2, f, b, p2p, scratch);
  REQUIRE(one_f_one_b.compute_s == 10);
  REQUIRE(scratch.backward_finish_s == std::vector<double>{7, 10, 4.5, 7.5});
}

TEST_CASE("stage costs count each value once per boundary it crosses", "[pipeline_schedule]") {
  // a(0) -> b(0) -> c(1) -> d(2); a -> c and a -> d skip ahead. Output bytes a=100, b=50, c=30.
  const Graph g = test::make_graph(
      {{"a", 1, 2, 0, 100}, {"b", 2, 4, 0, 50}, {"c", 3, 6, 0, 30}, {"d", 4, 8, 0, 0}},
      {{0, 1, 100}, {1, 2, 50}, {2, 3, 30}, {0, 2, 100}, {0, 3, 100}}, 4);
  PipelineStages stages;
  pipeline_stage_costs(g, {0, 0, 1, 2}, 3, 0.5, stages);  // micro-batch of 2 at profiled 4
  REQUIRE(stages.forward_s == std::vector<double>{1.5, 1.5, 2});   // (1+2)/2, 3/2, 4/2
  REQUIRE(stages.backward_s == std::vector<double>{3, 3, 4});
  // boundary 0|1: a (once, though consumed by c and d) 100 + b 50 = 150, halved = 75
  // boundary 1|2: a forwarded 100 + c 30 = 130, halved = 65
  REQUIRE(stages.boundary_bytes == std::vector<double>{75, 65});
}
