#include "planner/searches/sweep.h"

#include <sstream>

#include "common/error.h"
#include "planner/searches/search.h"

namespace hybridplan {
namespace {

// One search at exactly `devices` devices. Returns the best plan, or the reason nothing fits.
std::optional<Plan> best_on(const Problem& problem, SearchOptions options, int64_t devices,
                            std::string* infeasible) {
  options.devices = devices;
  options.top_k = 1;
  try {
    SearchResult result = search(problem, options);
    HP_INTERNAL_ASSERT(!result.plans.empty(), "search returned no plan and no InfeasibleError");
    Plan plan = std::move(result.plans.front());
    HP_INTERNAL_ASSERT(plan.world_size == devices,
                       "search for " << devices << " devices returned world_size " << plan.world_size);
    HP_INTERNAL_ASSERT(!options.dp_only || (plan.dp == devices && plan.mp == 1),
                       "dp_only search returned dp=" << plan.dp << " mp=" << plan.mp);
    return plan;
  } catch (const InfeasibleError& e) {
    *infeasible = e.what();
    return std::nullopt;
  }
}

// The numbers a sweep reports for one plan, in a fixed column order (CSV follows it).
Json summary(const Plan& p) {
  const Prediction& q = p.predicted;
  return Json{{"dp", p.dp},
              {"mp", p.mp},
              {"mode", mode_name(p.mode)},
              {"schedule", schedule_name(p.schedule)},
              {"num_microbatches", p.num_microbatches},
              {"per_replica_batch", p.per_replica_batch},
              {"global_batch", p.global_batch},
              {"step_s", q.step_s},
              {"compute_s", q.compute_s},
              {"allreduce_s", q.allreduce_s},
              {"bubble_s", q.bubble_s},
              {"epochs", q.epochs},
              {"time_to_train_s", q.time_to_train_s},
              {"samples_per_s", q.samples_per_s}};
}

const char* const kSummaryFields[] = {"dp",          "mp",          "mode",     "schedule",
                                      "num_microbatches", "per_replica_batch", "global_batch",
                                      "step_s",      "compute_s",   "allreduce_s", "bubble_s",
                                      "epochs",      "time_to_train_s", "samples_per_s"};

std::string csv_cell(const Json& v) {
  if (v.is_string()) return v.get<std::string>();  // mode/schedule names: no commas or quotes
  std::ostringstream os;
  os.precision(10);
  if (v.is_number_integer()) os << v.get<int64_t>(); else os << v.get<double>();
  return os.str();
}

}  // namespace

std::vector<int64_t> sweep_device_counts(int64_t max_devices) {
  std::vector<int64_t> counts;
  for (int64_t n = 1; n <= max_devices; n *= 2) counts.push_back(n);
  if (!counts.empty() && counts.back() != max_devices) counts.push_back(max_devices);
  return counts;
}

std::vector<SweepPoint> sweep(const Problem& problem, int64_t max_devices,
                              const SearchOptions& base) {
  const int64_t cluster_devices = problem.cluster.num_devices();
  if (max_devices < 1 || max_devices > cluster_devices) {
    throw InputError("--max-devices must be in 1.." + std::to_string(cluster_devices) +
                     " (the devices of cluster '" + problem.cluster.name + "') (got " +
                     std::to_string(max_devices) + ")");
  }
  std::vector<SweepPoint> points;
  for (int64_t n : sweep_device_counts(max_devices)) {
    SweepPoint point;
    point.devices = n;
    SearchOptions dp_options = base;
    dp_options.dp_only = true;
    point.dp_only = best_on(problem, dp_options, n, &point.dp_only_infeasible);
    SearchOptions hybrid_options = base;
    hybrid_options.dp_only = false;
    point.best = best_on(problem, hybrid_options, n, &point.best_infeasible);
    points.push_back(std::move(point));
  }
  return points;
}

Json sweep_to_json(const std::vector<SweepPoint>& points) {
  Json out = Json::array();
  for (const SweepPoint& point : points) {
    Json row{{"devices", point.devices}};
    row["dp_only"] = point.dp_only ? summary(*point.dp_only) : Json(nullptr);
    if (!point.dp_only) row["dp_only_infeasible"] = point.dp_only_infeasible;
    row["best"] = point.best ? summary(*point.best) : Json(nullptr);
    if (!point.best) row["best_infeasible"] = point.best_infeasible;
    out.push_back(std::move(row));
  }
  return out;
}

std::string sweep_to_csv(const std::vector<SweepPoint>& points) {
  std::ostringstream os;
  os << "devices";
  for (const char* which : {"dp_only", "best"}) {
    for (const char* field : kSummaryFields) os << ',' << which << '_' << field;
  }
  os << '\n';
  for (const SweepPoint& point : points) {
    os << point.devices;
    for (const std::optional<Plan>* plan : {&point.dp_only, &point.best}) {
      const Json s = *plan ? summary(**plan) : Json(nullptr);
      for (const char* field : kSummaryFields) os << ',' << (s.is_null() ? "" : csv_cell(s[field]));
    }
    os << '\n';
  }
  return os.str();
}

}  // namespace hybridplan
