#include "catch.h"
#include "model_fixtures.h"
#include "planner/documents/job.h"

using namespace hybridplan;
using hybridplan::test::input_error_of;

namespace {

Json valid_job_json() {
  return Json::parse(R"({
    "schema_version": 1, "kind": "hybridplan.job",
    "samples_per_epoch": 1281167, "per_replica_batch": 64, "optimizer": "sgd_momentum",
    "convergence": {"model": "critical_batch", "epochs_min": 90, "critical_batch": 8192},
    "num_microbatches": [1, 4, 8]})");
}

std::string load_error(const Json& j) {
  return input_error_of([&] { job_from_json(j, "job.json"); });
}

}  // namespace

TEST_CASE("job_from_json reads both convergence models and round-trips", "[job]") {
  const Job job = job_from_json(valid_job_json(), "job.json");
  REQUIRE(job.samples_per_epoch == 1281167);
  REQUIRE(job.per_replica_batches == BatchCandidates{64});
  REQUIRE(job.optimizer == Optimizer::kSgdMomentum);
  REQUIRE(job.convergence.model == Convergence::Model::kCriticalBatch);
  REQUIRE(job.convergence.critical_batch == 8192);
  REQUIRE(job.num_microbatches == std::vector<int64_t>{1, 4, 8});
  REQUIRE(job_to_json(job_from_json(job_to_json(job), "again")) == job_to_json(job));

  Json t = valid_job_json();
  t["convergence"] = Json::parse(R"({"model": "table", "points": [[256, 90], [8192, 92], [32768, 140]]})");
  const Job table = job_from_json(t, "job.json");
  REQUIRE(table.convergence.model == Convergence::Model::kTable);
  REQUIRE(table.convergence.points.size() == 3);
  REQUIRE(table.convergence.points[2] == std::pair<double, double>{32768, 140});
  REQUIRE(job_to_json(job_from_json(job_to_json(table), "again")) == job_to_json(table));
}

TEST_CASE("a critical batch may grow over the run", "[job]") {
  Json j = valid_job_json();
  j["convergence"]["critical_batch"] = Json::parse("[[0, 256], [1, 2048]]");
  const Job job = job_from_json(j, "job.json");
  REQUIRE(job.convergence.critical_batch_trajectory.size() == 2);
  REQUIRE(job.convergence.critical_batch_trajectory[1] == std::pair<double, double>{1, 2048});
  REQUIRE(job_to_json(job)["convergence"]["critical_batch"] == Json::parse("[[0.0, 256.0], [1.0, 2048.0]]"));
  REQUIRE(job_to_json(job_from_json(job_to_json(job), "again")) == job_to_json(job));
}

TEST_CASE("a job needs only its header", "[job]") {
  const Job job = job_from_json(Json::parse(R"({"schema_version": 1, "kind": "hybridplan.job"})"), "j");
  REQUIRE(job.convergence.model == Convergence::Model::kNone);
  REQUIRE(job.optimizer == Optimizer::kSgd);
  REQUIRE(job.per_replica_batches.empty());
  REQUIRE(job.global_batches.empty());
}

TEST_CASE("batch candidates: one, a list, or a range of powers of two", "[job]") {
  Json j = valid_job_json();
  j["per_replica_batch"] = Json::parse("[64, 16, 32, 16]");
  REQUIRE(job_from_json(j, "job.json").per_replica_batches == BatchCandidates{16, 32, 64});
  j["per_replica_batch"] = Json::parse(R"({"min": 6, "max": 40})");
  REQUIRE(job_from_json(j, "job.json").per_replica_batches == BatchCandidates{6, 8, 16, 32, 40});
  const Job listed = job_from_json(j, "job.json");
  REQUIRE(job_to_json(listed)["per_replica_batch"] == Json::parse("[6, 8, 16, 32, 40]"));
  REQUIRE(job_to_json(job_from_json(job_to_json(listed), "again")) == job_to_json(listed));
  j.erase("per_replica_batch");
  j["global_batch"] = Json::parse("[256, 1024]");
  REQUIRE(job_from_json(j, "job.json").global_batches == BatchCandidates{256, 1024});
}

TEST_CASE("job validation messages", "[job]") {
  Json j = valid_job_json();
  SECTION("points not increasing in B") {
    j["convergence"] = Json::parse(R"({"model": "table", "points": [[256, 90], [256, 92]]})");
    REQUIRE(load_error(j) ==
            "job.json: convergence.points[1][0] must be greater than the previous point's global "
            "batch 256 (points increasing in B) (got 256)");
  }
  SECTION("point not a pair") {
    j["convergence"] = Json::parse(R"({"model": "table", "points": [[256, 90, 1]]})");
    REQUIRE(load_error(j) ==
            "job.json: convergence.points[0] must be a [global_batch, epochs] pair (got [256,90,1])");
  }
  SECTION("empty table") {
    j["convergence"] = Json::parse(R"({"model": "table", "points": []})");
    REQUIRE(load_error(j) ==
            "job.json: convergence.points must list at least one [global_batch, epochs] pair (got [])");
  }
  SECTION("non-positive epochs") {
    j["convergence"]["epochs_min"] = 0;
    REQUIRE(load_error(j) == "job.json: convergence.epochs_min must be finite and > 0 (got 0)");
  }
  SECTION("unknown model") {
    j["convergence"]["model"] = "magic";
    REQUIRE(load_error(j) ==
            "job.json: convergence.model must be \"critical_batch\" or \"table\" (got \"magic\")");
  }
  SECTION("unknown optimizer") {
    j["optimizer"] = "lamb";
    REQUIRE(load_error(j) ==
            "job.json: optimizer must be one of \"sgd\", \"sgd_momentum\", \"adam\" (got \"lamb\")");
  }
  SECTION("both batch rules") {
    j["global_batch"] = 1024;
    REQUIRE(load_error(j) ==
            "job.json: global_batch must not be given together with per_replica_batch (give one "
            "of them) (got 1024)");
  }
  SECTION("batch") {
    j["per_replica_batch"] = 0;
    REQUIRE(load_error(j) == "job.json: per_replica_batch must be >= 1 (got 0)");
  }
  SECTION("batch list") {
    j["per_replica_batch"] = Json::parse("[8, -2]");
    REQUIRE(load_error(j) == "job.json: per_replica_batch[1] must be >= 1 (got -2)");
  }
  SECTION("empty batch list") {
    j["per_replica_batch"] = Json::array();
    REQUIRE(load_error(j) == "job.json: per_replica_batch must list at least one batch size (got [])");
  }
  SECTION("batch range") {
    j["per_replica_batch"] = Json::parse(R"({"min": 64, "max": 8})");
    REQUIRE(load_error(j) == "job.json: per_replica_batch.max must be >= min = 64 (got 8)");
  }
  SECTION("batch of the wrong type") {
    j["per_replica_batch"] = "big";
    REQUIRE(load_error(j) ==
            "job.json: per_replica_batch must be a batch size, a list of batch sizes or "
            "{\"min\": a, \"max\": b} (got \"big\")");
  }
  SECTION("critical batch trajectory out of order") {
    j["convergence"]["critical_batch"] = Json::parse("[[0, 256], [0.5, 512], [0.5, 2048]]");
    REQUIRE(load_error(j) ==
            "job.json: convergence.critical_batch[2][0] must be greater than the previous "
            "point's progress 0.5 (points increasing) (got 0.5)");
  }
  SECTION("critical batch trajectory beyond the run") {
    j["convergence"]["critical_batch"] = Json::parse("[[0, 256], [1.5, 512]]");
    REQUIRE(load_error(j) ==
            "job.json: convergence.critical_batch[1][0] must be a training progress in 0..1 (got 1.5)");
  }
  SECTION("micro-batches") {
    j["num_microbatches"] = {4, 0};
    REQUIRE(load_error(j) == "job.json: num_microbatches[1] must be >= 1 (got 0)");
  }
  SECTION("samples per epoch needed with a convergence model") {
    j.erase("samples_per_epoch");
    REQUIRE(load_error(j) ==
            "job.json: samples_per_epoch must be >= 1 when a convergence model is given (got 0)");
  }
  SECTION("wrong kind") {
    j["kind"] = 5;
    REQUIRE(load_error(j) == "job.json: kind must be \"hybridplan.job\" (got 5)");
  }
}
