// The executor's pure parts, without a process group: torchrun environment parsing, the
// Reducer's gradient buckets, rank agreement, lost-peer messages (tests/data/rank_messages.json,
// shared with Python), checkpoint names, optimizer state and files. (Pipeline schedules are
// torch-free: tests/cpp/planner.)
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <numeric>
#include <random>

#include "catch.h"
#include "common/error.h"
#include "common/json_io.h"
#include "executor/checkpoint.h"
#include "executor/ddp_reducer.h"
#include "executor/dist_env.h"
#include "executor/executor.h"
#include "executor/lost_peer.h"
#include "executor/rank_agreement.h"
#include "models/mlp.h"
#include "planner/costs/bucket_policy.h"
#include "planner/model_fixtures.h"

using namespace hybridplan;

namespace {

GetEnv env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::map<std::string, std::string> good_env() {
  return {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29511"}, {"LOCAL_RANK", "1"}};
}

}  // namespace

TEST_CASE("dist_env reads the torchrun variables", "[executor][dist_env]") {
  DistEnv env = dist_env_from_environment(env_of(good_env()));
  CHECK(env.rank == 1);
  CHECK(env.world_size == 4);
  CHECK(env.local_rank == 1);
  CHECK(env.master_addr == "127.0.0.1");
  CHECK(env.master_port == 29511);
}

TEST_CASE("dist_env rejects missing and malformed variables", "[executor][dist_env]") {
  auto vars = good_env();
  vars["RANK"] = "4";
  CHECK_THROWS_WITH(dist_env_from_environment(env_of(vars)),
                    "environment: RANK must be an integer in 0..WORLD_SIZE-1 = 0..3 (got \"4\")");
  vars = good_env();
  vars.erase("MASTER_PORT");
  CHECK_THROWS_WITH(dist_env_from_environment(env_of(vars)),
                    Catch::Matchers::StartsWith("environment: MASTER_PORT must be set"));
  vars = good_env();
  vars["MASTER_PORT"] = "29x";
  CHECK_THROWS_WITH(dist_env_from_environment(env_of(vars)),
                    "environment: MASTER_PORT must be an integer in 1..65535 (got \"29x\")");
  vars = good_env();
  vars.erase("LOCAL_RANK");  // optional
  CHECK(dist_env_from_environment(env_of(vars)).local_rank == 0);
}

TEST_CASE("the Reducer's buckets follow the bucket policy", "[executor][buckets]") {
  // models::mlp({16, 32, 32, 8}) parameters, float32: 0.weight 2048 B, 0.bias 128 B,
  // 2.weight 4096 B, 2.bias 128 B, 4.weight 1024 B, 4.bias 32 B.
  torch::manual_seed(0);
  std::vector<torch::Tensor> params = models::mlp({16, 32, 32, 8})->parameters();
  using Buckets = std::vector<std::vector<size_t>>;
  // Caps 1000 then 5000, packing from the last parameter: 4.bias + 4.weight = 1056 B >= 1000
  // closes the first bucket; 2.bias + 2.weight + 0.bias + 0.weight = 6400 B the second.
  CHECK((initial_bucket_indices(params, {1000, 5000}) == Buckets{{5, 4}, {3, 2, 1, 0}}));
  CHECK((bucket_bytes({32, 1024, 128, 4096, 128, 2048}, {1000, 5000}) ==
         std::vector<int64_t>{1056, 6400}));
  // DDP's caps: 7456 B is under the 1 MiB first bucket.
  CHECK((initial_bucket_indices(params, BucketCaps{}) == Buckets{{5, 4, 3, 2, 1, 0}}));
  // One cap for all (as train_mlp --bucket-cap-bytes): 5280 B, then 2176 B.
  CHECK((initial_bucket_indices(params, BucketCaps::uniform(2000)) == Buckets{{5, 4, 3, 2}, {1, 0}}));
}

TEST_CASE("the Reducer's buckets and bucket_bytes agree on random sizes", "[executor][buckets]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<torch::Tensor> params;
    std::vector<int64_t> ready_bytes;  // last parameter first
    for (size_t n = 1 + rng() % 20; n > 0; --n) {
      params.push_back(torch::empty({static_cast<int64_t>(1 + rng() % 64)}));
    }
    for (auto p = params.rbegin(); p != params.rend(); ++p) ready_bytes.push_back(p->numel() * 4);
    const BucketCaps caps{static_cast<int64_t>(1 + rng() % 200), static_cast<int64_t>(1 + rng() % 400)};
    std::vector<int64_t> sizes;
    for (const auto& bucket : initial_bucket_indices(params, caps)) {
      int64_t bytes = 0;
      for (size_t i : bucket) bytes += params[i].numel() * 4;
      sizes.push_back(bytes);
    }
    INFO("caps " << caps.first_bytes << ", " << caps.bytes);
    CHECK(sizes == bucket_bytes(ready_bytes, caps));
  }
}

TEST_CASE("rank agreement names the first two ranks that differ", "[executor][agreement]") {
  RankFingerprint a{std::string(64, 'a'), "placement dp=2 mp=1", std::string(64, 'p'), "6 tensors"};
  RankFingerprint b = a;
  CHECK_FALSE(describe_disagreement({a, a, a}).has_value());
  b.plan_sha256 = std::string(64, 'b');
  b.plan_summary = "pipeline dp=1 mp=2";
  CHECK(describe_disagreement({a, a, b}).value() ==
        "rank 0 and rank 2 hold different plans: rank 0 has placement dp=2 mp=1 (plan sha256 "
        "aaaaaaaaaaaa), rank 2 has pipeline dp=1 mp=2 (plan sha256 bbbbbbbbbbbb); every rank must "
        "load the same plan and graph");
  RankFingerprint c = a;
  c.params_sha256 = std::string(64, 'q');
  c.params_summary = "4 tensors";
  CHECK_THAT(describe_disagreement({a, c}).value(),
             Catch::Matchers::StartsWith("rank 0 and rank 1 hold different model parameters: rank 0 "
                                         "has 6 tensors"));
  CHECK(fingerprint_from_string(fingerprint_to_string(c)).params_summary == "4 tensors");
}

TEST_CASE("rank agreement refuses ranks of other versions first, naming both",
          "[executor][agreement]") {
  RankFingerprint a{std::string(64, 'a'), "placement dp=2 mp=1", std::string(64, 'p'), "6 tensors",
                    "2.13.0", "0.1.0"};
  RankFingerprint b = a;
  b.torch_version = "2.12.1";
  b.plan_sha256 = std::string(64, 'b');  // versions explain this too: they are named first
  CHECK(describe_disagreement({a, a, b}).value() ==
        "rank 0 and rank 2 run different versions: rank 0 has torch 2.13.0, hybridplan 0.1.0; rank 2 "
        "has torch 2.12.1, hybridplan 0.1.0; every rank must run the same torch and hybridplan versions");
  CHECK(fingerprint_from_string(fingerprint_to_string(b)).torch_version == "2.12.1");
  CHECK(local_torch_version() == TORCH_VERSION);
  CHECK(local_hybridplan_version() == HYBRIDPLAN_TEST_VERSION);
}

TEST_CASE("version and lost-peer messages are the Python executor's (rank_messages.json)",
          "[executor][agreement][lost_peer]") {
  const Json table = read_json_file((test::source_dir() / "tests/data/rank_messages.json").string());
  for (const Json& c : table.at("versions")) {
    const Json& a = c.at("a");
    const Json& b = c.at("b");
    std::optional<std::string> got = describe_version_difference(
        a[0].get<int64_t>(), a[1].get<std::string>(), a[2].get<std::string>(), b[0].get<int64_t>(),
        b[1].get<std::string>(), b[2].get<std::string>());
    INFO(c.dump());
    if (c.at("message").is_null()) {
      CHECK_FALSE(got.has_value());
    } else {
      CHECK(got.value_or("nothing") == c.at("message").get<std::string>());
    }
  }
  for (const Json& c : table.at("alive_keys")) {
    CHECK(alive_key(c.at("incident").get<std::string>(), c.at("rank").get<int64_t>()) ==
          c.at("key").get<std::string>());
  }
  for (const Json& c : table.at("lost_peer")) {
    std::optional<std::vector<int64_t>> missing;
    if (!c.at("missing").is_null()) missing = c.at("missing").get<std::vector<int64_t>>();
    INFO(c.dump());
    CHECK(lost_peer_message(c.at("what").get<std::string>(), c.at("rank").get<int64_t>(), missing,
                            c.at("error_type").get<std::string>(), c.at("error_text").get<std::string>()) ==
          c.at("message").get<std::string>());
  }
  for (const Json& c : table.at("communication_errors")) {
    INFO(c.dump());
    CHECK(is_communication_error_text(c.at("text").get<std::string>()) == c.at("is").get<bool>());
  }
  CHECK(kLostPeerGraceS == table.at("grace_s").get<double>());
  CHECK(error_type_name(std::runtime_error("x")) == "runtime_error");
}

namespace {

// A module whose state has every kind of key: nested containers, buffers (BatchNorm).
struct NestedNet : torch::nn::Module {
  NestedNet() {
    features = register_module("features", torch::nn::ModuleList(torch::nn::Linear(4, 6),
                                                                   torch::nn::BatchNorm1d(6)));
    head = register_module("head", torch::nn::Linear(6, 2));
  }
  torch::nn::ModuleList features{nullptr};
  torch::nn::Linear head{nullptr};
};

std::vector<std::string> keys_of(const NamedTensors& named) {
  std::vector<std::string> keys;
  for (const auto& [key, t] : named) keys.push_back(key);
  return keys;
}

// Two steps of `opt` on a fixed regression problem.
void train_two_steps(torch::nn::Sequential& model, torch::optim::Optimizer& opt, int64_t seed) {
  for (int64_t step = 0; step < 2; ++step) {
    torch::manual_seed(seed + step);
    torch::Tensor x = torch::randn({8, 16}), y = torch::randn({8, 8});
    opt.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    opt.step();
  }
}

}  // namespace

TEST_CASE("checkpoint keys are Python's state_dict keys, in its order", "[executor][checkpoint]") {
  // torch.nn.Sequential(Linear(16, 32), ReLU(), Linear(32, 32), ReLU(), Linear(32, 8)).state_dict()
  torch::manual_seed(0);
  auto mlp = models::mlp({16, 32, 32, 8});
  const std::vector<std::string> mlp_keys{"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"};
  CHECK(keys_of(module_state(*mlp)) == mlp_keys);
  // Python: features.0.weight, features.0.bias, features.1.weight, features.1.bias,
  // features.1.running_mean, features.1.running_var, features.1.num_batches_tracked, head.*
  auto net = std::make_shared<NestedNet>();
  const std::vector<std::string> net_keys{"features.0.weight", "features.0.bias", "features.1.weight",
                                          "features.1.bias", "features.1.running_mean", "features.1.running_var",
                                          "features.1.num_batches_tracked", "head.weight", "head.bias"};
  CHECK(keys_of(module_state(*net)) == net_keys);
}

TEST_CASE("optimizer state by name round-trips through a checkpoint file", "[executor][checkpoint]") {
  const std::string dir = std::filesystem::temp_directory_path() / ("hp_ckpt_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const std::string kind : {"SGD", "Adam"}) {
    INFO(kind);
    auto make = [&](torch::nn::Sequential& m) -> std::unique_ptr<torch::optim::Optimizer> {
      if (kind == "SGD") {
        return std::make_unique<torch::optim::SGD>(m->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
      }
      return std::make_unique<torch::optim::Adam>(m->parameters(), torch::optim::AdamOptions(0.01));
    };
    torch::manual_seed(0);
    torch::nn::Sequential a = models::mlp({16, 32, 8});
    auto opt_a = make(a);
    train_two_steps(a, *opt_a, 10);
    IDict model = new_dict();
    for (const auto& [key, t] : module_state(*a)) model.insert(key, t.detach().clone());
    const std::string path = dir + "/" + kind + ".pt";
    const std::vector<char> bytes = pickle_plain(
        build_checkpoint(model, optimizer_state_by_name(*opt_a, canonical_parameter_names(*a)), 2, "{}", "abc"));
    write_file_atomic(path, std::string(bytes.begin(), bytes.end()));
    CHECK(std::filesystem::exists(path));
    CHECK_FALSE(std::filesystem::exists(path + ".tmp-" + std::to_string(::getpid())));

    // Another model and optimizer (other lr) resumed from the file trains on exactly as `a`.
    torch::manual_seed(1);
    torch::nn::Sequential b = models::mlp({16, 32, 8});
    std::unique_ptr<torch::optim::Optimizer> opt_b =
        kind == "SGD" ? std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::SGD>(
                            b->parameters(), torch::optim::SGDOptions(0.5)))
                      : std::make_unique<torch::optim::Adam>(b->parameters(), torch::optim::AdamOptions(0.5));
    const IDict ckpt = read_checkpoint(path);
    CHECK(ckpt.at("step").toInt() == 2);
    check_model(ckpt, *b, path);
    load_model_state(ckpt, *b);
    load_optimizer_state(*opt_b, canonical_parameter_names(*b), ckpt.at("optimizer").toGenericDict(), path);
    train_two_steps(a, *opt_a, 20);
    train_two_steps(b, *opt_b, 20);
    for (size_t i = 0; i < a->parameters().size(); ++i) {
      CHECK(torch::equal(a->parameters()[i], b->parameters()[i]));
    }
    const IDict state = ckpt.at("optimizer").toGenericDict().at("state").toGenericDict();
    std::vector<std::string> fields;
    for (const auto& f : state.at("0.weight").toGenericDict()) fields.push_back(f.key().toStringRef());
    const std::vector<std::string> expected_fields =
        kind == "SGD" ? std::vector<std::string>{"momentum_buffer"}
                      : std::vector<std::string>{"step", "exp_avg", "exp_avg_sq"};
    CHECK(fields == expected_fields);

    // A checkpoint of another model, or for another optimizer, is refused naming file and key.
    torch::nn::Sequential wider = models::mlp({16, 40, 8});
    CHECK_THROWS_WITH(check_model(ckpt, *wider, path),
                      path + ": model['0.weight'] must be torch.float32[40, 16] as in Sequential (got "
                             "torch.float32[32, 16]): the checkpoint is of another model");
    torch::optim::Adagrad other(b->parameters());
    CHECK_THROWS_WITH(load_optimizer_state(other, canonical_parameter_names(*b),
                                           ckpt.at("optimizer").toGenericDict(), path),
                      Catch::Matchers::StartsWith(path + ": optimizer.class must be the optimizer resumed"));
  }
  std::ofstream(dir + "/bad.pt") << "not a zip";
  CHECK_THROWS_WITH(read_checkpoint(dir + "/bad.pt"),
                    Catch::Matchers::StartsWith(dir + "/bad.pt: checkpoint must be a file written by save_checkpoint"));
  CHECK_THROWS_WITH(write_file_atomic(dir + "/no/such/dir/ckpt.pt", "x"),
                    dir + "/no/such/dir/ckpt.pt: cannot write file (No such file or directory)");
  std::filesystem::remove_all(dir);
}

TEST_CASE("the C++ executor refuses plans it would not run as priced, before any process group",
          "[executor][refuse]") {
  const Graph graph = test::make_graph({{"fc1", 1, 2, 100, 10}, {"fc2", 1, 2, 100, 10}}, {{0, 1, 10}});
  const Cluster cluster = test::make_cluster(1, 2);
  Plan plan = test::make_plan(graph, cluster, 2, 1, MpMode::kPlacement, 4, {0, 0});
  DistEnv env;
  env.world_size = 2;
  const auto module = std::make_shared<torch::nn::Module>();
  ExecutorOptions options;
  options.plan_source = "plan.json";
  plan.sharding = Sharding::kZero2;  // libtorch has no fully_shard
  CHECK_THROWS_WITH(Executor(plan, graph, module, env, options),
                    Catch::Contains("plan.json: sharding is not supported by the C++ executor") &&
                        Catch::Contains("(got \"zero2\")"));
  plan.sharding = Sharding::kNone;
  const Graph chain = test::make_graph(
      {{"fc1", 1, 2, 100, 10}, {"fc2", 1, 2, 100, 10}, {"fc3", 1, 2, 100, 10}, {"fc4", 1, 2, 100, 10}},
      {{0, 1, 10}, {1, 2, 10}, {2, 3, 10}});
  Plan multi = test::make_plan(chain, cluster, 1, 2, MpMode::kPipeline, 4, {0, 1, 2, 3}, 2,
                               Schedule::kInterleaved1F1B);  // one stage per rank only
  multi.virtual_stages = 2;
  CHECK_THROWS_WITH(Executor(multi, chain, module, env, options),
                    Catch::Contains("plan.json: schedule is not supported by the C++ executor") &&
                        Catch::Contains("(got \"interleaved-1f1b\")"));
  plan.recompute = {0, 1};  // it keeps every activation
  CHECK_THROWS_WITH(Executor(plan, graph, module, env, options),
                    Catch::Contains("plan.json: assignment[1].recompute is not supported by the C++ "
                                    "executor"));
  plan.recompute.clear();
  plan.tp = 2;  // libtorch has no DTensor parallelize_module
  plan.world_size = 4;
  plan.mesh = {{0}, {2}};
  CHECK_THROWS_WITH(Executor(plan, graph, module, env, options),
                    Catch::Contains("plan.json: tp is not supported by the C++ executor") &&
                        Catch::Contains("(got 2)"));
}
