// Job loading and validation. The convergence formulas themselves live in convergence.h.
#include "planner/documents/job.h"

#include <algorithm>
#include <cmath>

#include "common/error.h"
#include "common/json_fields.h"
#include "common/json_io.h"
#include "common/limits.h"

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
    const Json& bc = in.required(j, path, "critical_batch");
    if (bc.is_array()) {
      for (size_t i = 0; i < bc.size(); ++i) {
        const std::string p = json_index_path("convergence.critical_batch", i);
        const Json& pair = in.array(bc[i], p);
        if (pair.size() != 2) in.fail(p, "must be a [progress, critical_batch] pair", pair);
        c.critical_batch_trajectory.emplace_back(in.number(pair[0], p + "[0]"), in.number(pair[1], p + "[1]"));
      }
      if (bc.empty()) in.fail("convergence.critical_batch", "must list at least one [progress, critical_batch] pair", bc);
      c.critical_batch = c.critical_batch_trajectory.front().second;
    } else {
      c.critical_batch = in.number(bc, "convergence.critical_batch");
    }
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

BatchCandidates batch_candidates_from_json(const Json& v, const std::string& source,
                                           const std::string& path) {
  const JsonReader in(source);
  const auto positive = [&](const Json& x, const std::string& p) {
    const int64_t b = in.integer(x, p);
    check_batch_size(source, p, b);  // bounded: the doubling below cannot overflow
    return b;
  };
  BatchCandidates out;
  if (v.is_array()) {
    if (v.empty()) in.fail(path, "must list at least one batch size", v);
    for (size_t i = 0; i < v.size(); ++i) out.push_back(positive(v[i], json_index_path(path, i)));
  } else if (v.is_object()) {
    const int64_t lo = positive(in.required(v, path, "min"), json_child_path(path, "min"));
    const int64_t hi = positive(in.required(v, path, "max"), json_child_path(path, "max"));
    if (hi < lo) {
      in.fail(json_child_path(path, "max"), "must be >= min = " + std::to_string(lo), v["max"]);
    }
    out = {lo, hi};
    for (int64_t b = 1; b <= hi; b *= 2)
      if (b > lo && b < hi) out.push_back(b);
  } else if (v.is_number()) {
    out.push_back(positive(v, path));
  } else {
    in.fail(path, "must be a batch size, a list of batch sizes or {\"min\": a, \"max\": b}", v);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

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
  if (samples_per_epoch > kMaxSamples) {
    throw_input_error(source, "samples_per_epoch",
                      "must be at most " + std::to_string(kMaxSamples) + " (2^50 samples)",
                      std::to_string(samples_per_epoch));
  }
  for (const auto& [field, batches] : {std::pair{"per_replica_batch", &per_replica_batches},
                                        {"global_batch", &global_batches}}) {
    for (size_t i = 0; i < batches->size(); ++i) {
      check_batch_size(source, batches->size() == 1 ? field : json_index_path(field, i),
                       (*batches)[i]);
    }
  }
  if (!per_replica_batches.empty() && !global_batches.empty()) {
    throw_input_error(source, "global_batch",
                      "must not be given together with per_replica_batch (give one of them)",
                      std::to_string(global_batches.front()));
  }
  for (size_t i = 0; i < num_microbatches.size(); ++i) {
    check_batch_size(source, json_index_path("num_microbatches", i), num_microbatches[i]);
  }
  for (size_t i = 0; i < accumulation_steps.size(); ++i) {
    check_accumulation_steps(source,
                             accumulation_steps.size() == 1 ? std::string("accumulation_steps")
                                                            : json_index_path("accumulation_steps", i),
                             accumulation_steps[i]);
  }
  switch (convergence.model) {
    case Convergence::Model::kNone:
      return;
    case Convergence::Model::kCriticalBatch: {
      check_positive(source, "convergence.epochs_min", convergence.epochs_min);
      const auto& trajectory = convergence.critical_batch_trajectory;
      if (trajectory.empty()) check_positive(source, "convergence.critical_batch", convergence.critical_batch);
      for (size_t i = 0; i < trajectory.size(); ++i) {
        const std::string p = json_index_path("convergence.critical_batch", i);
        const double progress = trajectory[i].first;
        if (!std::isfinite(progress) || progress < 0 || progress > 1) {
          throw_input_error(source, p + "[0]", "must be a training progress in 0..1", json_number_text(progress));
        }
        if (i > 0 && progress <= trajectory[i - 1].first) {
          throw_input_error(source, p + "[0]",
                            "must be greater than the previous point's progress " +
                                json_number_text(trajectory[i - 1].first) + " (points increasing)",
                            json_number_text(progress));
        }
        check_positive(source, p + "[1]", trajectory[i].second);
      }
      break;
    }
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
  if (const Json* b = in.optional(j, "per_replica_batch")) {
    job.per_replica_batches = batch_candidates_from_json(*b, source, "per_replica_batch");
  }
  if (const Json* b = in.optional(j, "global_batch")) {
    job.global_batches = batch_candidates_from_json(*b, source, "global_batch");
  }
  if (const Json* k = in.optional(j, "accumulation_steps")) {
    // the batches' syntax; each checked against kMaxAccumulationSteps by validate below
    if (k->is_number_integer() && k->get<int64_t>() > kMaxAccumulationSteps) {
      check_accumulation_steps(source, "accumulation_steps", k->get<int64_t>());
    }
    job.accumulation_steps = batch_candidates_from_json(*k, source, "accumulation_steps");
  }
  if (const Json* o = in.optional(j, "optimizer")) job.optimizer = optimizer_from_name(in, *o);
  if (const Json* m = in.optional(j, "precision")) {
    const std::optional<Precision> p = precision_from_name(in.string(*m, "precision"));
    if (!p) in.fail("precision", precision_rule(), *m);
    job.precision = *p;
  }
  if (const Json* m = in.optional(j, "mixed_precision")) {  // the older form: true = bf16
    const Precision legacy = in.boolean(*m, "mixed_precision") ? Precision::kBf16 : Precision::kFp32;
    if (in.optional(j, "precision") && legacy != job.precision) {
      in.fail("mixed_precision",
              std::string("must agree with \"precision\": \"") + precision_name(job.precision) +
                  "\" (true is \"bf16\", false \"fp32\"; give precision alone)",
              *m);
    }
    job.precision = legacy;
  }
  if (const Json* c = in.optional(j, "compile")) job.compile = in.boolean(*c, "compile");
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
  if (job.mixed_precision()) j["precision"] = precision_name(job.precision);  // absent: fp32
  for (const auto& [key, batches] : {std::pair{"per_replica_batch", &job.per_replica_batches},
                                      {"global_batch", &job.global_batches}}) {
    if (batches->size() == 1) j[key] = batches->front();
    if (batches->size() > 1) j[key] = *batches;
  }
  if (!job.num_microbatches.empty()) j["num_microbatches"] = job.num_microbatches;
  if (job.compile) j["compile"] = true;  // absent: false
  if (job.accumulation_steps.size() == 1) j["accumulation_steps"] = job.accumulation_steps.front();
  if (job.accumulation_steps.size() > 1) j["accumulation_steps"] = job.accumulation_steps;
  const Convergence& c = job.convergence;
  if (c.model == Convergence::Model::kCriticalBatch) {
    Json bc = c.critical_batch;
    if (!c.critical_batch_trajectory.empty()) {
      bc = Json::array();
      for (const auto& [progress, batch] : c.critical_batch_trajectory) bc.push_back({progress, batch});
    }
    j["convergence"] = {{"model", "critical_batch"}, {"epochs_min", c.epochs_min},
                        {"critical_batch", std::move(bc)}};
  } else if (c.model == Convergence::Model::kTable) {
    Json points = Json::array();
    for (const auto& [batch, epochs] : c.points) points.push_back({batch, epochs});
    j["convergence"] = {{"model", "table"}, {"points", std::move(points)}};
  }
  return j;
}

BatchCandidates Job::accumulation_candidates() const {
  if (!accumulation_steps.empty()) return accumulation_steps;
  if (global_batches.empty()) return {1};
  BatchCandidates out;
  for (int64_t k = 1; k <= kDefaultMaxAccumulationSteps; k *= 2) out.push_back(k);
  return out;
}

Job load_job(const std::string& path) { return job_from_json(read_json_file(path, "job"), path); }

Job default_job() { return Job{}; }

}  // namespace hybridplan
