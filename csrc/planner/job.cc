// Job loading and validation. The convergence formulas themselves live in convergence.h.
#include "planner/job.h"

#include <cmath>

#include "common/error.h"
#include "common/json_fields.h"
#include "common/json_io.h"

namespace hybridplan {
namespace {

constexpr const char* kJobKind = "hybridplan.job";

void check_positive(const std::string& source, const std::string& path, double v) {
  if (!std::isfinite(v) || v <= 0) throw_input_error(source, path, "must be finite and > 0", json_number_text(v));
}

Optimizer optimizer_from_name(const JsonReader& in, const Json& v) {
  const std::string name = in.string(v, "optimizer");
  if (name == "sgd") return Optimizer::kSgd;
  if (name == "sgd_momentum") return Optimizer::kSgdMomentum;
  if (name == "adam") return Optimizer::kAdam;
  in.fail("optimizer", "must be one of \"sgd\", \"sgd_momentum\", \"adam\"", v);
}

Convergence convergence_from_json(const JsonReader& in, const Json& j) {
  const std::string path = "convergence";
  in.object(j, path);
  Convergence c;
  const Json& model = in.required(j, path, "model");
  const std::string name = in.string(model, "convergence.model");
  if (name == "critical_batch") {
    c.model = Convergence::Model::kCriticalBatch;
    c.epochs_min = in.field_number(j, path, "epochs_min");
    c.critical_batch = in.field_number(j, path, "critical_batch");
  } else if (name == "table") {
    c.model = Convergence::Model::kTable;
    const Json& points = in.array(in.required(j, path, "points"), "convergence.points");
    for (size_t i = 0; i < points.size(); ++i) {
      const std::string p = json_index_path("convergence.points", i);
      const Json& pair = in.array(points[i], p);
      if (pair.size() != 2) in.fail(p, "must be a [global_batch, epochs] pair", pair);
      c.points.emplace_back(in.number(pair[0], p + "[0]"), in.number(pair[1], p + "[1]"));
    }
  } else {
    in.fail("convergence.model", "must be \"critical_batch\" or \"table\"", model);
  }
  return c;
}

}  // namespace

const char* optimizer_name(Optimizer o) {
  switch (o) {
    case Optimizer::kSgd: return "sgd";
    case Optimizer::kSgdMomentum: return "sgd_momentum";
    case Optimizer::kAdam: return "adam";
  }
  return "sgd";
}

void Job::validate(const std::string& source) const {
  if (samples_per_epoch < 0) {
    throw_input_error(source, "samples_per_epoch", "must be >= 1", std::to_string(samples_per_epoch));
  }
  if (per_replica_batch < 0) {
    throw_input_error(source, "per_replica_batch", "must be >= 1", std::to_string(per_replica_batch));
  }
  if (global_batch < 0) {
    throw_input_error(source, "global_batch", "must be >= 1", std::to_string(global_batch));
  }
  if (per_replica_batch > 0 && global_batch > 0) {
    throw_input_error(source, "global_batch",
                      "must not be given together with per_replica_batch (give one of them)",
                      std::to_string(global_batch));
  }
  for (size_t i = 0; i < num_microbatches.size(); ++i) {
    if (num_microbatches[i] < 1) {
      throw_input_error(source, json_index_path("num_microbatches", i), "must be >= 1",
                        std::to_string(num_microbatches[i]));
    }
  }
  switch (convergence.model) {
    case Convergence::Model::kNone:
      return;
    case Convergence::Model::kCriticalBatch:
      check_positive(source, "convergence.epochs_min", convergence.epochs_min);
      check_positive(source, "convergence.critical_batch", convergence.critical_batch);
      break;
    case Convergence::Model::kTable: {
      const auto& points = convergence.points;
      if (points.empty()) {
        throw_input_error(source, "convergence.points", "must list at least one [global_batch, epochs] pair", "[]");
      }
      for (size_t i = 0; i < points.size(); ++i) {
        const std::string p = json_index_path("convergence.points", i);
        check_positive(source, p + "[0]", points[i].first);
        check_positive(source, p + "[1]", points[i].second);
        if (i > 0 && points[i].first <= points[i - 1].first) {
          throw_input_error(source, p + "[0]",
                            "must be greater than the previous point's global batch " +
                                json_number_text(points[i - 1].first) + " (points increasing in B)",
                            json_number_text(points[i].first));
        }
      }
      break;
    }
  }
  if (samples_per_epoch < 1) {
    throw_input_error(source, "samples_per_epoch",
                      "must be >= 1 when a convergence model is given",
                      std::to_string(samples_per_epoch));
  }
}

Job job_from_json(const Json& j, const std::string& source) {
  const JsonReader in(source);
  in.header(j, kJobKind);
  Job job;
  const auto positive_int = [&](const char* key, int64_t& out) {
    if (const Json* v = in.optional(j, key)) {
      out = in.integer(*v, key);
      if (out < 1) in.fail(key, "must be >= 1", *v);
    }
  };
  positive_int("samples_per_epoch", job.samples_per_epoch);
  positive_int("per_replica_batch", job.per_replica_batch);
  positive_int("global_batch", job.global_batch);
  if (const Json* o = in.optional(j, "optimizer")) job.optimizer = optimizer_from_name(in, *o);
  if (const Json* c = in.optional(j, "convergence")) job.convergence = convergence_from_json(in, *c);
  if (const Json* m = in.optional(j, "num_microbatches")) {
    in.array(*m, "num_microbatches");
    for (size_t i = 0; i < m->size(); ++i) {
      job.num_microbatches.push_back(in.integer((*m)[i], json_index_path("num_microbatches", i)));
    }
  }
  job.validate(source);
  return job;
}

Json job_to_json(const Job& job) {
  Json j = {{"schema_version", 1}, {"kind", kJobKind}, {"optimizer", optimizer_name(job.optimizer)}};
  if (job.samples_per_epoch > 0) j["samples_per_epoch"] = job.samples_per_epoch;
  if (job.per_replica_batch > 0) j["per_replica_batch"] = job.per_replica_batch;
  if (job.global_batch > 0) j["global_batch"] = job.global_batch;
  if (!job.num_microbatches.empty()) j["num_microbatches"] = job.num_microbatches;
  const Convergence& c = job.convergence;
  if (c.model == Convergence::Model::kCriticalBatch) {
    j["convergence"] = {{"model", "critical_batch"}, {"epochs_min", c.epochs_min},
                        {"critical_batch", c.critical_batch}};
  } else if (c.model == Convergence::Model::kTable) {
    Json points = Json::array();
    for (const auto& [batch, epochs] : c.points) points.push_back({batch, epochs});
    j["convergence"] = {{"model", "table"}, {"points", std::move(points)}};
  }
  return j;
}

Job load_job(const std::string& path) { return job_from_json(read_json_file(path), path); }

Job default_job() { return Job{}; }

}  // namespace hybridplan
