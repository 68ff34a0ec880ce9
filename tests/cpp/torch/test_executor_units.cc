// The executor's pure parts, without a process group: torchrun environment parsing, the
// Reducer's gradient buckets, rank agreement. (Pipeline schedules are torch-free: tests/cpp/planner.)
#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "catch.h"
#include "common/error.h"
#include "executor/dist_env.h"
#include "executor/ddp_reducer.h"
#include "executor/rank_agreement.h"
#include "models/mlp.h"
#include "planner/bucket_policy.h"

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
