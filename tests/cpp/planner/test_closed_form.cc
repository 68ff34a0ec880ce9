// The closed form of Pal et al. (IEEE Micro 2019, https://arxiv.org/abs/1907.13257), checked
// against evaluate(): with no communication, epochs(B) = E (1 + B / Bc), a per-replica batch b
// and a model that M devices run s times faster than one (speedup s), N devices give
//   DP:      B = N b,      time = E (1 + N b / Bc) * S / (N b) * T
//   hybrid:  B = N b / M,  time = E (1 + N b / (M Bc)) * S M / (N b) * T / s
// They are equal where x = N b / Bc satisfies (1 + x) s = M + x, i.e. at
//   N* = (Bc / b) (M - s) / (s - 1);
// beyond N* the hybrid wins, and time_DP / time_hybrid = s (1 + x) / (M + x) -> s as N grows.
#include <cmath>

#include "catch.h"
#include "model_fixtures.h"
#include "planner/costs/evaluate.h"

using namespace hybridplan;

namespace {

struct Setup {
  int64_t mp;        // M devices per hybrid worker
  double speedup;    // s, exact for this graph and placement
  Problem problem;
  std::vector<int32_t> placement;
};

// `branches` independent nodes of forward 1 s, backward 2 s at batch b = 32, no parameters and
// no bytes (no communication at all), placed round-robin on mp devices.
Setup make_setup(int branches, int64_t mp, double critical_batch) {
  Setup setup;
  setup.mp = mp;
  std::vector<test::NodeSpec> nodes;
  for (int i = 0; i < branches; ++i) nodes.push_back({"branch." + std::to_string(i), 1, 2, 0, 0});
  setup.problem.graph = test::make_graph(nodes, {}, 32, "branches");
  setup.problem.job.samples_per_epoch = int64_t{1} << 40;  // divisible by every global batch used
  setup.problem.job.convergence.model = Convergence::Model::kCriticalBatch;
  setup.problem.job.convergence.epochs_min = 30;
  setup.problem.job.convergence.critical_batch = critical_batch;
  for (int i = 0; i < branches; ++i) setup.placement.push_back(static_cast<int32_t>(i % mp));
  // one device: branches * 3 s; mp devices: ceil(branches / mp) * 3 s
  const int per_device = (branches + static_cast<int>(mp) - 1) / static_cast<int>(mp);
  setup.speedup = static_cast<double>(branches) / per_device;
  return setup;
}

double time_to_train(Setup& setup, int64_t devices, bool hybrid) {
  const int64_t mp = hybrid ? setup.mp : 1;
  setup.problem.cluster = test::make_cluster(std::max<int64_t>(1, devices / 8), std::min<int64_t>(devices, 8));
  const std::vector<int32_t> assignment =
      hybrid ? setup.placement : std::vector<int32_t>(setup.problem.graph.nodes.size(), 0);
  const Plan plan = test::make_plan(setup.problem.graph, setup.problem.cluster, devices / mp, mp,
                                    MpMode::kPlacement, 32, assignment);
  const Prediction p = evaluate(setup.problem, plan);
  REQUIRE(p.allreduce_s == 0);
  REQUIRE(p.transfer_s == 0);
  return p.time_to_train_s;
}

void check_crossover(Setup setup, double critical_batch, double expected_crossover) {
  const double b = 32;
  const double m = static_cast<double>(setup.mp);
  const double s = setup.speedup;
  const double crossover = critical_batch / b * (m - s) / (s - 1);
  REQUIRE(crossover == expected_crossover);
  for (int64_t n = setup.mp; n <= 4096; n *= 2) {
    const double dp = time_to_train(setup, n, false);
    const double hybrid = time_to_train(setup, n, true);
    // The closed form itself, evaluated at n:
    const double x = n * b / critical_batch;
    CAPTURE(n, dp, hybrid);
    REQUIRE(dp / hybrid == Approx(s * (1 + x) / (m + x)).epsilon(1e-12));
    if (n < crossover) REQUIRE(hybrid > dp);
    if (n == crossover) REQUIRE(hybrid == Approx(dp).epsilon(1e-12));
    if (n > crossover) REQUIRE(hybrid < dp);
  }
  // The gain tends to s: at N = 2^20, x = 2^15 or more and s(1+x)/(M+x) is within 0.1% of s.
  const int64_t huge = int64_t{1} << 20;
  REQUIRE(time_to_train(setup, huge, false) / time_to_train(setup, huge, true) ==
          Approx(s).epsilon(1e-3));
}

}  // namespace

TEST_CASE("closed form: 6 branches on M=4 devices (s=3) overtake DP at N*=16", "[closed_form]") {
  // T1 = 6 * 3 s = 18 s; on 4 devices 2,2,1,1 branches: 2 * 3 = 6 s -> s = 3.
  // N* = (1024 / 32) (4 - 3) / (3 - 1) = 16
  Setup setup = make_setup(6, 4, 1024);
  REQUIRE(setup.speedup == 3);
  check_crossover(setup, 1024, 16);
}

TEST_CASE("closed form: 3 branches on M=2 devices (s=1.5) overtake DP at N*=64", "[closed_form]") {
  // T1 = 9 s; on 2 devices 2,1 branches: 6 s -> s = 1.5.
  // N* = (2048 / 32) (2 - 1.5) / (1.5 - 1) = 64
  Setup setup = make_setup(3, 2, 2048);
  REQUIRE(setup.speedup == 1.5);
  check_crossover(setup, 2048, 64);
}
