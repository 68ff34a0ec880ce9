#include <chrono>
#include <ctime>
#include <cmath>
#include <iostream>

#include "catch.h"
#include "model_fixtures.h"
#include "planner/costs/compute_cost.h"
#include "planner/costs/evaluate.h"
#include "planner/searches/search.h"

using namespace hybridplan;

namespace {

// The diamond of test_placement_simulation.cc with parameters a=100, c=200 bytes and output
// bytes a=b=d=100, c=40; every edge carries 100 bytes. Profiled batch 1.
Problem diamond_problem() {
  Problem p;
  p.graph = test::diamond_graph();
  // One node of 4 devices, 100 bytes/s, 0.5 s latency (an edge of 100 bytes costs 1.5 s).
  p.cluster = test::make_cluster(1, 4, 100, 0.5);
  p.job.samples_per_epoch = 5;
  p.job.convergence.model = Convergence::Model::kCriticalBatch;
  p.job.convergence.epochs_min = 10;
  p.job.convergence.critical_batch = 2;
  return p;
}

// Nodes a and b, 100 B of parameters and 50 B of output each, profiled at batch 2; 4 devices
// of 100 B/s without latency.
Problem two_stage_problem() {
  Problem problem;
  problem.graph = test::make_graph({{"a", 1, 2, 100, 50}, {"b", 1, 2, 100, 50}}, {{0, 1, 50}}, 2, "ab");
  problem.cluster = test::make_cluster(1, 4, 100, 0);
  return problem;
}

// a -> b -> c -> d: forward 1 and backward 2 each at the profiled batch 2, 100 B of parameters
// and a 50 B output each; the edges a -> b and b -> c carry first_bytes and middle_bytes; 2
// devices of 100 B/s without latency.
Problem four_node_problem(int64_t first_bytes = 50, int64_t middle_bytes = 50) {
  Problem problem;
  problem.graph = test::make_graph({{"a", 1, 2, 100, 50}, {"b", 1, 2, 100, 50}, {"c", 1, 2, 100, 50},
                                    {"d", 1, 2, 100, 50}},
                                   {{0, 1, first_bytes}, {1, 2, middle_bytes}, {2, 3, 50}}, 2, "abcd");
  problem.cluster = test::make_cluster(1, 2, 100, 0);
  return problem;
}

// One node per stage of a two-stages-per-rank `schedule` on 2 ranks, M micro-batches of 2.
Plan four_stage_plan(const Problem& problem, Schedule schedule, int64_t m) {
  Plan plan = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline, 2 * m,
                              {0, 1, 2, 3}, m, schedule);
  plan.virtual_stages = 2;
  return plan;
}

// dp=2 x mp=2, a on stage 0 and b on stage 1, GPipe with 2 micro-batches of 2.
Plan two_stage_plan(const Problem& problem) {
  return test::make_plan(problem.graph, problem.cluster, 2, 2, MpMode::kPipeline, 4, {0, 1}, 2,
                         Schedule::kGpipe);
}

}  // namespace

TEST_CASE("evaluate: hand-computed placement plan with dp=2, mp=2", "[evaluate]") {
  const Problem problem = diamond_problem();
  // a, b, d on local device 0; c on 1. mesh [[0,1],[2,3]].
  const Plan plan = test::make_plan(problem.graph, problem.cluster, 2, 2, MpMode::kPlacement, 1,
                                    {0, 0, 1, 0});
  const Prediction p = evaluate(problem, plan);
  // compute: forward makespan 8 + backward makespan 13 (test_placement_simulation.cc)
  REQUIRE(p.compute_s == 21);
  REQUIRE(p.transfer_s == 6);
  REQUIRE(p.bubble_s == 0);
  // All-reduce, ring of p=2 in one node: fixed 2*1*0.5 = 1 s, 2*1/2 / 100 = 0.01 s/byte.
  //   group 0 {0,2}: a's 100 bytes, ready at 8 + 13 = 21 -> 21 + 2 = 23: exposed 2
  //   group 1 {1,3}: c's 200 bytes, ready at 8 + 9.5 = 17.5 -> 17.5 + 3 = 20.5 < 21: hidden
  REQUIRE(p.allreduce_s == 2);
  REQUIRE(p.step_s == 23);
  REQUIRE(p.samples_per_s == 2.0 / 23);
  // memory (sgd): device 0 params 100 * 2 + activations a, b, d 300 = 500, plus the backward
  //               workspace max(a 100 + 0, b 100 + 100, d 100 + 100 + 100) = 300, plus the
  //               model's output (d's 100) that the caller holds through backward -> 900
  //               device 1 params 200 * 2 + activation c 40 = 440, plus c 40 + 100 -> 580
  REQUIRE(p.memory_bytes == std::vector<int64_t>{900, 580});
  REQUIRE(p.feasible);
  // A node's measured saved tensors replace its output bytes: b keeps 700 B for backward.
  Problem saved = problem;
  saved.graph.nodes[1].saved_bytes = 700;
  saved.graph.finalize("diamond");
  REQUIRE(evaluate(saved, plan).memory_bytes == std::vector<int64_t>{900 - 100 + 700, 580});
  // The model's inputs (profiled.input_bytes, 30 B a sample) sit where the first node runs.
  Problem with_inputs = problem;
  with_inputs.graph.profiled.input_bytes = 30;
  REQUIRE(evaluate(with_inputs, plan).memory_bytes == std::vector<int64_t>{900 + 30, 580});
  // The loss's backward peak (profiled.loss_backward_bytes) is the last node's workspace where
  // it is larger than d's own 300: 450 -> device 0 holds 900 - 300 + 450.
  Problem with_loss = problem;
  with_loss.graph.profiled.loss_backward_bytes = 450;
  REQUIRE(evaluate(with_loss, plan).memory_bytes == std::vector<int64_t>{1050, 580});
  with_loss.graph.profiled.loss_backward_bytes = 250;  // smaller than d's workspace: no change
  REQUIRE(evaluate(with_loss, plan).memory_bytes == std::vector<int64_t>{900, 580});
  with_loss.graph.profiled.loss_backward_bytes = 450;
  REQUIRE(graph_from_json(graph_to_json(with_loss.graph), "graph.json")
              .profiled.loss_backward_bytes == 450);
  // A measured backward workspace replaces output + inputs: b's backward needs 600 B above what
  // is held, but d's backward ran before it and freed the 100 B d kept, so device 0 needs
  // max(d's 300, 600 - 100) = 500 -> 900 - 300 + 500.
  Problem measured = problem;
  measured.graph.nodes[1].backward_workspace_bytes = 600;
  measured.graph.finalize("diamond");
  REQUIRE(evaluate(measured, plan).memory_bytes == std::vector<int64_t>{1100, 580});
  REQUIRE(graph_from_json(graph_to_json(measured.graph), "graph.json")
              .nodes[1].backward_workspace_bytes == 600);
  // a's 900 B would be 900 - (b's 100 + d's 100) = 700 at its turn, the last on device 0
  measured.graph.nodes[0].backward_workspace_bytes = 900;
  REQUIRE(evaluate(measured, plan).memory_bytes == std::vector<int64_t>{1300, 580});
  const Graph round_trip = graph_from_json(graph_to_json(with_inputs.graph), "graph.json");
  REQUIRE(round_trip.profiled.input_bytes == 30);
  Json negative = graph_to_json(with_inputs.graph);
  negative["profiled"]["input_bytes"] = -1;
  REQUIRE_THROWS_WITH(graph_from_json(negative, "g.json"),
                      Catch::Contains("g.json") && Catch::Contains("profiled.input_bytes"));
  // epochs(2) = 10 * (1 + 2/2) = 20; 5/2 = 2.5 steps per epoch (full batches from a stream of
  // epochs); 20 * 2.5 * 23 = 1150
  REQUIRE(p.epochs == 20);
  REQUIRE(p.time_to_train_s == 1150);
  REQUIRE(objective(problem, p) == 1150);
}

TEST_CASE("evaluate: memory over the device is infeasible with a reason", "[evaluate]") {
  Problem problem = diamond_problem();
  problem.cluster.device.memory_bytes = 750;
  const Plan plan = test::make_plan(problem.graph, problem.cluster, 2, 2, MpMode::kPlacement, 1,
                                    {0, 0, 1, 0});
  const Prediction p = evaluate(problem, plan);
  REQUIRE_FALSE(p.feasible);
  REQUIRE(p.infeasible_reason == "device 0 (global device 0) needs 900 B > 750 B (over by 150 B)");
  REQUIRE(std::isinf(objective(problem, p)));
  REQUIRE(p.step_s == 23);  // the breakdown is still there
}

TEST_CASE("evaluate: pure data parallelism is the single-device sum plus all-reduce", "[evaluate]") {
  Problem problem = diamond_problem();
  problem.job = default_job();  // objective: seconds per sample
  const Plan dp4 = test::make_plan(problem.graph, problem.cluster, 4, 1, MpMode::kPlacement, 3,
                                   {0, 0, 0, 0});
  const Prediction p = evaluate(problem, dp4);
  // compute at batch 3: (7 + 14) * 3 = 63
  REQUIRE(p.compute_s == single_device_compute_s(ComputeModel(problem.graph, problem.cluster), 3));
  REQUIRE(p.compute_s == 63);
  // ring of 4: fixed 2*3*0.5 = 3, per byte 2*3/4/100 = 0.015. Backward order d, c, b, a at
  // batch 3: c finishes at 6+18 = 24, a at 24+12+6 = 42 (+ forward 21). Buckets of 25 MiB hold
  // both: one bucket of 300 bytes ready at 63 -> 63 + 3 + 4.5 = 70.5: exposed 7.5
  REQUIRE(p.allreduce_s == 7.5);
  REQUIRE(p.epochs == 0);
  REQUIRE(p.time_to_train_s == 0);
  REQUIRE(objective(problem, p) == p.step_s / 12);  // seconds per sample at global batch 12
  // Small buckets: a's gradient is ready last (at 63), c's at 21 + 24 = 45 -> c's 200 bytes
  // fill a bucket and reduce 45 -> 45 + 3 + 3 = 51, off the critical path; a's 100 bytes
  // 63 -> 63 + 3 + 1.5 = 67.5: exposed 4.5.
  Evaluator small(problem);
  small.bucket_caps = BucketCaps::uniform(150);
  REQUIRE(small.evaluate(dp4).allreduce_s == 4.5);
}

TEST_CASE("evaluate: hand-computed pipeline plan", "[evaluate]") {
  // a -> b; profiled at batch 2: forward 1, backward 2 each; 50-byte edge; params 100 each.
  Problem problem;
  problem.graph = test::make_graph({{"a", 1, 2, 100, 50}, {"b", 1, 2, 100, 50}}, {{0, 1, 50}}, 2, "ab");
  problem.cluster = test::make_cluster(1, 4, 100, 0);
  // Over Gloo (CPU ranks) the same plans take 11, their last backwards 6.5-8.5 and 9-11, so
  // stage 0's reduce 11-12 is exposed 1 (test_pipeline_schedule.cc, "over Gloo").
  problem.cluster.collectives = CollectiveLibrary::kGloo;
  for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B}) {
    const Prediction p = evaluate(problem, test::make_plan(problem.graph, problem.cluster, 2, 2,
                                                           MpMode::kPipeline, 4, {0, 1}, 2, schedule));
    REQUIRE(p.compute_s == 11);
    REQUIRE(p.allreduce_s == 1);
    REQUIRE(p.step_s == 12);
  }
  problem.cluster.collectives = CollectiveLibrary::kNccl;
  // per-replica batch 4 in 2 micro-batches of 2 (the profiled batch): F=1, B=2 per stage,
  // p2p 50 bytes / 100 B/s = 0.5 s: the S=2, M=2 case of test_pipeline_schedule.cc.
  for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B}) {
    const Plan plan = test::make_plan(problem.graph, problem.cluster, 2, 2, MpMode::kPipeline, 4,
                                      {0, 1}, 2, schedule);
    const Prediction p = evaluate(problem, plan);
    REQUIRE(p.compute_s == 10);
    REQUIRE(p.bubble_s == 4);
    REQUIRE(p.transfer_s == 2);
    // ring p=2 with no latency: 0.01 s/byte -> 1 s per stage's 100 bytes.
    //   stage 1's last backward 5.5-7.5 -> reduce 7.5-8.5, hidden
    //   stage 0's last backward 8-10 -> reduce 10-11: exposed 1
    REQUIRE(p.allreduce_s == 1);
    REQUIRE(p.step_s == 11);
    REQUIRE(p.samples_per_s == 8.0 / 11);
    // memory: params 100*2 + 50 bytes per micro-batch in flight
    //   GPipe: 2 in flight on both stages -> 300, 300; 1F1B: min(2, 2-0)=2, min(2, 2-1)=1
    // plus the backward workspace (a: 50 + 0; b: 50 + the 50-byte edge) and one receive buffer
    // per micro-batch (2 * 50: gradients into stage 0, activations into stage 1), and on the
    // last stage the model's output of each micro-batch in flight (50 each), held until its
    // backward is done: stage 0 + 50 + 100, stage 1 + 100 + 100 + 50 * in flight
    if (schedule == Schedule::kGpipe) {
      REQUIRE(p.memory_bytes == std::vector<int64_t>{450, 600});
    } else {
      REQUIRE(p.memory_bytes == std::vector<int64_t>{450, 500});
    }
  }
}

TEST_CASE("evaluate: each schedule pays its own calibrated cost per action", "[evaluate]") {
  // The hand-computed pipeline above (F=1, B=2 per stage, p2p 0.5 s, M=2) with a cost per action:
  // every forward and backward takes that much longer, for the schedule whose value it is.
  Problem problem;
  problem.graph = test::make_graph({{"a", 1, 2, 100, 50}, {"b", 1, 2, 100, 50}}, {{0, 1, 50}}, 2, "ab");
  problem.cluster = test::make_cluster(1, 2, 100, 0);
  problem.cluster.runtime.action_s = 0.25;
  problem.cluster.runtime.schedule_action_s = {{"gpipe", 0.5}};
  const auto compute_s = [&](Schedule schedule) {
    const Plan plan = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline, 4,
                                      {0, 1}, 2, schedule);
    return evaluate(problem, plan).compute_s;
  };
  // F = 1 + a, B = 2 + a, p2p 0.5. GPipe (a = 0.5): stage 0 F0 0-1.5, F1 1.5-3; stage 1 F0 2-3.5,
  // F1 3.5-5, B0 5-7.5, B1 7.5-10; stage 0 B0 8-10.5, B1 10.5-13.
  REQUIRE(compute_s(Schedule::kGpipe) == Approx(13));
  // 1F1B (action_s, a = 0.25): stage 0 F0 0-1.25, F1 1.25-2.5; stage 1 F0 1.75-3, B0 3-5.25,
  // F1 5.25-6.5, B1 6.5-8.75; stage 0 B0 5.75-8, B1 9.25-11.5.
  REQUIRE(compute_s(Schedule::k1F1B) == Approx(11.5));
  // The same cost per action from a fixed part and a part per sample of the micro-batch (2
  // samples): 0.25 + 2 x 0.125 = 0.5 for GPipe; 1F1B's scalar part per sample 0 leaves it as it was.
  problem.cluster.runtime.schedule_action_s = {{"gpipe", 0.25}};
  problem.cluster.runtime.schedule_action_sample_s = {{"gpipe", 0.125}};
  REQUIRE(compute_s(Schedule::kGpipe) == Approx(13));
  REQUIRE(compute_s(Schedule::k1F1B) == Approx(11.5));
  problem.cluster.runtime.schedule_action_sample_s.clear();
  problem.cluster.runtime.action_sample_s = 0.125;  // the scalar: every schedule without its own
  problem.cluster.runtime.schedule_action_s = {{"gpipe", 0.5}};
  problem.cluster.runtime.action_s = 0;
  REQUIRE(compute_s(Schedule::k1F1B) == Approx(11.5));
  REQUIRE(compute_s(Schedule::kGpipe) == Approx(14.5));  // 0.5 + 0.25 a pass: 2 more per pass than 13's half
  problem.cluster.runtime.action_sample_s = 0;
  problem.cluster.runtime.action_s = 0.25;
  // Over Gloo: GPipe stage 0 F0 0-1.5, writes A0 1.5-2, F1 2-3.5, A1 there at 4; stage 1 F0
  // 2-3.5, F1 4-5.5, B0 5.5-8, writes G0 8-8.5, B1 8.5-11, writes G1 11-11.5; stage 0 B0 8.5-11,
  // B1 11.5-14. 1F1B: stage 0 F0 0-1.25, writes A0 1.25-1.75, F1 1.75-3; stage 1 F0 1.75-3,
  // B0 3-5.25, writes G0 5.25-5.75, receives A1 by 6.25, F1 6.25-7.5, B1 7.5-9.75, writes G1
  // 9.75-10.25; stage 0 B0 6.25-8.5, B1 10.25-12.5.
  problem.cluster.collectives = CollectiveLibrary::kGloo;
  REQUIRE(compute_s(Schedule::kGpipe) == Approx(14));
  REQUIRE(compute_s(Schedule::k1F1B) == Approx(12.5));
}

TEST_CASE("evaluate: a zero-bubble W is the measured share of a node's backward", "[evaluate]") {
  // a -> b -> c -> d, one per stage of interleaved-zb on 2 ranks, M = 2; F = 1 and B = 2 per
  // stage, p2p 0.5 s.
  Problem problem = four_node_problem();
  const Plan plan = four_stage_plan(problem, Schedule::kInterleavedZB, 2);
  const auto compute_s = [&](double fraction_b) {
    problem.graph.nodes[1].weight_backward_fraction = fraction_b;
    return evaluate(problem, plan).compute_s;
  };
  // b's share moves work between the I that stage 0 waits for and the W that waits for
  // nobody: at 0.1 its I (1.8) is on the critical path, 2 x 0.8 longer than at the estimate's
  // 0.5 (I = 1, which the schedule hides), and at 0.9 the I shrinks behind other work.
  CHECK(compute_s(-1) == Approx(15));
  CHECK(compute_s(0.1) == Approx(16.6));
  CHECK(compute_s(0.9) == Approx(15));
  // the split's own cost joins b's backward: at 0.5, 0.8 more in each I (1.8, as at 0.1
  // above) and in each W (1.8 against 0.2 there), so the step is at least that one's and at
  // most two W's of 1.6 longer
  problem.graph.nodes[1].split_backward_extra_s = 1.6;
  CHECK(compute_s(-1) > 16.6);
  CHECK(compute_s(-1) <= 16.6 + 2 * 1.6);
  // the graph file keeps both, and refuses a share outside [0, 1] or a negative cost
  problem.graph.nodes[1].weight_backward_fraction = 0.25;
  const Graph again = graph_from_json(graph_to_json(problem.graph), "g.json");
  CHECK(again.nodes[1].weight_backward_fraction == 0.25);
  CHECK(again.nodes[1].split_backward_extra_s == 1.6);
  Json bad = graph_to_json(problem.graph);
  bad["nodes"][1]["weight_backward_fraction"] = 1.5;
  CHECK_THROWS_WITH(graph_from_json(bad, "g.json"),
                    Catch::Contains("g.json") && Catch::Contains("nodes[1].weight_backward_fraction") &&
                        Catch::Contains("[0, 1]"));
  bad = graph_to_json(problem.graph);
  bad["nodes"][1]["split_backward_extra_s"] = -0.1;
  CHECK_THROWS_WITH(graph_from_json(bad, "g.json"),
                    Catch::Contains("nodes[1].split_backward_extra_s") && Catch::Contains(">= 0"));
}

TEST_CASE("evaluate: ZB-V's turn between two stages of one rank holds no activation buffers",
          "[evaluate]") {
  // a -> b -> c -> d on ZB-V's 4 stages: 0 and 3 on rank 0, 1 and 2 (the turn) on rank 1. The
  // workspaces are measured, so an edge's bytes reach memory only through receive buffers.
  const auto memory = [](int64_t turn_bytes, int64_t first_bytes) {
    Problem problem = four_node_problem(first_bytes, turn_bytes);
    for (Node& n : problem.graph.nodes) n.backward_workspace_bytes = 10;
    return evaluate(problem, four_stage_plan(problem, Schedule::kZBV, 2)).memory_bytes;
  };
  // torch hands the turn's activations over in place, and its gradients stay referenced as a
  // receive buffer would: 2 micro-batches of 950 more bytes on rank 1, one way only
  const std::vector<int64_t> turn = memory(50, 50), wider_turn = memory(1000, 50);
  CHECK(wider_turn[0] == turn[0]);
  CHECK(wider_turn[1] - turn[1] == 2 * 950);
  // between ranks, one buffer per micro-batch each way: rank 0's gradients into a, rank 1's
  // activations into b, 2 micro-batches of 950 more bytes each
  const std::vector<int64_t> base = memory(50, 50), wide = memory(50, 1000);
  CHECK(wide[0] - base[0] == 2 * 950);
  CHECK(wide[1] - base[1] == 2 * 950);
}

TEST_CASE("evaluate: a zero-bubble split holds the gradients I records, measured, until W",
          "[evaluate]") {
  // a -> b -> c -> d on interleaved-zb's 4 stages, M = 1: rank 1 runs F s1, F s3, I s3, W s3,
  // I s1, W s1. Measured, b records 5,000 bytes of gradients from its I to its W (an LSTM's
  // gate gradients; its output is 50).
  const auto memory = [](int64_t held_b) {
    Problem problem = four_node_problem();
    for (Node& n : problem.graph.nodes) n.backward_workspace_bytes = 10;
    problem.graph.nodes[1].split_held_bytes = held_b;
    return evaluate(problem, four_stage_plan(problem, Schedule::kInterleavedZB, 1)).memory_bytes;
  };
  const std::vector<int64_t> estimated = memory(-1), measured = memory(5000);
  // rank 1's peak comes while b's recorded gradients are held (b's I, before its W), with
  // them in place of the estimate's 50-byte output gradient; rank 0 is untouched
  CHECK(measured[0] == estimated[0]);
  CHECK(measured[1] - estimated[1] == 5000 - 50);
  // the graph file keeps it, and refuses a negative one
  Problem round;
  round.graph = test::make_graph({{"a", 1, 2, 100, 50}}, {}, 2, "a");
  round.graph.nodes[0].split_held_bytes = 7;
  CHECK(graph_from_json(graph_to_json(round.graph), "g.json").nodes[0].split_held_bytes == 7);
  Json bad = graph_to_json(round.graph);
  bad["nodes"][0]["split_held_bytes"] = -1;
  CHECK_THROWS_WITH(graph_from_json(bad, "g.json"),
                    Catch::Contains("nodes[0].split_held_bytes") && Catch::Contains(">= 0"));
}

TEST_CASE("evaluate: a zero-bubble I frees nothing as it goes and holds what it recorded",
          "[evaluate]") {
  // a -> b -> c1 -> c2 -> d on ZB-V's 4 stages, M = 1: a on stage 0, b on 1, c1 and c2 on 2, d
  // on 3; rank 1 runs F s1, F s2, I s2, W s2, I s1, W s1. c2 records 3,000 bytes of gradients
  // for W. I runs c2's backward first, then c1's while c2's recorded gradients are held, and
  // with the graph retained for W c2 frees nothing before c1 runs (a plain backward's credit).
  const auto rank1 = [](int64_t c1_workspace, int64_t c2_workspace) {
    Problem problem;
    problem.graph = test::make_graph(
        {{"a", 1, 2, 100, 50}, {"b", 1, 2, 100, 50}, {"c1", 1, 2, 100, 50},
         {"c2", 1, 2, 100, 50}, {"d", 1, 2, 100, 50}},
        {{0, 1, 50}, {1, 2, 50}, {2, 3, 50}, {3, 4, 50}}, 2, "ab12d");
    problem.cluster = test::make_cluster(1, 2, 100, 0);
    for (Node& n : problem.graph.nodes) n.backward_workspace_bytes = 10;
    problem.graph.nodes[2].backward_workspace_bytes = c1_workspace;
    problem.graph.nodes[3].backward_workspace_bytes = c2_workspace;
    problem.graph.nodes[3].split_held_bytes = 3000;
    Plan plan = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline, 2,
                                {0, 1, 2, 2, 3}, 1, Schedule::kZBV);
    plan.virtual_stages = 2;
    return evaluate(problem, plan).memory_bytes[1];
  };
  // c1's workspace of 1,000 comes on top of c2's 3,000 held: the peak of I s2 is 4,000 above
  // what rank 1 held, against 3,050 (everything recorded, c1's 50 included, at I's end) when
  // c1 needs 10. A plain backward's credit (c2's 50 saved bytes freed first) would give 950
  // and hide it under 3,050.
  CHECK(rank1(1000, 10) - rank1(10, 10) == 4000 - 3050);
  // c2 runs first, before anything is recorded: its workspace of 1,000 stays under the 3,050
  CHECK(rank1(10, 1000) == rank1(10, 10));
}

TEST_CASE("evaluate: every tensor crossing a stage boundary pays the link latency", "[evaluate]") {
  // a and b both feed c: two values (two messages) cross the 0|1 boundary, 50 bytes each.
  Problem problem;
  problem.graph = test::make_graph({{"a", 1, 2, 100, 50}, {"b", 1, 2, 100, 50}, {"c", 1, 2, 100, 50}},
                                   {{0, 2, 50}, {1, 2, 50}}, 2, "fan-in");
  problem.cluster = test::make_cluster(1, 2, 100, 0.25);  // 100 B/s, 0.25 s per message
  const Plan plan = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline, 2,
                                    {0, 0, 1}, 1, Schedule::kGpipe);
  const Prediction p = evaluate(problem, plan);
  // one micro-batch of 2 = the profiled batch: p2p = 2 * 0.25 + 100 / 100 = 1.5 s each way
  REQUIRE(p.transfer_s == Approx(2 * 1.5));
  // F0 = 2, F1 = 1, B1 = 2, B0 = 4: 2 + 1.5 + 1 + 2 + 1.5 + 4
  REQUIRE(p.compute_s == Approx(12));
}

TEST_CASE("evaluate: a DP group spanning nodes uses the hierarchical all-reduce", "[evaluate]") {
  // Two nodes of 2 devices; one 1000-byte-parameter node; placement mp=1, dp=4.
  Problem problem;
  problem.graph = test::make_graph({{"w", 1, 1, 1000, 0}}, {}, 1, "w");
  problem.cluster = test::make_cluster(2, 2, 1000, 0, 100, 0);
  const Plan plan = test::make_plan(problem.graph, problem.cluster, 4, 1, MpMode::kPlacement, 1, {0});
  const Prediction p = evaluate(problem, plan);
  // n=2 nodes, g=2 per node, G=1: intra 2*(1/2)/1000 = 0.001 s/B; inter 2*(1/2)/100 = 0.01 s/B
  // 1000 bytes -> 11 s, all exposed (the only gradient is ready when backward ends).
  REQUIRE(p.compute_s == 2);
  REQUIRE(p.allreduce_s == Approx(11));
}

TEST_CASE("evaluate: groups reducing across nodes at once share the injection bandwidth",
          "[evaluate]") {
  // Two nodes of 2 devices; w0 on local device 0, w1 on local device 1, 1000 parameter bytes
  // each. mesh [[0,1],[2,3]]: group 0 = {0,2} and group 1 = {1,3} both span the two nodes, so
  // each node carries G = 2 concurrent groups.
  Problem problem;
  problem.graph = test::make_graph({{"w0", 1, 1, 1000, 0}, {"w1", 1, 1, 1000, 0}}, {}, 1, "ww");
  problem.cluster = test::make_cluster(2, 2, 1000, 0, 100, 0);
  const Plan plan = test::make_plan(problem.graph, problem.cluster, 2, 2, MpMode::kPlacement, 1, {0, 1});
  const Prediction p = evaluate(problem, plan);
  // compute: forward 1 + backward 1 on each device in parallel = 2; gradients ready at 2.
  // per group: n=2 nodes, g=1: 2 * (1/2) * G / 100 = 0.02 s/B -> 1000 B = 20 s, all exposed
  // (alone, G=1, it would be 10 s).
  REQUIRE(p.compute_s == 2);
  REQUIRE(p.allreduce_s == Approx(20));
}

TEST_CASE("evaluate: a pipeline spanning nodes reduces each stage's gradients across replicas",
          "[evaluate]") {
  // Four nodes of 2 devices; a 4-stage chain (w0..w3, one node each) per replica, each replica
  // on two nodes: replica 0 on devices 0-3 (nodes 0, 1), replica 1 on 4-7 (nodes 2, 3). The DP
  // group of stage s is {s, 4 + s}: one member on each of two nodes, and nodes 0 and 2 carry the
  // groups of stages 0 and 1, nodes 1 and 3 those of stages 2 and 3.
  Problem problem;
  problem.graph = test::make_graph({{"w0", 1, 1, 1000, 0}, {"w1", 1, 1, 0, 0},
                                    {"w2", 1, 1, 0, 0}, {"w3", 1, 1, 0, 0}},
                                   {{0, 1, 0}, {1, 2, 0}, {2, 3, 0}}, 1, "chain");
  problem.cluster = test::make_cluster(4, 2, 1000, 0, 100, 0);
  const Plan plan = test::make_plan(problem.graph, problem.cluster, 2, 4, MpMode::kPipeline, 1,
                                    {0, 1, 2, 3}, 1, Schedule::kGpipe);
  REQUIRE(plan.mesh == std::vector<std::vector<DeviceIndex>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  // Only stage 0 has gradients: its group alone crosses nodes 0 and 2 (G = 1), n = 2, g = 1:
  // 2 * (1/2) / 100 s/B, 1000 B = 10 s, all exposed (stage 0's backward ends the step).
  CHECK(evaluate(problem, plan).allreduce_s == Approx(10));
  // Stage 1 (same nodes) reducing too: G = 2 shares the NIC, 20 s for stage 0's group; stage
  // 3's group on nodes 1 and 3 does not add to it.
  problem.graph.nodes[1].param_bytes = 10;
  problem.graph.nodes[3].param_bytes = 10;
  problem.graph.finalize("chain");
  Plan two = plan;
  two.graph_sha256 = graph_sha256(problem.graph);
  CHECK(evaluate(problem, two).allreduce_s == Approx(20));
}

TEST_CASE("evaluate rejects malformed plans with InputError, never crashes", "[evaluate]") {
  const Problem problem = diamond_problem();
  Plan plan = test::make_plan(problem.graph, problem.cluster, 2, 2, MpMode::kPlacement, 1, {0, 0, 1, 0});
  const Evaluator evaluator(problem);
  plan.assignment = {0, 0, 1};
  REQUIRE(test::input_error_of([&] { evaluator.evaluate(plan); }) ==
          "plan: assignment must have one entry per graph node (4) (got 3 entries)");
  plan.assignment = {0, 0, 5, 0};
  REQUIRE(test::input_error_of([&] { evaluator.evaluate(plan); }) ==
          "plan: assignment[2].device must be in 0..mp-1 = 0..1 (got 5)");
  plan.assignment = {0, 0, 1, 0};
  plan.mesh[1][1] = 7;
  REQUIRE(test::input_error_of([&] { evaluator.evaluate(plan); }) ==
          "plan: mesh[1][1] names no device of cluster \"test-cluster\" (0..3) (got 7)");
}

TEST_CASE("Evaluator gives the same answer as evaluate() on repeated calls", "[evaluate]") {
  const Problem problem = diamond_problem();
  const Evaluator evaluator(problem);
  const Plan a = test::make_plan(problem.graph, problem.cluster, 2, 2, MpMode::kPlacement, 1, {0, 0, 1, 0});
  const Plan b = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline, 4,
                                 {0, 0, 1, 1}, 2, Schedule::k1F1B);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(evaluator.evaluate(a).step_s == evaluate(problem, a).step_s);
    REQUIRE(evaluator.evaluate(b).step_s == evaluate(problem, b).step_s);
    REQUIRE(evaluator.evaluate(b).memory_bytes == evaluate(problem, b).memory_bytes);
  }
}

// Timing, not a check: hidden (run with `planner_tests "[.perf]"`).
TEST_CASE("evaluate speed on a 2,000-node graph", "[.perf]") {
  std::vector<test::NodeSpec> nodes;
  std::vector<test::EdgeSpec> edges;
  const int n = 2000;
  for (int i = 0; i < n; ++i) {
    nodes.push_back({"layer." + std::to_string(i), 1e-4, 2e-4, 4096 * (i % 7), 65536});
    if (i > 0) edges.push_back({i - 1, i, 65536});
    if (i > 3 && i % 5 == 0) edges.push_back({i - 4, i, 65536});  // skip connections
  }
  Problem problem;
  problem.graph = test::make_graph(nodes, edges, 32, "long");
  problem.cluster = test::make_cluster(4, 8, 2.5e10, 5e-6, 1.25e10, 1e-5);
  std::vector<int32_t> stages(n), spread(n);
  for (int i = 0; i < n; ++i) {
    stages[i] = i * 8 / n;
    spread[i] = i % 8;
  }
  const Evaluator evaluator(problem);
  const Plan pipeline = test::make_plan(problem.graph, problem.cluster, 4, 8, MpMode::kPipeline, 64,
                                        stages, 16, Schedule::k1F1B);
  const Plan placement = test::make_plan(problem.graph, problem.cluster, 4, 8, MpMode::kPlacement, 64, spread);
  for (const Plan* plan : {&pipeline, &placement}) {
    const int calls = 2000;
    double sink = 0;
    const auto start = std::chrono::steady_clock::now();
    const std::clock_t cpu_start = std::clock();  // CPU time: the test machine is shared
    for (int i = 0; i < calls; ++i) sink += evaluator.evaluate(*plan).step_s;
    const double cpu_us = 1e6 * static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    std::cout << mode_name(plan->mode) << ": " << cpu_us / calls << " us CPU (" << us / calls
              << " us wall) per evaluate (2000 nodes, dp 4 x mp 8; step " << sink / calls << " s)\n";
  }
}

namespace {
// a -> b profiled at batch 8 (forward 4, backward 8 each) and measured at batch 1 (forward 1,
// backward 2: a micro-batch of 1 costs 1/4 of a batch of 8, not 1/8); 2 devices, no transfers.
Problem batch_curve_problem() {
  Problem problem;
  problem.graph = test::make_graph({{"a", 4, 8, 0, 0}, {"b", 4, 8, 0, 0}}, {{0, 1, 0}}, 8, "ab");
  for (Node& n : problem.graph.nodes) n.batch_times = {{1, 1.0, 2.0}};
  problem.graph.finalize("ab");
  problem.cluster = test::make_cluster(1, 2, 1e12, 0);
  return problem;
}
}  // namespace

TEST_CASE("evaluate: micro-batches take their time from the node's batch curve", "[evaluate]") {
  Problem problem = batch_curve_problem();
  // 1x2 pipeline, batch 8 in 8 micro-batches of 1: F = 1, B = 2 per stage. GPipe S=2, M=8:
  // stage 1 forwards end at 2..9, its backwards 9-11, ..., 23-25; stage 0's backwards follow
  // each by 2: the last ends at 27 = (M + S - 1) * (F + B).
  const Plan plan = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline, 8,
                                    {0, 1}, 8, Schedule::kGpipe);
  REQUIRE(evaluate(problem, plan).compute_s == 27);
  // Linear scaling (the old model) would have said F = 0.5, B = 1: (8 + 1) * 1.5 = 13.5.
  // Two micro-batches of 4 sit between the measured points: F = 1 + 3 * 3/7 = 2.2857...
  Plan two = plan;
  two.num_microbatches = 2;
  const double f = 1 + 3.0 * 3 / 7, b = 2 + 6.0 * 3 / 7;
  REQUIRE(evaluate(problem, two).compute_s == Approx(3 * (f + b)));
  REQUIRE_THAT(evaluate(problem, two).compute_model, Catch::Matchers::Contains("1, 8"));
  // The runtime's cost per schedule action: every F and B of every stage pays it.
  problem.cluster.runtime.action_s = 0.5;
  REQUIRE(evaluate(problem, plan).compute_s == 27 + 9 * 1.0);  // (M + S - 1) * (F + B + 2 * 0.5)
}

TEST_CASE("evaluate: optimizer step, fixed step overhead and shared-host slowdown", "[evaluate]") {
  Problem problem = diamond_problem();
  problem.job = default_job();
  problem.job.optimizer = Optimizer::kAdam;
  problem.cluster.device.memory_bandwidth_bytes_per_s = 700;  // B/s
  problem.cluster.runtime.step_s = 0.25;
  const Plan dp1 = test::make_plan(problem.graph, problem.cluster, 1, 1, MpMode::kPlacement, 1,
                                   {0, 0, 0, 0});
  const Prediction p = evaluate(problem, dp1);
  REQUIRE(p.compute_s == 21);       // 7 forward + 14 backward
  // Adam touches 7 bytes per parameter byte: 300 parameter bytes * 7 / 700 B/s = 3 s.
  REQUIRE(p.optimizer_s == 3);
  // One replica: no data-parallel wrapper, so no fixed step overhead.
  REQUIRE(p.overhead_s == 0);
  REQUIRE(p.step_s == 21 + 3);
  // Placement mp=2 puts a, b, d on device 0 (100 B of params) and c on device 1 (200 B): the
  // devices update at once, the fuller one decides: 200 * 7 / 700 = 2 s.
  const Plan mp2 = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPlacement, 1,
                                   {0, 0, 1, 0});
  REQUIRE(evaluate(problem, mp2).optimizer_s == 2);
  // Two processes computing on one node at once run 1.5x slower (CPU ranks sharing cores).
  problem.cluster.runtime.shared_host_slowdown = {{1, 1.0}, {2, 1.5}};
  const Plan dp2 = test::make_plan(problem.graph, problem.cluster, 2, 1, MpMode::kPlacement, 1,
                                   {0, 0, 0, 0});
  const Prediction shared = evaluate(problem, dp2);
  REQUIRE(shared.compute_slowdown == 1.5);
  REQUIRE(shared.compute_s == 21 * 1.5);
  REQUIRE(shared.overhead_s == 0.25);  // two replicas: DDP's per-step cost
  REQUIRE(evaluate(problem, dp1).compute_slowdown == 1.0);  // one process: no sharing
}

TEST_CASE("evaluate: a pipeline rank computing while the others wait runs at the alone speed", "[evaluate]") {
  // Two processes computing at once run 1.5x slower than one alone.
  Problem problem = batch_curve_problem();
  problem.cluster.runtime.shared_host_slowdown = {{1, 1.0}, {2, 1.5}};
  // GPipe with one micro-batch: F0, F1, B1, B0 one after another, never two at once, so the
  // step is 4 + 4 + 8 + 8 at the alone speed, not 1.5x that.
  Plan one = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline, 8, {0, 1}, 8,
                             Schedule::kGpipe);
  one.num_microbatches = 1;
  const Prediction serial = evaluate(problem, one);
  REQUIRE(serial.compute_slowdown == 1.5);  // the plan's processes, as before
  REQUIRE(serial.compute_s == Approx(24));
  // The schedule's cost per action is not compute: it is not scaled.
  problem.cluster.runtime.action_s = 0.5;
  REQUIRE(evaluate(problem, one).compute_s == Approx(24 + 4 * 0.5));
  problem.cluster.runtime.action_s = 0;
  // Eight micro-batches of 1 (F 1, B 2): the ranks overlap for most of the step, only the fill
  // and drain run alone: between the alone figure (M + S - 1) * (F + B) = 27 and 1.5x it.
  const Plan eight = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline, 8,
                                     {0, 1}, 8, Schedule::kGpipe);
  const double overlapped = evaluate(problem, eight).compute_s;
  REQUIRE(overlapped > 27 * 1.1);
  REQUIRE(overlapped < 27 * 1.5);
  // The timeline the trace draws is the rescaled one: rank 0's F0 at the alone speed (4 s), then
  // rank 1's.
  const auto timeline = Evaluator(problem).pipeline_timeline(one);
  REQUIRE(timeline[0].front().end_s == Approx(4));
  REQUIRE(timeline[1].front().start_s == Approx(4));
  REQUIRE(timeline[1].front().end_s == Approx(8));
  // Without a table (GPUs) nothing changes: 24.
  problem.cluster.runtime.shared_host_slowdown.clear();
  REQUIRE(evaluate(problem, one).compute_s == Approx(24));
  // A table saying sharing costs nothing leaves the overlapped schedule at 27.
  problem.cluster.runtime.shared_host_slowdown = {{1, 1.0}, {2, 1.0}};
  REQUIRE(evaluate(problem, eight).compute_s == Approx(27));
}

TEST_CASE("evaluate: the optimizer pays a fixed cost per parameter tensor", "[evaluate]") {
  Problem problem = diamond_problem();
  problem.job = default_job();
  problem.job.optimizer = Optimizer::kAdam;
  problem.cluster.device.memory_bandwidth_bytes_per_s = 700;  // B/s: Adam's bytes cost 7 / 700
  problem.cluster.runtime.optimizer_tensor_s = 0.5;
  // a holds 2 tensors (100 B), c 3 (200 B); b and d none. A graph without counts pays only the
  // bytes (the term is 0 for nodes whose tensors were not counted).
  const Plan mp2 = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPlacement, 1,
                                   {0, 0, 1, 0});
  REQUIRE(evaluate(problem, mp2).optimizer_s == 2);  // 200 * 7 / 700, as before
  problem.graph.nodes[0].param_tensors = 2;
  problem.graph.nodes[1].param_tensors = 0;
  problem.graph.nodes[2].param_tensors = 3;
  problem.graph.nodes[3].param_tensors = 0;
  // Placement: one process loops over both devices' 5 tensors; the fuller device's bytes.
  REQUIRE(evaluate(problem, mp2).optimizer_s == 2 + 5 * 0.5);
  // Pipeline: a process per stage; stage 0 = a, b (100 B, 2 tensors): 1 + 1 = 2 s; stage 1 =
  // c, d (200 B, 3 tensors): 2 + 1.5 = 3.5 s, the slower decides.
  const Plan pipe = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline, 2,
                                    {0, 0, 1, 1}, 2, Schedule::kGpipe);
  REQUIRE(evaluate(problem, pipe).optimizer_s == 3.5);
  // The counts survive the JSON round trip; a negative count is refused with its path.
  const Graph again = graph_from_json(graph_to_json(problem.graph), "diamond.json");
  REQUIRE(again.nodes[2].param_tensors == 3);
  REQUIRE(again.nodes[1].param_tensors == 0);
  Json bad = graph_to_json(problem.graph);
  bad["nodes"][2]["param_tensors"] = -2;
  REQUIRE_THROWS_WITH(graph_from_json(bad, "diamond.json"),
                      Catch::Contains("diamond.json") && Catch::Contains("nodes[2].param_tensors") &&
                          Catch::Contains(">= 0"));
}

TEST_CASE("evaluate: a replica's CPU devices run one after another", "[evaluate]") {
  // On "cpu" devices one process drives the replica: placement mp=2 is the serial sum, with
  // no transfers, whatever the assignment (test_placement_simulation.cc: 8 + 13 on "cuda").
  Problem problem = diamond_problem();
  problem.cluster.device.type = "cpu";
  const Plan plan = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPlacement, 1,
                                    {0, 0, 1, 0});
  const Prediction p = evaluate(problem, plan);
  REQUIRE(p.compute_s == 7 + 14);
  REQUIRE(p.transfer_s == 0);
}

TEST_CASE("evaluate: the plan records the rings the all-reduce runs", "[evaluate]") {
  Problem problem = diamond_problem();
  problem.cluster.collectives = CollectiveLibrary::kGloo;
  const Plan plan = test::make_plan(problem.graph, problem.cluster, 2, 2, MpMode::kPlacement, 1,
                                    {0, 0, 1, 0});
  const Prediction p = evaluate(problem, plan);
  REQUIRE(p.allreduce_rings == std::vector<std::vector<DeviceIndex>>{{0, 2}, {1, 3}});
  const Plan single = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPlacement, 1,
                                      {0, 0, 1, 0});
  REQUIRE(evaluate(problem, single).allreduce_rings.empty());
}

TEST_CASE("evaluate: tied parameters are copied to every pipeline stage that holds them",
          "[evaluate]") {
  // a -> b -> c -> d, a and c tied (like GPT-2's wte and lm_head): 100 bytes in a's param_bytes.
  Problem problem;
  problem.graph = test::make_graph(
      {{"a", 1, 2, 100, 10}, {"b", 1, 2, 40, 10}, {"c", 1, 2, 0, 10}, {"d", 1, 2, 0, 10}},
      {{0, 1, 10}, {1, 2, 10}, {2, 3, 10}}, 1, "tied");
  problem.graph.tied_params = {{{0, 2}, 100}};
  problem.graph.finalize("tied");
  problem.cluster = test::make_cluster(1, 4, 100, 0.5);  // ring of 2: 2 * 0.5 s + bytes / 100
  const Plan split = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline, 1,
                                     {0, 0, 1, 1}, 1, Schedule::kGpipe);
  const Prediction p = evaluate(problem, split);
  // stage 0: a, b params 140 * 2 (sgd) + activations 20 + workspace (b: 10 + 10) + gradient
  // receive buffer 10; stage 1: c's copy 100 * 2 + 20 + workspace 20 + activation buffer 10
  // + the model's output (d's 10), held until backward is done
  REQUIRE(p.memory_bytes == std::vector<int64_t>{330, 260});
  // the copies' gradients summed between the two stages after the schedule: ring of 2 over
  // 100 B at 100 B/s and 0.5 s latency = 2 * 0.5 + 100 / 100 = 2 s
  REQUIRE(p.allreduce_s == Approx(2));
  // One stage holds both: no copy, nothing to sum.
  const Plan together = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline, 1,
                                        {0, 0, 0, 1}, 1, Schedule::kGpipe);
  const Prediction q = evaluate(problem, together);
  REQUIRE(q.memory_bytes == std::vector<int64_t>{310 + 20 + 10, 10 + 20 + 10 + 10});
  REQUIRE(q.allreduce_s == 0);
  // Placement keeps one parameter per replica: no copy (and no receive buffers; workspace 20
  // each; the held output 10 where d runs).
  const Plan placed = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPlacement, 1,
                                      {0, 0, 1, 1});
  REQUIRE(evaluate(problem, placed).memory_bytes == std::vector<int64_t>{300 + 20, 20 + 20 + 10});
}

TEST_CASE("evaluate: a recomputed node runs its forward again in backward and keeps its inputs",
          "[evaluate][recompute]") {
  Problem problem = diamond_problem();
  // a, b, d keep 700 B each for backward (saved_bytes), far more than their 100 B inputs.
  for (int v : {0, 1, 3}) problem.graph.nodes[v].saved_bytes = 700;
  problem.graph.finalize("diamond");
  Plan plan = test::make_plan(problem.graph, problem.cluster, 2, 2, MpMode::kPlacement, 1,
                              {0, 0, 1, 0});
  const Prediction kept = evaluate(problem, plan);
  // device 0: params 200 + activations 3 * 700 + workspace 300 + held output 100 = 2700
  REQUIRE(kept.memory_bytes[0] == 2700);
  plan.recompute = {1, 1, 0, 1};
  const Prediction p = evaluate(problem, plan);
  // a, b, d keep their inputs: a none (the model's input), b 100 (a -> b), d 200 (b -> d,
  // c -> d); one node's 700 B exist again while its backward runs:
  //   200 + 300 + 300 + 100 + 700 = 1600
  REQUIRE(p.memory_bytes == std::vector<int64_t>{1600, kept.memory_bytes[1]});
  // The time is the plan's on a graph whose recomputed nodes' backward is backward + forward.
  Problem slower = problem;
  for (int v : {0, 1, 3}) slower.graph.nodes[v].backward_s += slower.graph.nodes[v].forward_s;
  slower.graph.finalize("diamond");
  Plan same = plan;
  same.recompute.clear();
  same.graph_sha256 = graph_sha256(slower.graph);
  const Prediction expected = evaluate(slower, same);
  REQUIRE(p.compute_s == expected.compute_s);
  REQUIRE(p.step_s == expected.step_s);
  REQUIRE(p.compute_s > kept.compute_s);
}

TEST_CASE("evaluate: a recomputed pipeline stage keeps nothing but its receive buffers",
          "[evaluate][recompute]") {
  Problem problem = two_stage_problem();
  Plan plan = two_stage_plan(problem);
  REQUIRE(evaluate(problem, plan).memory_bytes == std::vector<int64_t>{450, 600});
  plan.recompute = {0, 1};
  const Prediction p = evaluate(problem, plan);
  // stage 1: its 2 micro-batches' 50 B of activations go; one micro-batch's come back while
  // its backward runs: 600 - 100 + 50
  REQUIRE(p.memory_bytes == std::vector<int64_t>{450, 550});
  // stage 1's backward takes F + B = 3 s per micro-batch instead of 2
  Problem slower = problem;
  slower.graph.nodes[1].backward_s = 3;
  slower.graph.finalize("ab");
  Plan same = plan;
  same.recompute.clear();
  same.graph_sha256 = graph_sha256(slower.graph);
  REQUIRE(p.compute_s == evaluate(slower, same).compute_s);
}

TEST_CASE("evaluate: a selectively recomputed node keeps its inputs and its costly ops' outputs "
          "and runs the rest of its forward again", "[evaluate][recompute]") {
  Problem problem = diamond_problem();
  for (int v : {0, 1, 3}) {
    problem.graph.nodes[v].saved_bytes = 700;
    problem.graph.nodes[v].selective_saved_bytes = 300;      // its matmul outputs
    problem.graph.nodes[v].selective_recompute_fraction = 0.25;  // the rest of its forward
  }
  problem.graph.finalize("diamond");
  Plan plan = test::make_plan(problem.graph, problem.cluster, 2, 2, MpMode::kPlacement, 1,
                              {0, 0, 1, 0});
  plan.recompute = {kRecomputeSelective, kRecomputeSelective, 0, kRecomputeSelective};
  const Prediction p = evaluate(problem, plan);
  // device 0: params 200 + workspace 300 + held output 100 + inputs kept (b 100, d 200: 300, as
  // under full recompute) + the kept outputs 3 * 300 + one node's rebuilt 700 - 300 = 400:
  //   200 + 300 + 100 + 300 + 900 + 400 = 2200
  REQUIRE(p.memory_bytes[0] == 2200);
  // The time is the plan's on a graph whose recomputed nodes' backward is backward + F / 4.
  Problem slower = problem;
  for (int v : {0, 1, 3}) slower.graph.nodes[v].backward_s += 0.25 * slower.graph.nodes[v].forward_s;
  slower.graph.finalize("diamond");
  Plan same = plan;
  same.recompute.clear();
  same.graph_sha256 = graph_sha256(slower.graph);
  REQUIRE(p.compute_s == Approx(evaluate(slower, same).compute_s));
  // A pipeline stage recomputed selectively keeps its nodes' saved outputs per micro-batch in
  // flight and rebuilds the rest for one.
  Problem two = two_stage_problem();
  two.graph.nodes[1].selective_saved_bytes = 20;  // of its 50 B per micro-batch
  two.graph.nodes[1].selective_recompute_fraction = 0.5;
  two.graph.finalize("ab");
  Plan staged = two_stage_plan(two);
  staged.recompute = {0, kRecomputeSelective};
  // stage 1 (600 without recompute, 2 micro-batches of 50 B): 600 - 100 + 2 * 20 + (50 - 20)
  REQUIRE(evaluate(two, staged).memory_bytes == std::vector<int64_t>{450, 570});
}

TEST_CASE("evaluate: selective recompute's dispatch costs runtime.selective_op_s per op of the "
          "node, per micro-batch", "[evaluate][recompute]") {
  Problem problem = diamond_problem();
  for (int v : {0, 1, 3}) {
    problem.graph.nodes[v].selective_saved_bytes = 300;
    problem.graph.nodes[v].selective_recompute_fraction = 0.25;
  }
  problem.graph.nodes[0].selective_ops = 4;
  problem.graph.nodes[1].selective_ops = 10;
  problem.graph.nodes[2].selective_ops = 1000;  // not recomputed: no cost
  problem.graph.finalize("diamond");
  Plan plan = test::make_plan(problem.graph, problem.cluster, 2, 1, MpMode::kPlacement, 1,
                              {0, 0, 0, 0});
  plan.recompute = {kRecomputeSelective, kRecomputeSelective, 0, kRecomputeSelective};
  const double without = evaluate(problem, plan).compute_s;
  problem.cluster.runtime.selective_op_s = 0.5;
  // one device: a (4 ops) and b (10 ops) add to the sum; d was not counted (-1)
  REQUIRE(evaluate(problem, plan).compute_s == Approx(without + 0.5 * (4 + 10)));
  // round trip: the node's count and the cluster's cost per op
  REQUIRE(graph_from_json(graph_to_json(problem.graph), "g").nodes[1].selective_ops == 10);
  REQUIRE(graph_from_json(graph_to_json(problem.graph), "g").nodes[3].selective_ops == -1);
  REQUIRE(cluster_from_json(cluster_to_json(problem.cluster), "c").runtime.selective_op_s == 0.5);
  // a pipeline stage pays it for every micro-batch
  Problem two = two_stage_problem();
  two.graph.nodes[1].selective_saved_bytes = 20;
  two.graph.nodes[1].selective_recompute_fraction = 0.5;
  two.graph.nodes[1].selective_ops = 6;
  two.graph.finalize("ab");
  Plan staged = two_stage_plan(two);
  staged.recompute = {0, kRecomputeSelective};
  const double staged_without = evaluate(two, staged).step_s;
  two.cluster.runtime.selective_op_s = 0.25;
  REQUIRE(evaluate(two, staged).step_s > staged_without);
}

TEST_CASE("evaluate: sharded data parallelism gathers and reduce-scatters each unit and holds shards",
          "[evaluate][sharding]") {
  Problem problem = diamond_problem();  // a holds 100 B of parameters, c 200 B: P = 300 B
  problem.job.optimizer = Optimizer::kAdam;
  problem.graph.nodes[0].param_tensors = 1;
  problem.graph.nodes[2].param_tensors = 2;
  problem.graph.finalize("diamond");
  problem.cluster.device.memory_bandwidth_bytes_per_s = 100;
  problem.cluster.runtime.optimizer_tensor_s = 1;
  problem.cluster.runtime.sharded_optimizer_tensor_s = 3;
  Plan plan = test::make_plan(problem.graph, problem.cluster, 2, 1, MpMode::kPlacement, 1, {0, 0, 0, 0});
  const Prediction none = evaluate(problem, plan);
  REQUIRE(none.compute_s == 21);  // forward 7 + backward 14 on one device
  REQUIRE(none.sharding_s == 0);
  // optimizer: adam touches 7 bytes per parameter byte at 100 B/s, and 1 s per tensor
  REQUIRE(none.optimizer_s == Approx(300.0 * 7 / 100 + 3 * 1));
  // A ring of 2 on one node, 100 B/s, 0.5 s latency: gather and reduce-scatter of b bytes take
  // (p-1) 0.5 + (p-1)/p b / 100: a 1.0 s, c 1.5 s.
  plan.sharding = Sharding::kZero2;
  const Prediction zero2 = evaluate(problem, plan);
  // Collectives beside compute (a "cuda" cluster): forward a's gather [0, 1], a runs 1-2, b 2-4,
  // c's gather (issued when a started) [1, 2.5] is hidden, c runs 4-7, d 7-8; backward d 8-10,
  // c 10-16 then its reduce-scatter [16, 17.5], b 16-20, a 20-22 then [22, 23]: 2 s more than
  // the 21 s of compute.
  REQUIRE(zero2.sharding_s == Approx(2.0));
  REQUIRE(zero2.allreduce_s == 0);
  REQUIRE(zero2.step_s == Approx(zero2.compute_s + 2.0 + zero2.optimizer_s));
  // the optimizer updates 150 B of shards, each of its 3 tensors at the sharded cost
  REQUIRE(zero2.optimizer_s == Approx(150.0 * 7 / 100 + 3 * 3));
  // measured per optimizer, the Job's own entry prices its tensors: each optimizer dispatches its
  // own ops per tensor (a cluster calibrated on SGD-momentum had priced plain SGD 3x too high)
  problem.cluster.runtime.optimizer_tensor_s_by_optimizer = {{"sgd", 0.5}, {"adam", 2}};
  problem.cluster.runtime.sharded_optimizer_tensor_s_by_optimizer = {{"sgd", 1}, {"adam", 4}};
  REQUIRE(evaluate(problem, plan).optimizer_s == Approx(150.0 * 7 / 100 + 3 * 4));
  plan.sharding = Sharding::kNone;
  REQUIRE(evaluate(problem, plan).optimizer_s == Approx(300.0 * 7 / 100 + 3 * 2));
  problem.job.optimizer = Optimizer::kSgdMomentum;  // not listed: the scalars
  REQUIRE(evaluate(problem, plan).optimizer_s == Approx(300.0 * 5 / 100 + 3 * 1));
  plan.sharding = Sharding::kZero2;
  REQUIRE(evaluate(problem, plan).optimizer_s == Approx(150.0 * 5 / 100 + 3 * 3));
  problem.job.optimizer = Optimizer::kAdam;
  problem.cluster.runtime.optimizer_tensor_s_by_optimizer.clear();
  problem.cluster.runtime.sharded_optimizer_tensor_s_by_optimizer.clear();
  // memory: P (2 + 2) = 1200 B unsharded; zero2 P + 3 P/2 + c's 200 B unsharded gradient = 950
  REQUIRE(zero2.memory_bytes[0] - none.memory_bytes[0] == 950 - 1200);
  plan.sharding = Sharding::kZero3;
  const Prediction zero3 = evaluate(problem, plan);
  // backward gathers again: c's [8, 9.5] (needed at 10), a's issued at c's start [10, 11]: hidden
  REQUIRE(zero3.sharding_s == Approx(2.0));
  // memory: 3 P/2 + 3 units of c (gathered, its gradient, the prefetched next) = 1050
  REQUIRE(zero3.memory_bytes[0] - none.memory_bytes[0] == 1050 - 1200);
  // CPU ranks: one thread computes and waits for each collective in turn, no prefetch.
  problem.cluster.device.type = "cpu";
  plan.sharding = Sharding::kZero2;
  REQUIRE(evaluate(problem, plan).sharding_s == Approx(1.0 + 1.5 + 1.0 + 1.5));
  plan.sharding = Sharding::kZero3;
  const Prediction cpu3 = evaluate(problem, plan);
  REQUIRE(cpu3.sharding_s == Approx(2 * (1.0 + 1.5) + 1.0 + 1.5));
  REQUIRE(cpu3.memory_bytes[0] - evaluate(problem, [&] { Plan p = plan; p.sharding = Sharding::kNone;
                                            return p; }()).memory_bytes[0] == 850 - 1200);
  // A calibrated all-gather link replaces the all-reduce one for gathers only.
  problem.cluster.intra_node_allgather = Link{50, 0.5};
  plan.sharding = Sharding::kZero2;
  REQUIRE(evaluate(problem, plan).sharding_s == Approx(1.5 + 2.5 + 1.0 + 1.5));
  // The ranks meeting at every unit slow the replica's compute (21 s) by the calibrated share,
  // on either kind of device; an unsharded plan does not pay it.
  problem.cluster.runtime.sharded_compute_slowdown = 0.25;
  REQUIRE(evaluate(problem, plan).sharding_s == Approx(1.5 + 2.5 + 1.0 + 1.5 + 0.25 * 21));
  problem.cluster.device.type = "cuda";
  const double overlapped_s = evaluate(problem, plan).sharding_s;
  problem.cluster.runtime.sharded_compute_slowdown = 0;
  REQUIRE(overlapped_s - evaluate(problem, plan).sharding_s == Approx(0.25 * 21));
  problem.cluster.runtime.sharded_compute_slowdown = 0.25;
  plan.sharding = Sharding::kNone;
  REQUIRE(evaluate(problem, plan).step_s == Approx(none.step_s));
}

TEST_CASE("evaluate: hybrid sharding (HSDP) shards within a group and all-reduces the shards across",
          "[evaluate][sharding]") {
  Problem problem = diamond_problem();  // a holds 100 B of parameters, c 200 B: P = 300 B
  problem.job.optimizer = Optimizer::kAdam;
  // 2 nodes x 2 CPU devices: 100 B/s inside a node, 10 B/s between nodes, no latency
  problem.cluster = test::make_cluster(2, 2, 100, 0, 10, 0);
  problem.cluster.device.type = "cpu";
  problem.cluster.device.memory_bandwidth_bytes_per_s = 100;
  Plan plan = test::make_plan(problem.graph, problem.cluster, 4, 1, MpMode::kPlacement, 1, {0, 0, 0, 0});
  plan.sharding = Sharding::kZero2;
  const Prediction full = evaluate(problem, plan);
  // One ring of 4 through both nodes: each hop at 10 B/s, 3/4 of b per collective; a (100 B)
  // 7.5 s per gather or reduce-scatter, c (200 B) 15 s; serial on CPU ranks.
  REQUIRE(full.sharding_s == Approx(2 * 7.5 + 2 * 15));
  plan.dp_shard = 2;  // replicas {0, 1} and {2, 3} shard; {0, 2} and {1, 3} all-reduce shards
  REQUIRE(plan.dp_replicate() == 2);
  const Prediction hybrid = evaluate(problem, plan);
  // In a node: a ring of 2 at 100 B/s, 1/2 of b: a 0.5 s, c 1 s per collective. Across: each
  // unit's shard (b / 2) all-reduced between the nodes, the two replicate groups sharing them.
  const AllReduceCost across = group_allreduce(problem.cluster, {0, 2}, 2);
  REQUIRE(hybrid.sharding_s == Approx(2 * 0.5 + 2 * 1.0 + across.time_s(50) + across.time_s(100)));
  REQUIRE(hybrid.sharding_s < full.sharding_s);
  // memory: shards over 2, not 4: P + 3P/2 + c's 200 B = 950 against P + 3P/4 + 200 = 725
  REQUIRE(hybrid.memory_bytes[0] - full.memory_bytes[0] == 950 - 725);
  // the optimizer updates 1/2 of the bytes, not 1/4
  REQUIRE(hybrid.optimizer_s - full.optimizer_s == Approx((150.0 - 75.0) * 7 / 100));
  // The plan says it, and only where it means something.
  REQUIRE(plan_to_json(plan, problem.graph).at("dp_shard") == 2);
  plan.dp_shard = 3;
  CHECK_THROWS_WITH(plan.validate_structure("plan"),
                    "plan: dp_shard must divide dp = 4 and be >= 2 (shard groups of dp_shard "
                    "replicas, dp / dp_shard of them replicating) (got 3)");
  // The search tries one node's replicas as the shard group across nodes.
  plan.dp_shard = 0;
  REQUIRE(shard_degrees(plan, problem.cluster) == std::vector<int64_t>{0, 2});
}

TEST_CASE("evaluate: a sharded pipeline gathers each stage on the fill path and reduce-scatters after",
          "[evaluate][sharding]") {
  Problem problem = two_stage_problem();
  Plan plan = two_stage_plan(problem);
  const Prediction none = evaluate(problem, plan);
  plan.sharding = Sharding::kZero2;
  const Prediction p = evaluate(problem, plan);
  REQUIRE(p.compute_s == none.compute_s);
  // each stage gathers 100 B (0.5 s) before its first forward: 1 s on the fill path; stage 0's
  // reduce-scatter (0.5 s) starts when its last backward ends, the schedule's end
  REQUIRE(p.sharding_s == Approx(1.0 + 0.5));
  REQUIRE(p.allreduce_s == 0);
  // sgd: 2 P unsharded; the stage keeps its parameters gathered and its gradients unsharded
  // through the micro-batches, plus its 50 B shard: 2 P + P / 2
  for (int s = 0; s < 2; ++s) REQUIRE(p.memory_bytes[s] - none.memory_bytes[s] == 50);
}
