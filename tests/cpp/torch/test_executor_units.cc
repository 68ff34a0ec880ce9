// The executor's pure parts, without a process group: torchrun environment parsing, gradient
// bucket assignment, rank agreement. (Pipeline schedules are torch-free: tests/cpp/planner.)
#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "catch.h"
#include "common/error.h"
#include "executor/dist_env.h"
#include "executor/grad_buckets.h"
#include "executor/rank_agreement.h"

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

TEST_CASE("gradient buckets fill in reverse parameter order up to the cap", "[executor][buckets]") {
  using Buckets = std::vector<std::vector<int32_t>>;
  // 4 x 4 bytes, cap 8: params 3,2 fill the first bucket (8 bytes), 1,0 the second.
  CHECK((assign_grad_buckets({4, 4, 4, 4}, 8) == Buckets{{3, 2}, {1, 0}}));
  // A parameter larger than the cap gets its own bucket; nothing joins it afterwards.
  CHECK((assign_grad_buckets({4, 100, 4}, 8) == Buckets{{2}, {1}, {0}}));
  // Default 25 MB: 10 + 10 MB fit, a third 10 MB would make 30 MB > 25 MB.
  const int64_t mb = 1024 * 1024;
  CHECK((assign_grad_buckets({10 * mb, 10 * mb, 10 * mb}) == Buckets{{2, 1}, {0}}));
  CHECK(assign_grad_buckets({}, 8).empty());
}

TEST_CASE("gradient buckets never mix keys (device/dtype)", "[executor][buckets]") {
  using Buckets = std::vector<std::vector<int32_t>>;
  // Walking 3(b) 2(a) 1(b) 0(a): b's bucket opens first, then a's.
  CHECK((assign_grad_buckets({1, 1, 1, 1}, 100, {"a", "b", "a", "b"}) == Buckets{{3, 1}, {2, 0}}));
  CHECK_THROWS_WITH(assign_grad_buckets({1, 1}, 100, {"a"}),
                    "bucket keys must be empty or one per parameter (got 1 keys for 2 parameters)");
}

TEST_CASE("gradient buckets cover every parameter once and respect the cap", "[executor][buckets]") {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<int64_t> bytes(1 + rng() % 30);
    for (auto& b : bytes) b = rng() % 100;
    const int64_t cap = 1 + rng() % 150;
    auto buckets = assign_grad_buckets(bytes, cap);
    std::vector<int32_t> seen;
    for (const auto& bucket : buckets) {
      int64_t total = 0;
      for (int32_t i : bucket) total += bytes[i];
      CHECK((bucket.size() == 1 || total <= cap));
      CHECK(std::is_sorted(bucket.rbegin(), bucket.rend()));
      seen.insert(seen.end(), bucket.begin(), bucket.end());
    }
    std::vector<int32_t> expected(bytes.size());
    std::iota(expected.rbegin(), expected.rend(), 0);
    CHECK(seen == expected);  // buckets in launch order walk the parameters last to first
  }
}

TEST_CASE("gradient buckets reject bad input", "[executor][buckets]") {
  CHECK_THROWS_WITH(assign_grad_buckets({1}, 0), "bucket_cap_bytes must be >= 1 (got 0)");
  CHECK_THROWS_WITH(assign_grad_buckets({1, -2}, 8), "param_bytes[1] must be >= 0 (got -2)");
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
