// Tensor parallelism in the planner (docs/tensor_parallel.md): the graph's tensor_parallel
// field, the plan's tp, the cost terms of tensor_parallel_cost.h against hand computation, and
// the search over tp.
#include <algorithm>
#include <chrono>

#include "catch.h"
#include "model_fixtures.h"
#include "planner/costs/evaluate.h"
#include "planner/costs/memory_cost.h"
#include "planner/costs/tensor_parallel_cost.h"
#include "planner/documents/presets.h"
#include "planner/reports/explain.h"
#include "planner/searches/search.h"

using namespace hybridplan;
using hybridplan::test::input_error_of;

namespace {

// A two-layer transformer in miniature, profiled at batch 1, every edge and output 100 bytes:
// per layer i a layer norm ln<i> (1 s / 2 s, 10 B, not split), fc1<i> (colwise, 4 s / 8 s,
// 400 B all split, its input gradient all-reduced: 100 B), act<i> (sharded, 2 s / 2 s), fc2<i>
// (rowwise, 4 s / 8 s, 400 B of which the 20 B bias is not split, its output all-reduced:
// 100 B); then head (colwise_gather, 2 s / 4 s, 200 B split, its output all-gathered: 100 B).
// fc1<0> was measured split in two: 3 s / 5 s. max_degree 4 everywhere.
Graph transformer_graph() {
  std::vector<test::NodeSpec> nodes;
  std::vector<test::EdgeSpec> edges;
  for (int i = 0; i < 2; ++i) {
    const std::string l = std::to_string(i);
    nodes.push_back({"ln" + l, 1, 2, 10, 100});
    nodes.push_back({"fc1_" + l, 4, 8, 400, 100});
    nodes.push_back({"act" + l, 2, 2, 0, 100});
    nodes.push_back({"fc2_" + l, 4, 8, 400, 100});
  }
  nodes.push_back({"head", 2, 4, 200, 100});
  for (NodeIndex v = 0; v + 1 < static_cast<NodeIndex>(nodes.size()); ++v) edges.push_back({v, v + 1, 100});
  Graph g = test::make_graph(nodes, edges, 1, "tiny_transformer");
  for (int i = 0; i < 2; ++i) {
    TensorParallel fc1 = test::tp_split(TpStyle::kColwise, 4, 400, true);
    fc1.backward_collective = TpCollective{Collective::kAllReduce, 100};
    if (i == 0) fc1.split_times = {{2, 3, 5}};
    g.nodes[4 * i + 1].tensor_parallel = fc1;
    g.nodes[4 * i + 2].tensor_parallel = test::tp_split(TpStyle::kSharded, 4, 0, true);
    TensorParallel fc2 = test::tp_split(TpStyle::kRowwise, 4, 380, true);
    fc2.forward_collective = TpCollective{Collective::kAllReduce, 100};
    g.nodes[4 * i + 3].tensor_parallel = fc2;
  }
  TensorParallel head = test::tp_split(TpStyle::kColwiseGather, 4, 200, false);
  head.forward_collective = TpCollective{Collective::kAllGather, 100};
  g.nodes[8].tensor_parallel = head;
  g.finalize("tiny_transformer");
  return g;
}

// One node of `devices` devices at 100 B/s and 0.5 s latency (an all-reduce of 100 B over two
// devices: 2 * 0.5 + 100 / 100 = 2 s; an all-gather: 0.5 + 50 / 100 = 1 s).
Problem transformer_problem(int64_t num_nodes = 1, int64_t devices = 2) {
  Problem p;
  p.graph = transformer_graph();
  p.cluster = test::make_cluster(num_nodes, devices, 100, 0.5, 100, 0);
  return p;
}

Plan single_replica_plan(const Problem& problem, int64_t tp) {
  Plan plan = test::make_plan(problem.graph, problem.cluster, 1, 1, MpMode::kPlacement, 1,
                              std::vector<int32_t>(problem.graph.nodes.size(), 0));
  plan.tp = tp;
  plan.world_size = tp;
  return plan;
}

Json graph_json_with(const Json& tensor_parallel) {
  Json j = graph_to_json(transformer_graph());
  j["nodes"][1]["tensor_parallel"] = tensor_parallel;
  return j;
}

std::string graph_error(const Json& tensor_parallel) {
  return input_error_of([&] { graph_from_json(graph_json_with(tensor_parallel), "g.json"); });
}

}  // namespace

TEST_CASE("tensor_parallel: parsed, written back canonically, absent when not set", "[tp][graph]") {
  const Graph g = transformer_graph();
  const Graph back = graph_from_json(graph_to_json(g), "round trip");
  REQUIRE(graph_sha256(back) == graph_sha256(g));
  REQUIRE(back.nodes[1].tensor_parallel.has_value());
  const TensorParallel& fc1 = *back.nodes[1].tensor_parallel;
  CHECK(fc1.style == TpStyle::kColwise);
  CHECK(fc1.max_degree == 4);
  CHECK(fc1.split_param_bytes == 400);
  CHECK(fc1.activation_split);
  CHECK(!fc1.forward_collective);
  REQUIRE(fc1.backward_collective);
  CHECK(fc1.backward_collective->op == Collective::kAllReduce);
  CHECK(fc1.backward_collective->bytes == 100);
  REQUIRE(fc1.split_times.size() == 1);
  CHECK(fc1.split_times[0].degree == 2);
  CHECK(back.nodes[8].tensor_parallel->forward_collective->op == Collective::kAllGather);
  CHECK(graph_to_json(g)["nodes"][8]["tensor_parallel"]["style"] == "colwise_gather");
  CHECK(graph_to_json(g)["nodes"][8]["tensor_parallel"]["forward_collective"]["op"] == "all_gather");
  // A graph without the field hashes as it did before the field existed: nothing is written.
  Graph plain = g;
  for (Node& node : plain.nodes) node.tensor_parallel.reset();
  CHECK(!graph_to_json(plain)["nodes"][1].contains("tensor_parallel"));
  CHECK(!plain.has_tensor_parallel());
  CHECK(g.has_tensor_parallel());
  CHECK(graph_sha256(plain) != graph_sha256(g));
}

TEST_CASE("tensor_parallel: every rule names its JSON path", "[tp][graph]") {
  const Json ok = graph_to_json(transformer_graph())["nodes"][1]["tensor_parallel"];
  const auto with = [&](const std::string& key, const Json& value) {
    Json j = ok;
    j[key] = value;
    return graph_error(j);
  };
  CHECK(with("style", "diagonal") ==
        "g.json: nodes[1].tensor_parallel.style must be \"colwise\", \"rowwise\", \"sharded\", "
        "\"vocab_rowwise\" or \"colwise_gather\" (got \"diagonal\")");
  CHECK(with("max_degree", 0) == "g.json: nodes[1].tensor_parallel.max_degree must be >= 1 (got 0)");
  CHECK(with("split_param_bytes", 401) ==
        "g.json: nodes[1].tensor_parallel.split_param_bytes must be in 0..param_bytes = 0..400 "
        "(the part of the node's parameters the TP ranks divide) (got 401)");
  CHECK(with("split_param_bytes", -1) ==
        "g.json: nodes[1].tensor_parallel.split_param_bytes must be in 0..param_bytes = 0..400 "
        "(the part of the node's parameters the TP ranks divide) (got -1)");
  CHECK(with("activation_split", 1) ==
        "g.json: nodes[1].tensor_parallel.activation_split must be true or false (got 1)");
  CHECK(with("backward_collective", Json{{"op", "broadcast"}, {"bytes", 1}}) ==
        "g.json: nodes[1].tensor_parallel.backward_collective.op must be \"all_reduce\", "
        "\"all_gather\" or \"reduce_scatter\" (got \"broadcast\")");
  CHECK(with("forward_collective", Json{{"op", "all_reduce"}, {"bytes", -5}}) ==
        "g.json: nodes[1].tensor_parallel.forward_collective.bytes must be >= 0 (got -5)");
  CHECK(with("split_times", Json::parse(R"([{"degree": 3, "forward_s": 1, "backward_s": 1}])")) ==
        "g.json: nodes[1].tensor_parallel.split_times[0].degree must be >= 2 and divide "
        "max_degree = 4 (got 3)");
  CHECK(with("split_times", Json::parse(R"([{"degree": 4, "forward_s": 1, "backward_s": 1},
                                           {"degree": 2, "forward_s": 1, "backward_s": 1}])")) ==
        "g.json: nodes[1].tensor_parallel.split_times[1].degree must be greater than the "
        "previous entry's 4 (strictly increasing) (got 2)");
  CHECK(with("split_times", Json::parse(R"([{"degree": 2, "forward_s": -1, "backward_s": 1}])")) ==
        "g.json: nodes[1].tensor_parallel.split_times[0].forward_s must be finite and >= 0 (got -1)");
  Json missing = ok;
  missing.erase("activation_split");
  CHECK(graph_error(missing) == "g.json: nodes[1].tensor_parallel.activation_split is required");
  Json sharded = graph_to_json(transformer_graph());
  sharded["nodes"][2]["tensor_parallel"]["split_param_bytes"] = 0;
  sharded["nodes"][2]["param_bytes"] = 8;
  sharded["nodes"][2]["tensor_parallel"]["split_param_bytes"] = 8;
  CHECK(input_error_of([&] { graph_from_json(sharded, "g.json"); }) ==
        "g.json: nodes[2].tensor_parallel.split_param_bytes must be 0 for style \"sharded\" (it "
        "runs on slices of its inputs and splits no parameters) (got 8)");
}

TEST_CASE("plan tp: written only when > 1, counted in processes, checked against the graph",
          "[tp][plan]") {
  const Problem problem = transformer_problem(1, 4);
  Plan plan = single_replica_plan(problem, 2);
  plan.dp = 2;
  plan.global_batch = 2;
  plan.world_size = 4;
  plan.mesh = {{0}, {2}};
  REQUIRE_NOTHROW(plan.validate("plan", problem.graph, problem.cluster));
  CHECK(plan.num_processes() == 4);
  const Json j = plan_to_json(plan, problem.graph, problem.cluster);
  CHECK(j["tp"] == 2);
  CHECK(plan_from_json(j, "plan").tp == 2);
  Plan one = single_replica_plan(problem, 1);
  CHECK(!plan_to_json(one, problem.graph).contains("tp"));
  CHECK(plan_from_json(plan_to_json(one, problem.graph), "plan").tp == 1);

  Plan pipeline = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline, 2,
                                  {0, 0, 0, 0, 1, 1, 1, 1, 1}, 2, Schedule::kGpipe);
  pipeline.tp = 2;
  pipeline.world_size = 4;
  pipeline.mesh = {{0, 2}};
  REQUIRE_NOTHROW(pipeline.validate("plan", problem.graph, problem.cluster));
  CHECK(pipeline.num_processes() == 4);

  // A node whose max_degree tp does not divide runs whole; one node at least must split.
  Graph narrow = problem.graph;
  narrow.nodes[3].tensor_parallel->max_degree = 2;
  narrow.finalize("narrow");
  Plan four = single_replica_plan(problem, 4);
  four.graph_sha256 = graph_sha256(narrow);
  four.mesh = {{0}};
  CHECK_NOTHROW(four.validate("plan", narrow, problem.cluster));
  for (Node& node : narrow.nodes) {
    if (node.tensor_parallel) node.tensor_parallel->max_degree = node.name == "head" ? 6 : 2;
  }
  narrow.finalize("narrow");
  four.graph_sha256 = graph_sha256(narrow);
  CHECK(input_error_of([&] { four.validate("plan", narrow, problem.cluster); }) ==
        "plan: tp must divide the max_degree of a node with tensor_parallel, so that one splits "
        "(graph \"tiny_transformer\" has max_degree 2, 6; a tied group splits only where all its "
        "nodes do) (got 4)");
}

TEST_CASE("tp split rule: max_degree divisible, tied groups split as one", "[tp][cost]") {
  // nodes: 0 max 8, 1 max 2, 2 max 8, 3 no tensor_parallel, 4 max 4
  const std::vector<int64_t> degrees = {8, 2, 8, 0, 4};
  CHECK(tp_split_mask(degrees, {}, 1) == std::vector<uint8_t>{0, 0, 0, 0, 0});
  CHECK(tp_split_mask(degrees, {}, 2) == std::vector<uint8_t>{1, 1, 1, 0, 1});
  CHECK(tp_split_mask(degrees, {}, 4) == std::vector<uint8_t>{1, 0, 1, 0, 1});
  CHECK(tp_split_mask(degrees, {}, 8) == std::vector<uint8_t>{1, 0, 1, 0, 0});
  // 0 is tied with 1, which does not split at 4: both whole; 2 is tied with 0, so whole too
  CHECK(tp_split_mask(degrees, {{0, 1}}, 4) == std::vector<uint8_t>{0, 0, 1, 0, 1});
  CHECK(tp_split_mask(degrees, {{0, 1}, {2, 0}}, 4) == std::vector<uint8_t>{0, 0, 0, 0, 1});
  CHECK(tp_split_mask(degrees, {{0, 1}, {2, 0}}, 2) == std::vector<uint8_t>{1, 1, 1, 0, 1});
  // a tie with a node without tensor_parallel never splits
  CHECK(tp_split_mask(degrees, {{3, 4}}, 2) == std::vector<uint8_t>{1, 1, 1, 0, 0});

  // On a graph: a tied parameter's copy divides where its nodes split.
  Graph g = transformer_graph();  // every max_degree 4
  g.tied_params = {TiedParams{{1, 8}, 80}};  // fc1_0 and head
  g.finalize("tied");
  CHECK(tp_node_degrees(g, 4) == std::vector<int64_t>{1, 4, 4, 4, 1, 4, 4, 4, 4});
  CHECK(tp_tied_bytes(g.tied_params[0], tp_node_degrees(g, 4)) == 20);
  g.nodes[8].tensor_parallel->max_degree = 2;  // head: whole at 4, and fc1_0 with it
  g.finalize("tied");
  CHECK(tp_node_degrees(g, 4) == std::vector<int64_t>{1, 1, 4, 4, 1, 4, 4, 4, 1});
  CHECK(tp_tied_bytes(g.tied_params[0], tp_node_degrees(g, 4)) == 80);
  CHECK(tp_node_degrees(g, 2) == std::vector<int64_t>{1, 2, 2, 2, 1, 2, 2, 2, 2});
  Cluster eight = test::make_cluster(1, 8);
  CHECK(tp_degrees(g, eight) == std::vector<int64_t>{2, 4});
}

TEST_CASE("evaluate tp=4: a region whose max_degree 4 does not divide runs whole", "[tp][evaluate]") {
  // Layer 0's region (fc1_0, act0, fc2_0) splits at most in two (a Llama attention with 2
  // key-value heads, say); the rest in four.
  Problem problem = transformer_problem(1, 4);
  for (NodeIndex v : {1, 2, 3}) problem.graph.nodes[v].tensor_parallel->max_degree = 2;
  problem.graph.finalize("tiny_transformer");
  const Prediction one = evaluate(problem, single_replica_plan(problem, 1));
  const Prediction four = evaluate(problem, single_replica_plan(problem, 4));
  // Collectives over four devices at 100 B/s, 0.5 s latency: an all-reduce of 100 B
  // 2 * 3/4 * 1 + 2 * 3 * 0.5 = 4.5 s, an all-gather 3/4 + 3 * 0.5 = 2.25 s.
  // ln0 3; layer 0 whole, no collective: 12 + 4 + 12; ln1 3; fc1_1 12/4 + 4.5; act1 4/4;
  // fc2_1 12/4 + 4.5; head 6/4 + 2.25.
  CHECK(four.compute_s == Approx(3 + 28 + 3 + 7.5 + 1 + 7.5 + 3.75));
  CHECK(four.tp_comm_s == Approx(4.5 + 4.5 + 2.25));
  // Memory (sgd): parameters 10 + 400 + 400 + 10 + 100 + (20 + 95) + 50 = 1085 per rank
  // against 1820, twice with the gradients; activations 100 per node, a quarter on layer 1's
  // three split nodes (head keeps its whole): 900 -> 675.
  CHECK(one.memory_bytes[0] - four.memory_bytes[0] == 2 * (1820 - 1085) + (900 - 675));
}

TEST_CASE("tp cost terms: split-time ratio, parameter bytes, degrees", "[tp][cost]") {
  Node node;
  node.forward_s = 10;
  node.backward_s = 20;
  node.param_bytes = 1000;
  CHECK(tp_time_ratio(node, 4, false) == 1);  // not split
  node.tensor_parallel = test::tp_split(TpStyle::kColwise, 16, 900, true);
  CHECK(tp_time_ratio(node, 1, false) == 1);
  CHECK(tp_time_ratio(node, 4, false) == Approx(0.25));  // nothing measured: 1/t
  node.tensor_parallel->split_times = {{2, 6, 12}, {8, 2, 5}};
  CHECK(tp_time_ratio(node, 2, false) == Approx(0.6));
  CHECK(tp_time_ratio(node, 2, true) == Approx(0.6));
  // degree 4 halfway in log2 between 2 (0.6) and 8 (0.2): 0.4; backward 0.6 .. 0.25: 0.425
  CHECK(tp_time_ratio(node, 4, false) == Approx(0.4));
  CHECK(tp_time_ratio(node, 4, true) == Approx(0.425));
  // beyond the last measured degree: ratio(8) * 8 / 16
  CHECK(tp_time_ratio(node, 16, false) == Approx(0.1));
  CHECK(tp_param_bytes(node, 1) == 1000);
  CHECK(tp_param_bytes(node, 4) == 100 + 225);
  CHECK(tp_activation_share(node, 4) == 0.25);
  node.tensor_parallel->activation_split = false;
  CHECK(tp_activation_share(node, 4) == 1);

  const Problem problem = transformer_problem(1, 8);
  CHECK(tp_degrees(problem.graph, problem.cluster) == std::vector<int64_t>{2, 4});
  Graph plain = problem.graph;
  for (Node& n : plain.nodes) n.tensor_parallel.reset();
  CHECK(tp_degrees(plain, problem.cluster).empty());
}

TEST_CASE("evaluate tp=2: split nodes at half time plus their collectives, half the memory",
          "[tp][evaluate]") {
  const Problem problem = transformer_problem();
  const Prediction one = evaluate(problem, single_replica_plan(problem, 1));
  const Prediction two = evaluate(problem, single_replica_plan(problem, 2));
  // tp=1: every node whole, one device: 2 * (3 + 12 + 4 + 12) + 6 = 68 s.
  CHECK(one.compute_s == Approx(68));
  CHECK(one.tp_comm_s == 0);
  // tp=2, per layer: ln 3; fc1 (4 + 8) / 2 + its backward all-reduce 2 = 8, in layer 0 its
  // measured split 3 + 5 + 2 = 10; act 2; fc2 6 + its forward all-reduce 2 = 8; head 3 + its
  // all-gather 1 = 4. 2 + 21 + 21 + 4 = 48 s, of which collectives 2 * (2 + 2) + 1 = 9 s.
  CHECK(two.compute_s == Approx(48));
  CHECK(two.tp_comm_s == Approx(9));
  // Memory (sgd: parameters and gradients): per rank 2 * (10 + 200 + 210) + 100 = 940 B of
  // parameters (fc2's 20 B bias whole) against 1820; activations 100 per node, halved on the
  // split ones but head's: 900 -> 600.
  REQUIRE(one.memory_bytes.size() == 1);
  CHECK(one.memory_bytes[0] - two.memory_bytes[0] == 2 * (1820 - 940) + 300);
  CHECK(prediction_to_json(two)["tp_comm_s"] == Approx(9));
  CHECK(!prediction_to_json(one).contains("tp_comm_s"));
}

TEST_CASE("evaluate tp=1 is unchanged by the tensor_parallel field", "[tp][evaluate]") {
  Problem with_tp = transformer_problem(2, 4);
  Problem without = with_tp;
  for (Node& n : without.graph.nodes) n.tensor_parallel.reset();
  without.graph.finalize("plain");
  for (const MpMode mode : {MpMode::kPlacement, MpMode::kPipeline}) {
    Plan a = test::make_plan(with_tp.graph, with_tp.cluster, 4, 2, mode, 4,
                             {0, 0, 0, 0, 1, 1, 1, 1, 1}, mode == MpMode::kPipeline ? 2 : 1,
                             mode == MpMode::kPipeline ? Schedule::k1F1B : Schedule::kNone);
    Plan b = a;
    b.graph_sha256 = graph_sha256(without.graph);
    const Json pa = prediction_to_json(evaluate(with_tp, a));
    const Json pb = prediction_to_json(evaluate(without, b));
    CHECK(pa == pb);
  }
}

TEST_CASE("evaluate tp=2: each TP rank all-reduces its own gradients, t rings per node",
          "[tp][evaluate]") {
  // Two nodes of two devices, 100 B/s between nodes without latency: dp=2 x tp=2, replica 0 on
  // devices 0-1, replica 1 on 2-3. One bucket of the rank's 940 B, its ring across the nodes
  // sharing the NIC with the other TP rank's: 2(n-1)/n * G * bytes / bw = 2 * 940 / 100.
  const Problem problem = transformer_problem(2, 2);
  Plan plan = single_replica_plan(problem, 2);
  plan.dp = 2;
  plan.world_size = 4;
  plan.global_batch = 2;
  plan.mesh = {{0}, {2}};
  const Prediction p = evaluate(problem, plan);
  CHECK(p.allreduce_s == Approx(2.0 * 940 / 100));
  // tp=1 on the same devices, one ring per node: 1820 B.
  Plan whole = single_replica_plan(problem, 1);
  whole.dp = 2;
  whole.world_size = 2;
  whole.global_batch = 2;
  whole.mesh = {{0}, {2}};
  CHECK(evaluate(problem, whole).allreduce_s == Approx(1820.0 / 100));
}

TEST_CASE("evaluate tp=2 pipeline: the busiest stage's collectives per micro-batch", "[tp][evaluate]") {
  const Problem problem = transformer_problem(1, 4);
  Plan plan = test::make_plan(problem.graph, problem.cluster, 1, 2, MpMode::kPipeline, 2,
                              {0, 0, 0, 0, 1, 1, 1, 1, 1}, 2, Schedule::kGpipe);
  plan.tp = 2;
  plan.world_size = 4;
  plan.mesh = {{0, 2}};
  const Prediction p = evaluate(problem, plan);
  // micro-batch 1 = the profiled batch: stage 1 has fc1_1's 2 s, fc2_1's 2 s, head's 1 s.
  CHECK(p.tp_comm_s == Approx(2 * 5.0));
  CHECK(p.feasible);
  plan.predicted = p;
  const std::string text = explain(problem, plan);
  CHECK_THAT(text, Catch::Matchers::Contains("4 devices = dp 1 x mp 2 x tp 2"));
  CHECK_THAT(text, Catch::Matchers::Contains("TP collectives 10"));
}

namespace {

// Three nodes on one DGX A100 (80 GB): embed (not split), fc1 (colwise) and fc2 (rowwise) of
// `param_bytes` each, all split, `collective_bytes` all-reduced after fc1's backward and fc2's
// forward, profiled at batch 8.
Problem big_layer_problem(int64_t param_bytes, int64_t collective_bytes, double layer_s) {
  Problem p;
  p.graph = test::make_graph({{"embed", 1e-3, 2e-3, 1 << 20, 1 << 20},
                              {"fc1", layer_s, 2 * layer_s, param_bytes, 1 << 20},
                              {"fc2", layer_s, 2 * layer_s, param_bytes, 1 << 20}},
                             {{0, 1, 1 << 20}, {1, 2, 1 << 20}}, 8, "big_layer");
  TensorParallel fc1 = test::tp_split(TpStyle::kColwise, 8, param_bytes, true);
  fc1.backward_collective = TpCollective{Collective::kAllReduce, collective_bytes};
  TensorParallel fc2 = test::tp_split(TpStyle::kRowwise, 8, param_bytes, true);
  fc2.forward_collective = TpCollective{Collective::kAllReduce, collective_bytes};
  p.graph.nodes[1].tensor_parallel = fc1;
  p.graph.nodes[2].tensor_parallel = fc2;
  p.graph.finalize("big_layer");
  p.cluster = load_cluster("dgx-a100");
  p.cluster.num_nodes = 1;
  return p;
}

}  // namespace

TEST_CASE("search: tensor parallelism where one layer does not fit a device", "[tp][search]") {
  // 45 GB of parameters in one node: whole, its parameters and gradients alone are 90 GB > 80
  // GB, whatever the pipeline, placement or sharding (a sharded unit is gathered whole).
  const Problem problem = big_layer_problem(45'000'000'000, 1 << 20, 0.05);
  SearchOptions options;
  options.top_k = 3;
  const SearchResult r = search(problem, options);
  REQUIRE(!r.plans.empty());
  for (const Plan& plan : r.plans) {
    CHECK(plan.tp >= 2);
    CHECK(plan.world_size == plan.dp * plan.mp * plan.tp);
    for (const auto& row : plan.mesh)
      for (DeviceIndex d : row) CHECK(d % plan.tp == 0);
    CHECK_NOTHROW(plan.validate("plan", problem.graph, problem.cluster));
  }
  options.tensor_degrees = {1};
  CHECK_THROWS_AS(search(problem, options), InfeasibleError);
}

TEST_CASE("search: no tensor parallelism where its collectives cost more than it saves",
          "[tp][search]") {
  // 1 ms layers with 10 GB collectives: splitting saves under a millisecond and costs tens.
  const Problem problem = big_layer_problem(1 << 20, 10'000'000'000, 1e-3);
  const SearchResult r = search(problem, SearchOptions{});
  REQUIRE(!r.plans.empty());
  CHECK(r.plans.front().tp == 1);
  SearchOptions only_two;
  only_two.tensor_degrees = {2};
  const SearchResult split_two = search(problem, only_two);  // the space has such plans
  for (const Plan& plan : split_two.plans) CHECK(plan.tp == 2);
  CHECK(split_two.plans.front().predicted.step_s > r.plans.front().predicted.step_s);
  CHECK(split_two.plans.front().predicted.tp_comm_s > 0);
}

TEST_CASE("search: tensor degrees follow the cluster, the graph and the options", "[tp][search]") {
  // fc1 splits at most in two, fc2 in four: tp = 4 splits fc2 alone, 8 neither.
  Problem problem = big_layer_problem(1 << 20, 1 << 20, 1e-3);
  problem.graph.nodes[1].tensor_parallel->max_degree = 2;
  problem.graph.nodes[2].tensor_parallel->max_degree = 4;
  problem.graph.finalize("big_layer");
  std::vector<int64_t> degrees;
  for (const SearchSpacePoint& p : search_space(problem, SearchOptions{}, nullptr)) {
    if (std::find(degrees.begin(), degrees.end(), p.tp) == degrees.end()) degrees.push_back(p.tp);
    CHECK(problem.cluster.devices_per_node % (p.mp * p.tp) == 0);
    if (p.tp > 1 && p.mode == MpMode::kPlacement) CHECK(p.mp == 1);
  }
  CHECK(degrees == std::vector<int64_t>{1, 2, 4});
  SearchOptions eight;
  eight.tensor_degrees = {8};
  CHECK(input_error_of([&] { search_space(problem, eight, nullptr); }) ==
        "search options: tensor_degrees must list 1 or degrees that divide devices_per_node = 8 "
        "and the max_degree of at least one node with tensor_parallel (here: 2, 4) (got 8)");
  // tp = 4: fc1 runs whole, fc2 split (its time, its collective)
  SearchOptions four;
  four.tensor_degrees = {4};
  const SearchResult r = search(problem, four);
  REQUIRE(!r.plans.empty());
  for (const Plan& plan : r.plans) {
    CHECK(plan.tp == 4);
    CHECK_NOTHROW(plan.validate("plan", problem.graph, problem.cluster));
  }
  SearchOptions dp_only;
  dp_only.dp_only = true;
  for (const SearchSpacePoint& p : search_space(problem, dp_only, nullptr)) CHECK(p.tp == 1);
}

TEST_CASE("search: planning time with tensor parallelism in the space", "[tp][search]") {
  // 1000 nodes on 512 DGX-1-like nodes (4096 devices): every fourth node splits (max_degree 8).
  Problem problem;
  problem.graph = test::tp_chain_graph();
  problem.cluster = load_cluster("dgx1-v100");
  problem.cluster.num_nodes = 512;
  const auto start = std::chrono::steady_clock::now();
  const SearchResult r = search(problem, SearchOptions{});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(!r.plans.empty());
  // Generous for sanitizer and debug builds; bench/bench_search.cc reports the release figure.
  CHECK(seconds < 20);
}

namespace {

// A GPT-like chain at batch 8: embed (vocab_rowwise), `blocks` x [ln (whole), fc1 (colwise,
// input gradient all-reduced), act (sharded), fc2 (rowwise, output all-reduced)], head
// (colwise_gather), max_degree 8 everywhere, every edge and output 64 MiB. fc1 and fc2 hold
// `block_bytes` / 2 each; embed and head 1 GB each.
Graph gpt_like_graph(int blocks, int64_t block_bytes) {
  constexpr int64_t kActivation = int64_t{64} << 20;
  std::vector<test::NodeSpec> nodes;
  nodes.push_back({"embed", 1e-3, 2e-3, 1'000'000'000, kActivation});
  for (int i = 0; i < blocks; ++i) {
    const std::string l = std::to_string(i);
    nodes.push_back({"ln" + l, 1e-4, 2e-4, 1 << 16, kActivation});
    nodes.push_back({"fc1_" + l, 10e-3, 20e-3, block_bytes / 2, kActivation});
    nodes.push_back({"act" + l, 1e-3, 1e-3, 0, kActivation});
    nodes.push_back({"fc2_" + l, 10e-3, 20e-3, block_bytes / 2, kActivation});
  }
  nodes.push_back({"head", 5e-3, 10e-3, 1'000'000'000, kActivation});
  std::vector<test::EdgeSpec> edges;
  for (NodeIndex v = 0; v + 1 < static_cast<NodeIndex>(nodes.size()); ++v) {
    edges.push_back({v, v + 1, kActivation});
  }
  Graph g = test::make_graph(nodes, edges, 8, "gpt_like");
  const auto with = [&](NodeIndex v, TpStyle style, bool params, bool activations) {
    g.nodes[v].tensor_parallel = test::tp_split(style, 8, params ? g.nodes[v].param_bytes : 0, activations);
  };
  with(0, TpStyle::kVocabRowwise, true, false);
  g.nodes[0].tensor_parallel->forward_collective = TpCollective{Collective::kAllReduce, kActivation};
  for (int i = 0; i < blocks; ++i) {
    const NodeIndex b = 1 + 4 * i;
    with(b + 1, TpStyle::kColwise, true, true);
    g.nodes[b + 1].tensor_parallel->backward_collective = TpCollective{Collective::kAllReduce, kActivation};
    with(b + 2, TpStyle::kSharded, false, true);
    with(b + 3, TpStyle::kRowwise, true, true);
    g.nodes[b + 3].tensor_parallel->forward_collective = TpCollective{Collective::kAllReduce, kActivation};
  }
  const auto head = static_cast<NodeIndex>(g.nodes.size() - 1);
  with(head, TpStyle::kColwiseGather, true, false);
  g.nodes[head].tensor_parallel->forward_collective = TpCollective{Collective::kAllGather, kActivation};
  g.finalize("gpt_like");
  return g;
}

// The stage boundaries' transfers of a pipeline plan by hand: per micro-batch and boundary one
// 64 MiB tensor at the micro-batch, each of the tp ranks' copies over the link between the two
// stages' first devices, sharing the inter-node link between nodes; M * 2 * their sum.
double hand_transfer_s(const Cluster& cluster, const Plan& plan) {
  const double bytes = double(int64_t{64} << 20) * plan.per_replica_batch / plan.num_microbatches / 8;
  double sum_s = 0;
  for (int32_t s = 0; s + 1 < plan.num_stages(); ++s) {
    if (plan.device_of(s) == plan.device_of(s + 1)) continue;  // zbv's turn: one rank
    const DeviceIndex a = plan.mesh[0][plan.device_of(s)], b = plan.mesh[0][plan.device_of(s + 1)];
    const bool across = a / cluster.devices_per_node != b / cluster.devices_per_node;
    const Link link = across ? cluster.inter_node : cluster.link(a, b);
    sum_s += link.latency_s + bytes * (across ? plan.tp : 1) / link.bandwidth_bytes_per_s;
  }
  return static_cast<double>(plan.num_microbatches) * 2 * sum_s;
}

}  // namespace

TEST_CASE("search: a model that fits only in a pipeline over two nodes gets one", "[tp][search]") {
  // 200 GB of parameters under Adam (4 copies: 800 GB of state), every byte split by tensor
  // parallelism: a node's 8 x 80 GB cannot hold it whichever way its devices divide it
  // (800 / 8 = 100 GB per device), two nodes can (50 GB). Without sharding (Megatron-LM's
  // tensor x pipeline x data parallelism).
  Problem problem;
  problem.graph = gpt_like_graph(16, 12'375'000'000);
  problem.cluster = load_cluster("dgx-a100");
  REQUIRE(problem.cluster.num_nodes == 4);
  problem.job.optimizer = Optimizer::kAdam;
  const int64_t per_node = problem.cluster.devices_per_node;
  SearchOptions options;
  options.shardings = {Sharding::kNone};
  options.top_k = 3;
  options.devices = 2 * per_node;
  const SearchResult r = search(problem, options);
  REQUIRE(!r.plans.empty());
  for (const Plan& plan : r.plans) {
    INFO("dp=" << plan.dp << " mp=" << plan.mp << " tp=" << plan.tp);
    CHECK(plan.mode == MpMode::kPipeline);
    CHECK(plan.mp * plan.tp == 2 * per_node);  // one replica of two whole nodes
    CHECK_NOTHROW(plan.validate("plan", problem.graph, problem.cluster));
    // Its mesh spans nodes 0 and 1, the stages node by node, every TP group on one node.
    CHECK(plan.mesh[0].front() / per_node == 0);
    CHECK(plan.mesh[0].back() / per_node == 1);
    CHECK(std::is_sorted(plan.mesh[0].begin(), plan.mesh[0].end(),
                         [&](DeviceIndex a, DeviceIndex b) { return a / per_node < b / per_node; }));
    // The transfers between stages on two nodes are priced on the inter-node link (shared by
    // the TP ranks' copies), the others on NVSwitch.
    CHECK(plan.predicted.transfer_s == Approx(hand_transfer_s(problem.cluster, plan)).epsilon(1e-9));
    Problem slower = problem;
    slower.cluster.inter_node.bandwidth_bytes_per_s /= 4;
    const double slower_s = evaluate(slower, plan).transfer_s;
    CHECK(slower_s == Approx(hand_transfer_s(slower.cluster, plan)).epsilon(1e-9));
    CHECK(slower_s > plan.predicted.transfer_s);
  }
  // On all four nodes the best plans' replicas are whole nodes too; on one node nothing fits.
  options.devices = 0;
  for (const Plan& plan : search(problem, options).plans) CHECK(plan.mp * plan.tp > per_node);
  options.devices = per_node;
  CHECK_THROWS_AS(search(problem, options), InfeasibleError);
}

TEST_CASE("evaluate: stage boundaries between nodes ride the inter-node link", "[tp][evaluate]") {
  // Two nodes of 4 devices, 1 GB/s inside, 100 MB/s between: a 4-stage chain over devices
  // 0, 1 | 4, 5 (tp = 1) or the TP groups 0, 2 | 4, 6 (tp = 2), one 1000-byte edge per cut.
  Problem problem = transformer_problem(2, 4);
  problem.cluster.intra_node = {1e9, 0};
  problem.cluster.inter_node = {1e8, 0};
  Plan plan = test::make_plan(problem.graph, problem.cluster, 1, 4, MpMode::kPipeline, 1,
                              {0, 0, 1, 1, 2, 2, 3, 3, 3}, 1, Schedule::kGpipe);
  for (Edge& e : problem.graph.edges) e.bytes = 1000;
  problem.graph.finalize("tiny_transformer");
  plan.graph_sha256 = graph_sha256(problem.graph);
  plan.mesh = {{0, 1, 4, 5}};
  // M * 2 * (1000 / 1e9 + 1000 / 1e8 + 1000 / 1e9)
  CHECK(evaluate(problem, plan).transfer_s == Approx(2 * (1e-6 + 1e-5 + 1e-6)));
  plan.tp = 2;
  plan.world_size = 8;
  plan.mesh = {{0, 2, 4, 6}};
  // the two TP ranks' copies share the inter-node link: 1000 * 2 / 1e8
  CHECK(evaluate(problem, plan).transfer_s == Approx(2 * (1e-6 + 2e-5 + 1e-6)));
  CHECK(tp_stage_link(problem.cluster, 0, 4, 2).bandwidth_bytes_per_s == 5e7);
  CHECK(tp_stage_link(problem.cluster, 0, 2, 2).bandwidth_bytes_per_s == 1e9);
  CHECK(tp_stage_link(problem.cluster, 0, 4, 1).bandwidth_bytes_per_s == 1e8);
}

TEST_CASE("explain names the nodes tp does not split and why", "[tp][explain]") {
  Problem problem = transformer_problem(1, 4);
  // layer 1's region splits at most in two (fc1_1, act1, fc2_1), the head in six: under tp 4
  // both run whole; fc1_0 shares its weight with the head, so it runs whole with it
  for (NodeIndex v : {5, 6, 7}) problem.graph.nodes[v].tensor_parallel->max_degree = 2;
  problem.graph.nodes[8].tensor_parallel->max_degree = 6;
  problem.graph.tied_params = {TiedParams{{1, 8}, 80}};
  problem.graph.finalize("tiny_transformer");
  Plan plan = single_replica_plan(problem, 4);
  plan.graph_sha256 = graph_sha256(problem.graph);
  plan.predicted = evaluate(problem, plan);
  std::string text = explain(problem, plan);
  CAPTURE(text);
  CHECK_THAT(text, Catch::Matchers::Contains(
                       "tensor parallel split at tp 4: 2 of 7 nodes with tensor_parallel (2 nodes "
                       "without it run whole)\n"
                       "  run whole, tp 4 does not divide their max_degree 2: fc1_1, act1, fc2_1\n"
                       "  run whole, tp 4 does not divide their max_degree 6: head\n"
                       "  run whole, a node sharing their weight does not split: fc1_0\n"));
  // the same text from the graph alone, and none without it (no max_degree to read)
  CHECK_THAT(explain(plan, problem.graph), Catch::Matchers::Contains("2 of 7 nodes"));
  CHECK(explain(plan).find("tensor parallel split") == std::string::npos);

  // at tp 2 every node with tensor_parallel splits: nothing runs whole for tp's sake
  plan = single_replica_plan(problem, 2);
  plan.predicted = evaluate(problem, plan);
  text = explain(problem, plan);
  CAPTURE(text);
  CHECK_THAT(text, Catch::Matchers::Contains("tensor parallel split at tp 2: 7 of 7 nodes"));
  CHECK(text.find("run whole, ") == std::string::npos);
}
