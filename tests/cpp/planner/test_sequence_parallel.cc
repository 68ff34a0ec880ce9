// Sequence parallelism in the planner (docs/tensor_parallel.md "Sequence parallelism"): the
// graph's sequence_parallel field, the plan's sequence_parallel, the cost terms of
// tensor_parallel_cost.h against hand computation, and the search's choice.
#include <algorithm>
#include <chrono>

#include "catch.h"
#include "model_fixtures.h"
#include "planner/costs/evaluate.h"
#include "planner/costs/tensor_parallel_cost.h"
#include "planner/documents/presets.h"
#include "planner/reports/explain.h"
#include "planner/searches/search.h"

using namespace hybridplan;
using hybridplan::test::input_error_of;

namespace {

SequenceParallel sequence(SpRole role, int64_t max_degree, std::vector<TpCollective> forward = {},
                          std::vector<TpCollective> backward = {}) {
  SequenceParallel sp;
  sp.role = role;
  sp.max_degree = max_degree;
  sp.forward_collectives = std::move(forward);
  sp.backward_collectives = std::move(backward);
  return sp;
}

TpCollective all_reduce(int64_t bytes) { return {Collective::kAllReduce, bytes}; }
TpCollective all_gather(int64_t bytes) { return {Collective::kAllGather, bytes}; }
TpCollective reduce_scatter(int64_t bytes) { return {Collective::kReduceScatter, bytes}; }

// One transformer block in miniature, profiled at batch 1, every edge and output 100 bytes (no
// saved_bytes: the kept activations are the outputs):
//   ln    2 s / 4 s, 10 B      per_token; its weight gradient all-reduced (10 B) in backward
//   fc1   4 s / 8 s, 400 B     TP colwise (all split, activation split, backward all-reduce of
//                              100 B); SP colwise: forward all-gather 100 B, backward
//                              reduce-scatter 100 B
//   act   2 s / 2 s            TP sharded
//   fc2   4 s / 8 s, 400 B     TP rowwise (380 B split, activation split, forward all-reduce
//                              100 B); SP rowwise: forward reduce-scatter, backward all-gather
//   drop  2 s / 2 s            per_token, measured at degree 2: 1.2 s / 1.0 s
//   head  2 s / 4 s, 200 B     gather: forward all-gather 100 B, backward reduce-scatter 100 B
// max_degree 4 everywhere.
Graph block_graph() {
  const std::vector<test::NodeSpec> nodes = {{"ln", 2, 4, 10, 100},   {"fc1", 4, 8, 400, 100},
                                             {"act", 2, 2, 0, 100},   {"fc2", 4, 8, 400, 100},
                                             {"drop", 2, 2, 0, 100},  {"head", 2, 4, 200, 100}};
  std::vector<test::EdgeSpec> edges;
  for (NodeIndex v = 0; v + 1 < static_cast<NodeIndex>(nodes.size()); ++v) edges.push_back({v, v + 1, 100});
  Graph g = test::make_graph(nodes, edges, 1, "sp_block");
  g.nodes[0].sequence_parallel = sequence(SpRole::kPerToken, 4, {}, {all_reduce(10)});
  TensorParallel fc1 = test::tp_split(TpStyle::kColwise, 4, 400, true);
  fc1.backward_collective = all_reduce(100);
  g.nodes[1].tensor_parallel = fc1;
  g.nodes[1].sequence_parallel = sequence(SpRole::kColwise, 4, {all_gather(100)}, {reduce_scatter(100)});
  g.nodes[2].tensor_parallel = test::tp_split(TpStyle::kSharded, 4, 0, true);
  TensorParallel fc2 = test::tp_split(TpStyle::kRowwise, 4, 380, true);
  fc2.forward_collective = all_reduce(100);
  g.nodes[3].tensor_parallel = fc2;
  g.nodes[3].sequence_parallel = sequence(SpRole::kRowwise, 4, {reduce_scatter(100)}, {all_gather(100)});
  g.nodes[4].sequence_parallel = sequence(SpRole::kPerToken, 4);
  g.nodes[4].sequence_parallel->split_times = {{2, 1.2, 1.0}};
  g.nodes[5].sequence_parallel = sequence(SpRole::kGather, 4, {all_gather(100)}, {reduce_scatter(100)});
  g.finalize("sp_block");
  return g;
}

// One node of `devices` devices at 100 B/s and 0.5 s latency: over two devices an all-reduce
// of B bytes takes 2 * 1/2 * B / 100 + 2 * 0.5 = B / 100 + 1 s, an all-gather or reduce-scatter
// B / 200 + 0.5 s.
Problem block_problem(int64_t devices = 2) {
  Problem p;
  p.graph = block_graph();
  p.cluster = test::make_cluster(1, devices, 100, 0.5, 100, 0);
  return p;
}

Plan single_replica_plan(const Problem& problem, int64_t tp, bool sequence_parallel) {
  Plan plan = test::make_plan(problem.graph, problem.cluster, 1, 1, MpMode::kPlacement, 1,
                              std::vector<int32_t>(problem.graph.nodes.size(), 0));
  plan.tp = tp;
  plan.world_size = tp;
  plan.sequence_parallel = sequence_parallel;
  return plan;
}

std::string graph_error(const Json& graph) {
  return input_error_of([&] { graph_from_json(graph, "g.json"); });
}

}  // namespace

TEST_CASE("sequence_parallel: parsed, written back canonically, absent when not set", "[sp][graph]") {
  const Graph g = block_graph();
  const Json j = graph_to_json(g);
  const Graph back = graph_from_json(j, "round trip");
  REQUIRE(graph_sha256(back) == graph_sha256(g));
  CHECK(graph_to_json(back) == j);
  REQUIRE(back.nodes[0].sequence_parallel.has_value());
  const SequenceParallel& ln = *back.nodes[0].sequence_parallel;
  CHECK(ln.role == SpRole::kPerToken);
  CHECK(ln.max_degree == 4);
  CHECK(ln.forward_collectives.empty());
  REQUIRE(ln.backward_collectives.size() == 1);
  CHECK(ln.backward_collectives[0].op == Collective::kAllReduce);
  CHECK(ln.backward_collectives[0].bytes == 10);
  CHECK(back.nodes[1].sequence_parallel->role == SpRole::kColwise);
  CHECK(back.nodes[3].sequence_parallel->forward_collectives[0].op == Collective::kReduceScatter);
  CHECK(back.nodes[5].sequence_parallel->role == SpRole::kGather);
  REQUIRE(back.nodes[4].sequence_parallel->split_times.size() == 1);
  CHECK(back.nodes[4].sequence_parallel->split_times[0].degree == 2);
  CHECK(back.nodes[4].sequence_parallel->split_times[0].forward_s == 1.2);
  CHECK(!back.nodes[2].sequence_parallel);
  CHECK(j["nodes"][0]["sequence_parallel"] ==
        Json::parse(R"({"role": "per_token", "max_degree": 4, "forward_collectives": [],
                        "backward_collectives": [{"op": "all_reduce", "bytes": 10}]})"));
  CHECK(j["nodes"][4]["sequence_parallel"]["split_times"] ==
        Json::parse(R"([{"degree": 2, "forward_s": 1.2, "backward_s": 1.0}])"));
  CHECK(!j["nodes"][2].contains("sequence_parallel"));
  CHECK(g.has_sequence_parallel());
  // The lists may be left out; a graph without the field hashes as before it existed.
  Json minimal = j;
  minimal["nodes"][4]["sequence_parallel"] = Json{{"role", "per_token"}, {"max_degree", 4}};
  CHECK(graph_from_json(minimal, "minimal").nodes[4].sequence_parallel->forward_collectives.empty());
  Graph plain = g;
  for (Node& node : plain.nodes) node.sequence_parallel.reset();
  CHECK(!plain.has_sequence_parallel());
  Json plain_json = j;
  for (Json& node : plain_json["nodes"]) node.erase("sequence_parallel");
  CHECK(graph_to_json(plain) == plain_json);
}

TEST_CASE("sequence_parallel: every rule names its JSON path", "[sp][graph]") {
  const Json ok = graph_to_json(block_graph());
  const auto with = [&](int node, const std::string& key, const Json& value) {
    Json j = ok;
    j["nodes"][node]["sequence_parallel"][key] = value;
    return graph_error(j);
  };
  CHECK(with(0, "role", "diagonal") ==
        "g.json: nodes[0].sequence_parallel.role must be \"per_token\", \"gather\", \"colwise\" "
        "or \"rowwise\" (got \"diagonal\")");
  CHECK(with(0, "max_degree", 1) ==
        "g.json: nodes[0].sequence_parallel.max_degree must be >= 2 (the sequence splits over at "
        "least two TP ranks) (got 1)");
  CHECK(with(0, "max_degree", "4") ==
        "g.json: nodes[0].sequence_parallel.max_degree must be an integer (got \"4\")");
  CHECK(with(0, "forward_collectives", Json{{"op", "all_gather"}, {"bytes", 1}}) ==
        "g.json: nodes[0].sequence_parallel.forward_collectives must be a JSON array (got "
        "{\"bytes\":1,\"op\":\"all_gather\"})");
  CHECK(with(0, "backward_collectives", Json::parse(R"([{"op": "broadcast", "bytes": 1}])")) ==
        "g.json: nodes[0].sequence_parallel.backward_collectives[0].op must be \"all_reduce\", "
        "\"all_gather\" or \"reduce_scatter\" (got \"broadcast\")");
  CHECK(with(0, "backward_collectives", Json::parse(R"([{"op": "all_reduce", "bytes": -3}])")) ==
        "g.json: nodes[0].sequence_parallel.backward_collectives[0].bytes must be >= 0 (got -3)");
  CHECK(with(0, "backward_collectives",
             Json::parse(R"([{"op": "all_reduce", "bytes": 3, "fixed_bytes": 1}])")) ==
        "g.json: nodes[0].sequence_parallel.backward_collectives[0].fixed_bytes must be true or "
        "false (got 1)");
  CHECK(with(0, "forward_collectives", Json::parse(R"([{"op": "all_reduce"}])")) ==
        "g.json: nodes[0].sequence_parallel.forward_collectives[0].bytes is required");
  CHECK(with(4, "split_times", Json::parse(R"([{"degree": 3, "forward_s": 1, "backward_s": 1}])")) ==
        "g.json: nodes[4].sequence_parallel.split_times[0].degree must be >= 2 and divide "
        "max_degree = 4 (got 3)");
  CHECK(with(5, "split_times", Json::parse(R"([{"degree": 2, "forward_s": 1, "backward_s": 1}])")) ==
        "g.json: nodes[5].sequence_parallel.split_times must be absent for role \"gather\" (only "
        "a \"per_token\" node runs on a share of the tokens) (got 1 entries)");
  CHECK(with(0, "saved_share", 1.4) ==
        "g.json: nodes[0].sequence_parallel.saved_share must be absent for role \"per_token\" "
        "(only a \"gather\" node runs on inputs gathered apart) (got 1.400000)");
  CHECK(with(5, "saved_share", 0) ==
        "g.json: nodes[5].sequence_parallel.saved_share must be a finite number > 0 (kept "
        "activations under sequence parallelism over those kept in one process) (got 0.000000)");
  CHECK(with(5, "saved_share", "1.4") ==
        "g.json: nodes[5].sequence_parallel.saved_share must be a number (got \"1.4\")");
  // the roles against tensor_parallel
  CHECK(with(0, "role", "colwise") ==
        "g.json: nodes[0].sequence_parallel.role must be \"per_token\" or \"gather\" for a node "
        "without tensor_parallel (\"colwise\" and \"rowwise\" replace a split node's TP "
        "collectives) (got \"colwise\")");
  CHECK(with(1, "role", "per_token") ==
        "g.json: nodes[1].sequence_parallel.role must be \"colwise\" or \"rowwise\" for a node "
        "with tensor_parallel (\"per_token\" and \"gather\" nodes run outside the TP region) (got "
        "\"per_token\")");
  Json sharded = ok;
  sharded["nodes"][2]["sequence_parallel"] = Json{{"role", "rowwise"}, {"max_degree", 4}};
  CHECK(graph_error(sharded) ==
        "g.json: nodes[2].sequence_parallel.role must not be \"colwise\" or \"rowwise\" for "
        "tensor_parallel style \"sharded\" (it runs between the split nodes, inside the TP "
        "region) (got \"rowwise\")");
  Json missing = ok;
  missing["nodes"][0]["sequence_parallel"].erase("role");
  CHECK(graph_error(missing) == "g.json: nodes[0].sequence_parallel.role is required");
  Json not_object = ok;
  not_object["nodes"][0]["sequence_parallel"] = true;
  CHECK(graph_error(not_object) == "g.json: nodes[0].sequence_parallel must be a JSON object (got true)");
}

TEST_CASE("plan sequence_parallel: written only when true, refused where it cannot run",
          "[sp][plan]") {
  const Problem problem = block_problem(4);
  Plan plan = single_replica_plan(problem, 2, true);
  REQUIRE_NOTHROW(plan.validate("plan", problem.graph, problem.cluster));
  const Json j = plan_to_json(plan, problem.graph, problem.cluster);
  CHECK(j["sequence_parallel"] == true);
  CHECK(plan_from_json(j, "plan").sequence_parallel);
  Plan off = single_replica_plan(problem, 2, false);
  const Json off_json = plan_to_json(off, problem.graph);
  CHECK(!off_json.contains("sequence_parallel"));  // old plans: absent = false
  CHECK(!plan_from_json(off_json, "plan").sequence_parallel);
  Json bad = j;
  bad["sequence_parallel"] = 1;
  CHECK(input_error_of([&] { plan_from_json(bad, "plan"); }) ==
        "plan: sequence_parallel must be true or false (got 1)");

  // needs tp > 1 (structure: no graph needed)
  Plan one = single_replica_plan(problem, 1, true);
  CHECK(input_error_of([&] { plan_from_json(plan_to_json(one, problem.graph), "plan"); }) ==
        "plan: sequence_parallel must be false with tp = 1 (sequence parallelism splits the "
        "tokens over a TP group) (got true)");
  // not with a pipeline: the executor splits the sequence between a module's blocks, and a
  // pipeline stage is a traced graph
  Plan pipeline = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline, 2,
                                  {0, 0, 0, 1, 1, 1}, 2, Schedule::kGpipe);
  pipeline.tp = 2;
  pipeline.world_size = 4;
  pipeline.mesh = {{0, 2}};
  pipeline.sequence_parallel = true;
  CHECK(input_error_of([&] { pipeline.validate("plan", problem.graph, problem.cluster); }) ==
        "plan: sequence_parallel must be false for a pipeline plan (mode pipeline): sequence "
        "parallelism is applied to placement plans only (got true)");

  // the graph must have sequence_parallel nodes
  Graph plain = problem.graph;
  for (Node& node : plain.nodes) node.sequence_parallel.reset();
  plain.finalize("plain");
  plan.graph_sha256 = graph_sha256(plain);
  CHECK(input_error_of([&] { plan.validate("plan", plain, problem.cluster); }) ==
        "plan: sequence_parallel must be false: graph \"sp_block\" has no node with "
        "sequence_parallel (profile it again with sequence parallelism detection) (got true)");
  CHECK(sequence_parallel_refusal(plain, 2).has_value());

  // tp must divide every sequence_parallel node's max_degree
  Graph short_sequence = problem.graph;
  short_sequence.nodes[4].sequence_parallel->max_degree = 2;
  short_sequence.nodes[4].sequence_parallel->split_times.clear();
  short_sequence.finalize("short");
  Plan four = single_replica_plan(problem, 4, true);
  four.graph_sha256 = graph_sha256(short_sequence);
  CHECK(input_error_of([&] { four.validate("plan", short_sequence, problem.cluster); }) ==
        "plan: sequence_parallel must be false with tp = 4: it does not divide node \"drop\"'s "
        "sequence_parallel.max_degree 2 (every node with sequence_parallel splits its tokens "
        "over the TP group) (got true)");
  four.sequence_parallel = false;  // tensor parallelism alone stays valid
  CHECK_NOTHROW(four.validate("plan", short_sequence, problem.cluster));
  plan.graph_sha256 = graph_sha256(short_sequence);
  CHECK_NOTHROW(plan.validate("plan", short_sequence, problem.cluster));  // tp = 2 divides 2

  // every colwise / rowwise node must split at tp
  Graph narrow = problem.graph;
  narrow.nodes[3].tensor_parallel->max_degree = 2;  // fc2 runs whole at tp = 4
  narrow.finalize("narrow");
  four.sequence_parallel = true;
  four.graph_sha256 = graph_sha256(narrow);
  CHECK(input_error_of([&] { four.validate("plan", narrow, problem.cluster); }) ==
        "plan: sequence_parallel must be false with tp = 4: node \"fc2\" (sequence_parallel role "
        "\"rowwise\") runs whole at this tp (tensor_parallel.max_degree 2; a tied group splits "
        "only where all its nodes do), so it cannot enter or leave the sequence-parallel region "
        "(got true)");
  CHECK(!sequence_parallel_refusal(narrow, 2).has_value());
  // Evaluator checks the plan the same way
  Problem narrow_problem = problem;
  narrow_problem.graph = narrow;
  CHECK_THROWS_AS(evaluate(narrow_problem, four), InputError);
}

TEST_CASE("sp cost terms: per-token ratio and activation shares", "[sp][cost]") {
  const Graph g = block_graph();
  // drop measured at degree 2: 0.6 forward, 0.5 backward; beyond it ratio(2) * 2 / t
  CHECK(sp_time_ratio(g.nodes[4], 2, false) == Approx(0.6));
  CHECK(sp_time_ratio(g.nodes[4], 2, true) == Approx(0.5));
  CHECK(sp_time_ratio(g.nodes[4], 4, false) == Approx(0.3));
  CHECK(sp_time_ratio(g.nodes[4], 1, false) == 1);
  CHECK(sp_time_ratio(g.nodes[0], 4, true) == Approx(0.25));  // nothing measured: 1/t
  CHECK(sp_time_ratio(g.nodes[5], 4, true) == 1);             // gather: whole
  CHECK(sp_time_ratio(g.nodes[1], 4, true) == 1);             // colwise: TP's ratio instead
  CHECK(tp_activation_shares(g, 2, false) == std::vector<double>{1, 0.5, 0.5, 0.5, 1, 1});
  CHECK(tp_activation_shares(g, 2, true) == std::vector<double>{0.5, 0.5, 0.5, 0.5, 0.5, 1});
  CHECK(tp_activation_shares(g, 4, true) == std::vector<double>{0.25, 0.25, 0.25, 0.25, 0.25, 1});
  CHECK(tp_activation_shares(g, 1, true) == std::vector<double>(6, 1.0));
  // a gather node whose inputs, gathered apart, are kept apart: its measured share, under
  // sequence parallelism only
  Graph shared = block_graph();
  shared.nodes[5].sequence_parallel->saved_share = 1.4;
  CHECK(tp_activation_shares(shared, 2, true) == std::vector<double>{0.5, 0.5, 0.5, 0.5, 0.5, 1.4});
  CHECK(tp_activation_shares(shared, 2, false) == std::vector<double>{1, 0.5, 0.5, 0.5, 1, 1});
  const Json written = graph_to_json(shared);
  CHECK(written["nodes"][5]["sequence_parallel"]["saved_share"] == 1.4);
  CHECK(graph_from_json(written, "g.json").nodes[5].sequence_parallel->saved_share == 1.4);
  CHECK_FALSE(graph_to_json(g)["nodes"][5]["sequence_parallel"].contains("saved_share"));
}

TEST_CASE("evaluate tp=2 sp: per-token nodes on half the tokens, SP collectives for TP's",
          "[sp][evaluate]") {
  const Problem problem = block_problem();
  const Prediction off = evaluate(problem, single_replica_plan(problem, 2, false));
  const Prediction on = evaluate(problem, single_replica_plan(problem, 2, true));
  REQUIRE(off.feasible);
  REQUIRE(on.feasible);
  // Off (tensor parallelism alone): ln 2 + 4; fc1 4/2 + 8/2 + all-reduce(100) 2; act 1 + 1;
  // fc2 2 + 2 + 4; drop 2 + 2; head 2 + 4 (no tensor_parallel: whole).
  CHECK(off.compute_s == Approx(6 + 8 + 2 + 8 + 4 + 6));
  CHECK(off.tp_comm_s == Approx(4));
  // On: ln (1/2) 1 + 2 + all-reduce(10) 1.1; fc1 2 + all-gather(100) 1 + 4 + reduce-scatter
  // 1; act 2; fc2 2 + reduce-scatter 1 + 4 + all-gather 1; drop 1.2 + 1.0 (measured); head
  // 2 + all-gather 1 + 4 + reduce-scatter 1.
  CHECK(on.compute_s == Approx(4.1 + 8 + 2 + 8 + 2.2 + 8));
  CHECK(on.tp_comm_s == Approx(1.1 + 2 + 2 + 2));
  // Memory: the per-token nodes ln and drop keep half their 100 B (parameters, optimizer,
  // workspace unchanged).
  CHECK(off.memory_bytes[0] - on.memory_bytes[0] == (100 + 100) / 2);
  // the node times the evaluator hands the searches agree
  const Evaluator evaluator(problem);
  const NodeTimes& times = evaluator.node_times(1, 1, 2, true);
  CHECK(times.forward_s == std::vector<double>{1, 3, 1, 3, 1.2, 3});
  CHECK(times.backward_comm_s[0] == Approx(1.1));
  CHECK(evaluator.node_times(1, 1, 2, false).forward_s[0] == 2);
  CHECK(evaluator.activation_shares(2, true)[4] == 0.5);
  // At batch 2 (times linear in the batch) ln's backward is 8 / 2 plus the all-reduce of its
  // 10 B scaled to 20 B: 1.2 s; with fixed_bytes (a parameter gradient) 10 B: 1.1 s.
  CHECK(evaluator.node_times(2, 1, 2, true).backward_s[0] == Approx(4 + 1.2));
  Problem fixed = problem;
  fixed.graph.nodes[0].sequence_parallel->backward_collectives[0].fixed_bytes = true;
  fixed.graph.finalize("sp_block");
  CHECK(Evaluator(fixed).node_times(2, 1, 2, true).backward_s[0] == Approx(4 + 1.1));
  const Json j = graph_to_json(fixed.graph);
  CHECK(j["nodes"][0]["sequence_parallel"]["backward_collectives"][0]["fixed_bytes"] == true);
  CHECK(graph_from_json(j, "g").nodes[0].sequence_parallel->backward_collectives[0].fixed_bytes);
  CHECK(!graph_to_json(problem.graph)["nodes"][0]["sequence_parallel"]["backward_collectives"][0]
             .contains("fixed_bytes"));
}

TEST_CASE("evaluate tp=2 sp and explain", "[sp][evaluate]") {
  const Problem problem = block_problem(2);
  Plan plan = single_replica_plan(problem, 2, true);
  const Prediction p = evaluate(problem, plan);
  REQUIRE(p.feasible);
  // the profiled batch: ln 1.1 + fc1 2 + fc2 2 + head 2
  CHECK(p.tp_comm_s == Approx(7.1));
  plan.predicted = p;
  const std::string text = explain(problem, plan);
  CHECK_THAT(text, Catch::Matchers::Contains("2 devices = dp 1 x mp 1 x tp 2 sp, mode placement"));
  CHECK_THAT(text, Catch::Matchers::Contains("sequence parallel (the nodes between the TP regions "
                                             "run on 1/2 of the tokens)"));
  CHECK_THAT(text, Catch::Matchers::Contains("(sequence parallelism's included)"));
  plan.sequence_parallel = false;
  CHECK_THAT(explain(problem, plan), !Catch::Matchers::Contains(" sp,"));
}

namespace {

// A GPT-like block on one DGX A100 (8 x 80 GB) at batch 8: ln (per_token, keeps `ln_saved`
// bytes), fc1 (colwise) and fc2 (rowwise) of 1 GB each, head (gather). The collectives of
// tensor parallelism alone and of sequence parallelism move the same bytes (Megatron's: an
// all-reduce is a reduce-scatter plus an all-gather), and ln's 64 MiB weight gradient is
// all-reduced under sequence parallelism (`ln_reduce_bytes`).
Problem gpt_block_problem(int64_t ln_saved, int64_t ln_reduce_bytes) {
  constexpr int64_t kActivation = int64_t{64} << 20;
  Problem p;
  p.graph = test::make_graph({{"ln", 1e-3, 2e-3, 1 << 20, kActivation},
                              {"fc1", 10e-3, 20e-3, 1'000'000'000, kActivation},
                              {"fc2", 10e-3, 20e-3, 1'000'000'000, kActivation},
                              {"head", 5e-3, 10e-3, 1 << 20, kActivation}},
                             {{0, 1, kActivation}, {1, 2, kActivation}, {2, 3, kActivation}}, 8,
                             "gpt_block");
  p.graph.nodes[0].saved_bytes = ln_saved;
  p.graph.nodes[0].sequence_parallel =
      sequence(SpRole::kPerToken, 8, {}, {all_reduce(ln_reduce_bytes)});
  TensorParallel fc1 = test::tp_split(TpStyle::kColwise, 8, 1'000'000'000, true);
  fc1.backward_collective = all_reduce(kActivation);
  p.graph.nodes[1].tensor_parallel = fc1;
  p.graph.nodes[1].sequence_parallel =
      sequence(SpRole::kColwise, 8, {all_gather(kActivation)}, {reduce_scatter(kActivation)});
  TensorParallel fc2 = test::tp_split(TpStyle::kRowwise, 8, 1'000'000'000, true);
  fc2.forward_collective = all_reduce(kActivation);
  p.graph.nodes[2].tensor_parallel = fc2;
  p.graph.nodes[2].sequence_parallel =
      sequence(SpRole::kRowwise, 8, {reduce_scatter(kActivation)}, {all_gather(kActivation)});
  p.graph.nodes[3].sequence_parallel = sequence(SpRole::kGather, 8, {all_gather(kActivation)}, {});
  p.graph.finalize("gpt_block");
  p.cluster = load_cluster("dgx-a100");
  p.cluster.num_nodes = 1;
  return p;
}

}  // namespace

TEST_CASE("search: sequence parallelism where the per-token activations bind memory", "[sp][search]") {
  // ln keeps 90 GB: more than a device's 80 GB whole, whatever the plan does about it (recompute
  // rebuilds one node's activations at a time, and that node is ln); split over the tokens of
  // a TP group of 2 or more it fits. Placement only, so that micro-batches do not shrink it.
  const Problem tight = gpt_block_problem(90'000'000'000, int64_t{64} << 20);
  SearchOptions options;
  options.pipeline = false;
  options.top_k = 3;
  const SearchResult r = search(tight, options);
  REQUIRE(!r.plans.empty());
  for (const Plan& plan : r.plans) {
    INFO("dp=" << plan.dp << " tp=" << plan.tp);
    CHECK(plan.tp >= 2);
    CHECK(plan.sequence_parallel);
    CHECK_NOTHROW(plan.validate("plan", tight.graph, tight.cluster));
    CHECK(plan_to_json(plan, tight.graph)["sequence_parallel"] == true);
  }
  SearchOptions off = options;
  off.sequence_parallel = SequenceParallelSearch::kOff;
  CHECK_THROWS_AS(search(tight, off), InfeasibleError);

  // With memory to spare and ln's weight gradient all-reduce made costly (10 GB), sequence
  // parallelism loses: no plan of the best takes it, though the space has such plans.
  const Problem roomy = gpt_block_problem(int64_t{64} << 20, 10'000'000'000);
  const SearchResult best = search(roomy, options);
  REQUIRE(!best.plans.empty());
  for (const Plan& plan : best.plans) CHECK(!plan.sequence_parallel);
  SearchOptions on = options;
  on.sequence_parallel = SequenceParallelSearch::kOn;
  const SearchResult forced = search(roomy, on);
  REQUIRE(!forced.plans.empty());
  for (const Plan& plan : forced.plans) CHECK((plan.tp == 1 || plan.sequence_parallel));
  CHECK(std::any_of(forced.plans.begin(), forced.plans.end(),
                    [](const Plan& p) { return p.sequence_parallel; }));
}

TEST_CASE("search space: each tp point without and with sequence parallelism", "[sp][search]") {
  Problem problem = gpt_block_problem(int64_t{64} << 20, int64_t{64} << 20);
  // ln's tokens split at most in four: tp = 8 has no sequence parallelism
  problem.graph.nodes[0].sequence_parallel->max_degree = 4;
  problem.graph.finalize("gpt_block");
  // (placement points: sequence parallelism is placement only, Plan::validate_structure)
  const auto count = [&](const SearchOptions& options, int64_t tp, bool sp,
                         bool placement_only = false) {
    int64_t n = 0;
    for (const SearchSpacePoint& p : search_space(problem, options, nullptr)) {
      if (placement_only && p.mode != MpMode::kPlacement) continue;
      n += p.tp == tp && p.sequence_parallel == sp;
      if (p.sequence_parallel) CHECK((p.tp > 1 && p.mode == MpMode::kPlacement));
    }
    return n;
  };
  const SearchOptions automatic;
  for (const int64_t tp : {2, 4}) {
    CHECK(count(automatic, tp, false, true) > 0);
    CHECK(count(automatic, tp, true) == count(automatic, tp, false, true));
  }
  CHECK(count(automatic, 8, false) > 0);
  CHECK(count(automatic, 8, true) == 0);
  CHECK(count(automatic, 1, true) == 0);
  // adjacent: without first, so that ties go to the plan without
  const std::vector<SearchSpacePoint> points = search_space(problem, automatic, nullptr);
  for (size_t i = 0; i < points.size(); ++i) {
    if (points[i].sequence_parallel) {
      REQUIRE(i > 0);
      CHECK(!points[i - 1].sequence_parallel);
      CHECK(points[i - 1].tp == points[i].tp);
      CHECK(points[i - 1].mp == points[i].mp);
      CHECK(points[i - 1].mode == points[i].mode);
    }
  }
  SearchOptions off;
  off.sequence_parallel = SequenceParallelSearch::kOff;
  CHECK(count(off, 2, true) == 0);
  CHECK(count(off, 2, false) == count(automatic, 2, false));
  SearchOptions on;
  on.sequence_parallel = SequenceParallelSearch::kOn;
  std::vector<std::string> skipped;
  for (const SearchSpacePoint& p : search_space(problem, on, &skipped)) {
    CHECK((p.tp == 1 || (p.sequence_parallel && p.mode == MpMode::kPlacement)));
    CHECK(p.tp != 8);
  }
  CHECK(count(on, 4, true) == count(automatic, 4, true));
  CHECK(std::find(skipped.begin(), skipped.end(),
                  "tp=8: left out with sequence parallelism on: sequence_parallel must be false "
                  "with tp = 8: it does not divide node \"ln\"'s sequence_parallel.max_degree 4 "
                  "(every node with sequence_parallel splits its tokens over the TP group)") !=
        skipped.end());
  // kOn on a graph without sequence_parallel
  Problem plain = problem;
  for (Node& node : plain.graph.nodes) node.sequence_parallel.reset();
  plain.graph.finalize("gpt_block");
  CHECK(input_error_of([&] { search_space(plain, on, nullptr); }) ==
        "search options: sequence_parallel must be \"auto\" or \"off\": no tensor-parallel "
        "degree of the space allows sequence parallelism (tp = 2: sequence_parallel must be "
        "false: graph \"gpt_block\" has no node with sequence_parallel (profile it again with "
        "sequence parallelism detection)) (got \"on\")");
  CHECK(sequence_parallel_search_from_name("on") == SequenceParallelSearch::kOn);
  CHECK(!sequence_parallel_search_from_name("yes"));
  CHECK(std::string(sequence_parallel_search_name(SequenceParallelSearch::kAuto)) == "auto");
}

TEST_CASE("search: planning time with sequence parallelism in the space", "[sp][search]") {
  // bench_search's TP chain (1000 nodes on 4096 devices, every fourth node a colwise split of
  // max_degree 8) with every other node per-token under sequence parallelism: the tp > 1
  // points come twice.
  Problem problem;
  problem.graph = test::tp_chain_graph();
  for (int i = 0; i < 1000; ++i) {
    if (i % 4 == 0) {
      problem.graph.nodes[i].sequence_parallel =
          sequence(SpRole::kColwise, 8, {all_gather(int64_t{1} << 22)}, {reduce_scatter(int64_t{1} << 22)});
    } else if (i % 2 == 1) {
      problem.graph.nodes[i].sequence_parallel = sequence(SpRole::kPerToken, 8);
    }
  }
  problem.graph.finalize("chain1000");
  problem.cluster = load_cluster("dgx1-v100");
  problem.cluster.num_nodes = 512;
  const auto start = std::chrono::steady_clock::now();
  const SearchResult r = search(problem, SearchOptions{});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(!r.plans.empty());
  CHECK(seconds < 20);  // generous for sanitizer and debug builds
}
