// profile(): graph structure (names, edges, bytes exact), positive times, error messages.
#include <chrono>
#include <thread>

#include <torch/torch.h>

#include "catch.h"
#include "common/error.h"
#include "profiler/block_timing.h"
#include "profiler/profile.h"

namespace nn = torch::nn;
using hybridplan::Graph;
using hybridplan::InputError;
using hybridplan::ProfileOptions;
using Catch::Matchers::Contains;

namespace {

ProfileOptions quick(const std::string& name = "test") {
  ProfileOptions options;
  options.name = name;
  options.warmup = 1;
  options.repeats = 3;
  return options;
}

std::vector<std::string> names_of(const Graph& g) {
  std::vector<std::string> names;
  for (const auto& n : g.nodes) names.push_back(n.name);
  return names;
}

// A custom module that lists its blocks itself, as models with tuple-returning layers must.
struct TwoStageImpl : nn::Module, hybridplan::BlockList {
  nn::Linear encoder{nullptr}, decoder{nullptr};
  TwoStageImpl() {
    encoder = register_module("encoder", nn::Linear(6, 12));
    decoder = register_module("decoder", nn::Linear(12, 2));
  }
  std::vector<hybridplan::Block> blocks() override {
    return {{"encoder", "", encoder.ptr(), [this](const auto& x) { return encoder(x[0]); }},
            {"decoder", "dense", decoder.ptr(), [this](const auto& x) { return decoder(x[0]); }}};
  }
};
TORCH_MODULE(TwoStage);

struct Opaque : nn::Module {  // no forward the profiler can call through a ModuleList
  Opaque() { register_parameter("w", torch::ones({2})); }
};

// Children and no parameter of its own: by the node rule its children are the nodes, which C++
// cannot call one by one.
struct PairImpl : nn::Module {
  nn::Linear a{nullptr}, b{nullptr};
  PairImpl() {
    a = register_module("a", nn::Linear(7, 7));
    b = register_module("b", nn::Linear(7, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return b(a(x)); }
};
TORCH_MODULE(Pair);

// Holds a parameter itself and has a child: one node by the node rule.
struct ScaledImpl : nn::Module {
  torch::Tensor scale;
  nn::Linear inner{nullptr};
  ScaledImpl() {
    scale = register_parameter("scale", torch::ones({3}));
    inner = register_module("inner", nn::Linear(7, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return inner(x) * scale; }
};
TORCH_MODULE(Scaled);

}  // namespace

TEST_CASE("profile of a Sequential MLP: names, ops, edges and bytes are exact", "[profiler]") {
  torch::manual_seed(0);
  nn::Sequential net(nn::Linear(8, 16), nn::ReLU(), nn::Linear(16, 4));
  const Graph g = hybridplan::profile(net, {torch::randn({5, 8})}, quick("mlp"));

  CHECK(g.name == "mlp");
  CHECK(g.profiled.device == "cpu");
  CHECK(g.profiled.batch_size == 5);
  CHECK(g.profiled.dtype == "float32");
  REQUIRE(g.nodes.size() == 3);
  CHECK(names_of(g) == std::vector<std::string>{"0", "1", "2"});
  CHECK(g.nodes[0].op == "linear");
  CHECK(g.nodes[1].op == "re_lu");  // the Python profiler's snake_case of ReLU
  CHECK(g.nodes[0].id == 0);
  CHECK(g.nodes[2].id == 2);
  // Linear(8, 16): (8 * 16 + 16) floats * 4 bytes; Linear(16, 4): (16 * 4 + 4) * 4.
  CHECK(g.nodes[0].param_bytes == 576);
  CHECK(g.nodes[1].param_bytes == 0);
  CHECK(g.nodes[2].param_bytes == 272);
  CHECK(g.nodes[0].param_tensors == 2);  // weight and bias: the optimizer's per-tensor count
  CHECK(g.nodes[1].param_tensors == 0);
  CHECK(g.nodes[2].param_tensors == 2);
  // Outputs: 5 x 16 floats = 320 bytes (twice), then 5 x 4 floats = 80 bytes.
  CHECK(g.nodes[0].output_bytes == 320);
  CHECK(g.nodes[1].output_bytes == 320);
  CHECK(g.nodes[2].output_bytes == 80);
  REQUIRE(g.edges.size() == 2);
  CHECK((g.edges[0].src == 0 && g.edges[0].dst == 1 && g.edges[0].bytes == 320));
  CHECK((g.edges[1].src == 1 && g.edges[1].dst == 2 && g.edges[1].bytes == 320));
  CHECK(g.topo_order == std::vector<hybridplan::NodeIndex>{0, 1, 2});
  for (const auto& node : g.nodes) {
    INFO(node.name);
    CHECK(node.forward_s > 0);
    CHECK(node.backward_s > 0);  // relu too: an upstream block has parameters
  }
}

// Identity whose backward sleeps: a backward of known length.
struct SleepInBackward : torch::autograd::Function<SleepInBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               int64_t ms) {
    ctx->saved_data["ms"] = ms;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ctx->saved_data["ms"].toInt()));
    return {grads[0], torch::Tensor()};
  }
};

TEST_CASE("profile: each block is charged its own forward and backward within a step",
          "[profiler]") {
  // Three blocks whose forward and backward sleep for known, neighbour-distinct times: a step
  // interval charged to the wrong block (the previous or next one) would be off by >= 20 ms.
  const std::vector<std::pair<int64_t, int64_t>> sleep_ms = {{30, 10}, {10, 50}, {50, 30}};
  std::vector<hybridplan::Block> blocks;
  for (size_t i = 0; i < sleep_ms.size(); ++i) {
    nn::Linear layer(4, 4);
    const auto [forward_ms, backward_ms] = sleep_ms[i];
    blocks.push_back({"b" + std::to_string(i), "sleepy", layer.ptr(),
                      [layer, forward_ms, backward_ms](const std::vector<torch::Tensor>& x) mutable {
                        std::this_thread::sleep_for(std::chrono::milliseconds(forward_ms));
                        return SleepInBackward::apply(layer->forward(x[0]), backward_ms);
                      }});
  }
  ProfileOptions options = quick();
  options.clock = "wall";
  const Graph g = hybridplan::profile_blocks(blocks, {torch::randn({2, 4})}, options);
  for (size_t i = 0; i < sleep_ms.size(); ++i) {
    INFO(g.nodes[i].name);
    // At least the sleep; at most the sleep plus 10 ms of Linear, hooks and scheduling.
    CHECK(g.nodes[i].forward_s >= sleep_ms[i].first * 1e-3);
    CHECK(g.nodes[i].forward_s <= sleep_ms[i].first * 1e-3 + 0.010);
    CHECK(g.nodes[i].backward_s >= sleep_ms[i].second * 1e-3);
    CHECK(g.nodes[i].backward_s <= sleep_ms[i].second * 1e-3 + 0.010);
  }
}

TEST_CASE("profile: a block that returns its input takes none of its producer's backward",
          "[profiler]") {
  // Dropout with p=0 and Identity return their input, so their output's autograd node is the
  // block before them's; hooked for both, the later hook took the producer's whole backward.
  // The producer's backward sleeps 40 ms (the Python profiler's twin test is in
  // tests/python/test_profiler.py).
  nn::Linear first(4, 4), last(4, 4);
  std::vector<hybridplan::Block> blocks;
  blocks.push_back({"sleepy", "sleepy", first.ptr(),
                    [first](const std::vector<torch::Tensor>& x) mutable {
                      return SleepInBackward::apply(first->forward(x[0]), 40);
                    }});
  nn::Dropout dropout(0.0);
  blocks.push_back({"dropout", "dropout", dropout.ptr(),
                    [dropout](const std::vector<torch::Tensor>& x) mutable {
                      return dropout->forward(x[0]);
                    }});
  blocks.push_back({"last", "linear", last.ptr(),
                    [last](const std::vector<torch::Tensor>& x) mutable {
                      return last->forward(x[0]);
                    }});
  ProfileOptions options = quick();
  options.clock = "wall";
  const Graph g = hybridplan::profile_blocks(blocks, {torch::randn({2, 4})}, options);
  CHECK(g.nodes[0].backward_s >= 0.040);
  CHECK(g.nodes[0].backward_s <= 0.040 + 0.019);
  CHECK(g.nodes[1].backward_s <= 0.005);
}

TEST_CASE("profile: .grad fields are left untouched", "[profiler]") {
  nn::Sequential net(nn::Linear(4, 3), nn::ReLU(), nn::Linear(3, 2));
  (void)hybridplan::profile(net, {torch::randn({2, 4})}, quick());
  for (const torch::Tensor& p : net->parameters()) CHECK_FALSE(p.grad().defined());
}

TEST_CASE("profile: a block with nothing upstream to differentiate has no backward", "[profiler]") {
  nn::Sequential net(nn::ReLU(), nn::Linear(4, 3));
  const Graph g = hybridplan::profile(net, {torch::randn({2, 4})}, quick());
  CHECK(g.nodes[0].forward_s > 0);
  CHECK(g.nodes[0].backward_s == 0);  // training never computes the input's gradient
  CHECK(g.nodes[1].backward_s > 0);   // weight and bias gradients
}

TEST_CASE("profile: nested containers give dotted qualified names", "[profiler]") {
  nn::Sequential features(nn::Conv2d(nn::Conv2dOptions(1, 2, 3).padding(1)), nn::ReLU());
  nn::Sequential classifier(nn::Flatten(), nn::Linear(2 * 4 * 4, 3));
  // A C++ Sequential cannot hold a Sequential (its forward is a template): nest in a ModuleDict.
  nn::ModuleDict net(torch::OrderedDict<std::string, std::shared_ptr<nn::Module>>{
      {"features", features.ptr()}, {"classifier", classifier.ptr()}});
  const Graph g = hybridplan::profile(*net, {torch::randn({2, 1, 4, 4})}, quick());
  CHECK(names_of(g) ==
        std::vector<std::string>{"features.0", "features.1", "classifier.0", "classifier.1"});
  CHECK(g.nodes[0].op == "conv2d");
  CHECK(g.nodes[2].op == "flatten");
  CHECK(g.nodes[0].param_bytes == (2 * 1 * 3 * 3 + 2) * 4);
  CHECK(g.nodes[2].output_bytes == 2 * 32 * 4);
  CHECK(g.edges.size() == 3);
}

TEST_CASE("profile: ModuleList and ModuleDict children of known layer types", "[profiler]") {
  nn::ModuleList list(nn::Linear(3, 5), nn::Tanh(), nn::Linear(5, 2));
  const Graph gl = hybridplan::profile(*list, {torch::randn({4, 3})}, quick());
  CHECK(names_of(gl) == std::vector<std::string>{"0", "1", "2"});
  CHECK(gl.nodes[1].op == "tanh");

  nn::ModuleDict dict(torch::OrderedDict<std::string, std::shared_ptr<nn::Module>>{
      {"embed", nn::Embedding(10, 6).ptr()}, {"proj", nn::Linear(6, 2).ptr()}});
  const Graph gd = hybridplan::profile(*dict, {torch::randint(10, {4, 7})}, quick());
  CHECK(names_of(gd) == std::vector<std::string>{"embed", "proj"});
  CHECK(gd.nodes[0].param_bytes == 10 * 6 * 4);
  CHECK(gd.nodes[0].output_bytes == 4 * 7 * 6 * 4);
  CHECK(gd.nodes[0].backward_s > 0);  // the embedding's weight gradient
}

TEST_CASE("profile: a BlockList module profiles its own blocks", "[profiler]") {
  TwoStage net;
  const Graph g = hybridplan::profile(net, {torch::randn({3, 6})}, quick());
  CHECK(names_of(g) == std::vector<std::string>{"encoder", "decoder"});
  CHECK(g.nodes[0].op == "linear");
  CHECK(g.nodes[1].op == "dense");
  CHECK(g.nodes[1].param_bytes == (12 * 2 + 2) * 4);

  nn::ModuleDict outer(
      torch::OrderedDict<std::string, std::shared_ptr<nn::Module>>{{"body", net.ptr()}});
  const Graph go = hybridplan::profile(*outer, {torch::randn({3, 6})}, quick());
  CHECK(names_of(go) == std::vector<std::string>{"body.encoder", "body.decoder"});
}

TEST_CASE("profile: graph JSON round-trips through the planner's Graph", "[profiler]") {
  nn::Sequential net(nn::Linear(4, 4), nn::ReLU(), nn::Linear(4, 1));
  const Graph g = hybridplan::profile(net, {torch::randn({2, 4})}, quick("rt"));
  const Graph back = hybridplan::graph_from_json(hybridplan::graph_to_json(g), "rt.json");
  CHECK(names_of(back) == names_of(g));
  CHECK(back.edges.size() == 2);
  CHECK(back.nodes[2].param_bytes == g.nodes[2].param_bytes);
  CHECK(back.nodes[0].forward_s == g.nodes[0].forward_s);
}

TEST_CASE("profile: bad input throws InputError with a clear message", "[profiler]") {
  const auto x = torch::randn({5, 7});
  SECTION("no blocks") {
    nn::Sequential empty;
    CHECK_THROWS_WITH(hybridplan::profile(empty, {x}, quick()),
                      "profile: module must have at least one block (got 0 blocks)");
  }
  SECTION("no parameters") {
    nn::Sequential relu_only{nn::ReLU(), nn::Tanh()};
    CHECK_THROWS_WITH(hybridplan::profile(relu_only, {x}, quick()),
                      "profile: module must have parameters to plan for (got 0 parameters)");
  }
  SECTION("wrong input shape names the block and the shape") {
    nn::Sequential net(nn::Linear(7, 3), nn::ReLU(), nn::Linear(4, 2));
    CHECK_THROWS_AS(hybridplan::profile(net, {x}, quick()), InputError);
    CHECK_THROWS_WITH(hybridplan::profile(net, {x}, quick()),
                      Contains("profile: module.2 failed on its input: ") &&
                          Contains("(got input shape [5, 3])"));
  }
  SECTION("a device that does not exist") {
    nn::Sequential net(nn::Linear(7, 3));
    ProfileOptions options = quick();
    options.device = "cuda:7";
    if (!torch::cuda::is_available() || torch::cuda::device_count() < 8) {
      CHECK_THROWS_WITH(hybridplan::profile(net, {x}, options),
                        Contains("profile: options.device must name an existing device") &&
                            Contains("(got \"cuda:7\")"));
    }
    options.device = "gpu-0";
    CHECK_THROWS_WITH(
        hybridplan::profile(net, {x}, options),
        "profile: options.device must be a torch device such as cpu or cuda:0 (got \"gpu-0\")");
  }
  SECTION("a module the profiler cannot split") {
    nn::Linear lone(7, 3);
    CHECK_THROWS_WITH(hybridplan::profile(lone, {x}, quick()),
                      "profile: module must be a Sequential, ModuleList, ModuleDict or derive "
                      "from hybridplan::BlockList (got torch::nn::LinearImpl)");
    nn::ModuleList list;
    list->push_back(std::make_shared<Opaque>());
    CHECK_THROWS_WITH(hybridplan::profile(*list, {x}, quick()),
                      Contains("profile: module.0 must be a LibTorch layer") &&
                          Contains("Opaque)"));
  }
  SECTION("a module with children and no parameters of its own (node rule)") {
    nn::Sequential net{Pair(), nn::ReLU()};
    CHECK_THROWS_WITH(hybridplan::profile(net, {x}, quick()),
                      Contains("profile: module.0 has children and no parameters of its own, so "
                               "by the node rule its children are the graph nodes") &&
                          Contains("PairImpl)"));
  }
  SECTION("one module with parameters at two positions (a module called twice)") {
    nn::Linear shared(7, 7);
    nn::Sequential net{shared, nn::ReLU(), shared};
    CHECK_THROWS_WITH(hybridplan::profile(net, {x}, quick()),
                      Contains("profile: module.2 is the module already at module.0, and holds "
                               "parameters") &&
                          Contains("LinearImpl)"));
  }
  SECTION("bad options and inputs") {
    nn::Sequential net(nn::Linear(7, 3));
    ProfileOptions options = quick();
    options.repeats = 0;
    CHECK_THROWS_WITH(hybridplan::profile(net, {x}, options),
                      "profile: options.repeats must be >= 1 (got 0)");
    CHECK_THROWS_WITH(hybridplan::profile(net, {}, quick()),
                      "profile: inputs must hold 1 to 3 tensors (got 0)");
  }
}

TEST_CASE("profile: a module holding parameters itself is one node with its children (node rule)",
          "[profiler]") {
  nn::Sequential net{Scaled(), nn::ReLU(), nn::Linear(3, 2)};
  const Graph g = hybridplan::profile(net, {torch::randn({4, 7})}, quick());
  CHECK(names_of(g) == std::vector<std::string>{"0", "1", "2"});
  CHECK(g.nodes[0].param_bytes == (3 + 7 * 3 + 3) * 4);  // scale, inner.weight, inner.bias
}

TEST_CASE("profile: a parameter-free module used twice is a block at each position",
          "[profiler]") {
  nn::ReLU relu;
  nn::Sequential net{nn::Linear(7, 3), relu, nn::Linear(3, 3), relu};
  const Graph g = hybridplan::profile(net, {torch::randn({4, 7})}, quick());
  CHECK(names_of(g) == std::vector<std::string>{"0", "1", "2", "3"});
}

TEST_CASE("median_s", "[profiler]") {
  CHECK(hybridplan::median_s({3.0}) == 3.0);
  CHECK(hybridplan::median_s({5.0, 1.0, 3.0}) == 3.0);
  CHECK(hybridplan::median_s({4.0, 1.0, 2.0, 100.0}) == 3.0);  // (2 + 4) / 2
}
