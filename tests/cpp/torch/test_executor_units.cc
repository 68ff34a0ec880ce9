// The executor's pure parts, without a process group: torchrun environment parsing, the
// Reducer's gradient buckets, pipeline schedules (including a deadlock simulation), rank agreement.
#include <algorithm>
#include <map>
#include <numeric>
#include <random>

#include "catch.h"
#include "common/error.h"
#include "executor/dist_env.h"
#include "executor/ddp_reducer.h"
#include "executor/pipeline_schedule.h"
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

TEST_CASE("GPipe and 1F1B pass orders", "[executor][schedule]") {
  CHECK(passes_to_string(stage_passes(Schedule::kGpipe, 0, 2, 4)) == "F0 F1 F2 F3 B0 B1 B2 B3");
  CHECK(passes_to_string(stage_passes(Schedule::kGpipe, 1, 2, 4)) == "F0 F1 F2 F3 B0 B1 B2 B3");
  // Stage 0 of 2: one warm-up forward, then 1F1B, then the last backward.
  CHECK(passes_to_string(stage_passes(Schedule::k1F1B, 0, 2, 4)) == "F0 F1 B0 F2 B1 F3 B2 B3");
  CHECK(passes_to_string(stage_passes(Schedule::k1F1B, 1, 2, 4)) == "F0 B0 F1 B1 F2 B2 F3 B3");
  // Warm-up is capped by the micro-batch count: stage 0 of 4 with 2 micro-batches.
  CHECK(passes_to_string(stage_passes(Schedule::k1F1B, 0, 4, 2)) == "F0 F1 B0 B1");
  CHECK_THROWS_WITH(stage_passes(Schedule::kNone, 0, 2, 4),
                    "a pipeline schedule must be gpipe or 1f1b (got none)");
  CHECK_THROWS_WITH(stage_passes(Schedule::kGpipe, 2, 2, 4),
                    "pipeline stage must be in 0..num_stages-1 (got stage 2 of 2)");
}

// Simulates S stages with blocking receives and asynchronous sends: F(i) on stage s > 0 needs
// stage s-1's F(i); B(i) on stage s < S-1 needs stage s+1's B(i). Every schedule must finish,
// and 1F1B must keep at most S - s micro-batches in flight on stage s.
TEST_CASE("pipeline schedules never deadlock", "[executor][schedule]") {
  for (Schedule schedule : {Schedule::kGpipe, Schedule::k1F1B}) {
    for (int64_t S = 1; S <= 4; ++S) {
      for (int64_t m = 1; m <= 6; ++m) {
        std::vector<std::vector<PipelinePass>> passes;
        for (int64_t s = 0; s < S; ++s) passes.push_back(stage_passes(schedule, s, S, m));
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
