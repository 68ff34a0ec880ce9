// Plans over a run whose critical batch grows: the trajectory integral (hand-computed), and a
// schedule that changes plan as the critical batch grows and beats the best single plan.
#include <cmath>

#include "catch.h"
#include "model_fixtures.h"
#include "planner/documents/presets.h"
#include "planner/run/convergence.h"
#include "planner/run/run_phases.h"

using namespace hybridplan;

namespace {

// examples/graph-tiny.json: an Inception-style block profiled at batch 32.
Graph tiny_graph() {
  return test::make_graph({{"input", 0, 0, 0, 393216},
                           {"stem.conv", 0.004, 0.008, 7168, 2097152},
                           {"branch_a.conv", 0.006, 0.012, 147712, 2097152},
                           {"branch_b.conv", 0.005, 0.010, 409856, 2097152},
                           {"concat", 0.0005, 0.0005, 0, 4194304},
                           {"head.fc", 0.002, 0.004, 8392704, 1280}},
                          {{0, 1, 393216}, {1, 2, 2097152}, {1, 3, 2097152}, {2, 4, 2097152},
                           {3, 4, 2097152}, {4, 5, 4194304}},
                          32, "tiny_branchy_cnn");
}

Problem problem_with(std::vector<std::pair<double, double>> trajectory) {
  Problem p;
  p.graph = tiny_graph();
  p.cluster = load_cluster("dgx1-v100");
  p.job.samples_per_epoch = 1'000'000;
  p.job.per_replica_batches = {32};
  p.job.convergence.model = Convergence::Model::kCriticalBatch;
  p.job.convergence.epochs_min = 10;
  p.job.convergence.critical_batch = trajectory.front().second;
  if (trajectory.size() > 1) p.job.convergence.critical_batch_trajectory = std::move(trajectory);
  p.job.validate("test job");
  return p;
}

}  // namespace

TEST_CASE("critical batch trajectory: log-linear, integrated exactly", "[run_phases]") {
  Convergence c;
  c.model = Convergence::Model::kCriticalBatch;
  c.epochs_min = 10;
  c.critical_batch = 100;
  // Constant: epochs(B) = 10 (1 + B / 100).
  REQUIRE(epochs_to_target(c, 300) == Approx(40));
  REQUIRE(phase_epochs(c, 300, 0.25, 0.75) == Approx(20));  // half the run
  // B_crit(p) = 100 * 8^p: int_0^1 dp / B_crit = (1 - 1/8) / (100 ln 8) = 0.0042079...
  c.critical_batch_trajectory = {{0, 100}, {1, 800}};
  REQUIRE(integral_inverse_critical_batch(c, 0, 1) == Approx(0.875 / (100 * std::log(8.0))));
  REQUIRE(epochs_to_target(c, 300) == Approx(10 * (1 + 300 * 0.875 / (100 * std::log(8.0)))));
  // Split into halves, the integrals add up; beyond the points the ends hold.
  REQUIRE(integral_inverse_critical_batch(c, 0, 0.5) + integral_inverse_critical_batch(c, 0.5, 1) ==
          Approx(integral_inverse_critical_batch(c, 0, 1)));
  c.critical_batch_trajectory = {{0.5, 100}, {0.75, 800}};
  REQUIRE(integral_inverse_critical_batch(c, 0, 0.5) == Approx(0.5 / 100));
  REQUIRE(integral_inverse_critical_batch(c, 0.75, 1) == Approx(0.25 / 800));
}

TEST_CASE("a growing critical batch: the plan changes over the run and the schedule wins",
          "[run_phases]") {
  SearchOptions options;
  options.devices = 8;
  RunPhasesOptions run;
  run.segments = 16;
  run.switch_s = 60;
  // Constant critical batch: one phase, the best single plan, the same time.
  const Problem flat = problem_with({{0, 100}});
  const RunPhases one = plan_over_run(flat, options, run);
  REQUIRE(one.phases.size() == 1);
  REQUIRE(one.switches == 0);
  REQUIRE(one.time_s == Approx(one.best_single_time_s));
  // Small critical batch early, 8x larger at the end: small global batches (MP) first, data
  // parallelism at the end; the schedule beats every single plan by more than its switches.
  const Problem growing = problem_with({{0, 50}, {1, 400}});
  const RunPhases s = plan_over_run(growing, options, run);
  INFO(run_phases_to_json(s, growing).dump(2));
  REQUIRE(s.phases.size() >= 2);
  REQUIRE(s.phases.front().plan.global_batch < s.phases.back().plan.global_batch);
  REQUIRE(s.phases.front().plan.mp > s.phases.back().plan.mp);
  REQUIRE(s.time_s < s.best_single_time_s);
  REQUIRE(s.phases.front().progress_start == 0);
  REQUIRE(s.phases.back().progress_end == 1);
  double phases_s = 0;
  for (const RunPhase& p : s.phases) phases_s += p.time_s;
  REQUIRE(s.time_s == Approx(phases_s + s.switches * s.switch_s));
  // A switch dearer than anything it saves keeps one plan.
  run.switch_s = 1e12;
  REQUIRE(plan_over_run(growing, options, run).phases.size() == 1);
  // Only the critical-batch model says how the batch's cost changes over the run.
  Problem no_model = growing;
  no_model.job.convergence = Convergence{};
  REQUIRE(test::input_error_of([&] { plan_over_run(no_model, options, run); }) ==
          "job: convergence.model must be critical_batch to plan over the run (the critical "
          "batch, or its trajectory over training progress, decides each phase's plan) (got none)");
}
