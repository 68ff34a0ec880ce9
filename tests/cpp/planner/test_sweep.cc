// sweep: device counts, the DP-only vs hybrid comparison, and its JSON/CSV forms.
#include <sstream>

#include "catch.h"
#include "common/error.h"
#include "common/json_io.h"
#include "planner/costs/evaluate.h"
#include "planner/searches/sweep.h"

using namespace hybridplan;

namespace {

// A chain of two heavy layers: splitting it over devices (MP) shortens the step, so at some N
// the hybrid plan may beat DP alone; either way it can never be worse (DP-only plans are part
// of the hybrid search space).
Problem small_problem() {
  Problem p;
  p.graph = graph_from_json(Json::parse(R"({
    "schema_version": 1, "kind": "hybridplan.graph", "name": "two_layers",
    "profiled": {"device": "cpu", "batch_size": 32, "dtype": "float32"},
    "nodes": [
      {"id": 0, "name": "a", "op": "linear", "forward_s": 0.010, "backward_s": 0.020,
       "param_bytes": 40000000, "output_bytes": 131072},
      {"id": 1, "name": "b", "op": "linear", "forward_s": 0.010, "backward_s": 0.020,
       "param_bytes": 40000000, "output_bytes": 4096}],
    "edges": [{"src": 0, "dst": 1}]})"), "two_layers.json");
  p.cluster = cluster_from_json(Json::parse(R"({
    "schema_version": 1, "kind": "hybridplan.cluster", "name": "four_cpus",
    "num_nodes": 1, "devices_per_node": 4,
    "device": {"name": "cpu", "memory_bytes": 17179869184, "peak_flops": 1e11},
    "intra_node": {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-05},
    "inter_node": {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-05}})"), "four_cpus.json");
  p.job = job_from_json(Json::parse(R"({
    "schema_version": 1, "kind": "hybridplan.job", "samples_per_epoch": 100000,
    "per_replica_batch": 32, "optimizer": "sgd",
    "convergence": {"model": "critical_batch", "epochs_min": 10, "critical_batch": 256}})"),
                        "job.json");
  return p;
}

}  // namespace

TEST_CASE("sweep: device counts are powers of two up to the maximum") {
  CHECK(sweep_device_counts(1) == std::vector<int64_t>{1});
  CHECK(sweep_device_counts(8) == std::vector<int64_t>{1, 2, 4, 8});
  CHECK(sweep_device_counts(12) == std::vector<int64_t>{1, 2, 4, 8, 12});
}

TEST_CASE("sweep: DP only vs best on each device count") {
  const Problem problem = small_problem();
  const std::vector<SweepPoint> points = sweep(problem, 4);
  REQUIRE(points.size() == 3);
  for (const SweepPoint& point : points) {
    INFO("devices " << point.devices);
    REQUIRE(point.dp_only.has_value());
    REQUIRE(point.best.has_value());
    CHECK(point.dp_only->dp == point.devices);
    CHECK(point.dp_only->mp == 1);
    CHECK(point.best->world_size == point.devices);
    // The reported numbers are evaluate()'s, and the hybrid optimum includes pure DP.
    const Prediction again = evaluate(problem, *point.best);
    CHECK(again.time_to_train_s == Approx(point.best->predicted.time_to_train_s));
    CHECK(objective(problem, point.best->predicted) <=
          objective(problem, point.dp_only->predicted) * (1 + 1e-12));
  }
  // One device: DP only and best are the same single-device plan.
  CHECK(points[0].best->predicted.step_s == Approx(points[0].dp_only->predicted.step_s));
}

TEST_CASE("sweep: JSON and CSV forms") {
  const Problem problem = small_problem();
  const std::vector<SweepPoint> points = sweep(problem, 2);
  const Json j = sweep_to_json(points);
  REQUIRE(j.is_array());
  REQUIRE(j.size() == 2);
  CHECK(j[0]["devices"] == 1);
  CHECK(j[1]["devices"] == 2);
  for (const char* which : {"dp_only", "best"}) {
    for (const char* field : {"dp", "mp", "mode", "global_batch", "step_s", "time_to_train_s",
                              "samples_per_s"}) {
      INFO(which << "." << field);
      CHECK(j[1][which].contains(field));
    }
  }
  CHECK(j[1]["dp_only"]["dp"] == 2);
  CHECK(j[1]["dp_only"]["step_s"].get<double>() == points[1].dp_only->predicted.step_s);

  std::istringstream csv(sweep_to_csv(points));
  std::string header, row1, row2, extra;
  std::getline(csv, header);
  std::getline(csv, row1);
  std::getline(csv, row2);
  CHECK(!std::getline(csv, extra));
  CHECK(header.rfind("devices,dp_only_dp,dp_only_mp,dp_only_mode,", 0) == 0);
  CHECK(header.find(",best_time_to_train_s,") != std::string::npos);
  CHECK(row2.rfind("2,2,1,", 0) == 0);  // 2 devices: dp_only dp=2, mp=1
}

TEST_CASE("sweep: max devices must fit the cluster") {
  const Problem problem = small_problem();
  CHECK_THROWS_WITH(sweep(problem, 8),
                    Catch::Matchers::Contains("--max-devices must be in 1..4") &&
                        Catch::Matchers::Contains("(got 8)"));
  CHECK_THROWS_AS(sweep(problem, 0), InputError);
}
