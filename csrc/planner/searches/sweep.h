// sweep: the paper's scaling study (Pal et al., IEEE Micro 2019, https://arxiv.org/abs/1907.13257,
// Figs. 7-9). For N = 1, 2, 4, ... devices it compares the best plan that data parallelism alone
// reaches (dp = N, mp = 1) with the best hybrid DP x MP plan on the same N devices, so the
// end-to-end speedup of each over one device can be plotted against N.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/documents/plan.h"
#include "planner/documents/problem.h"
#include "planner/searches/search.h"

namespace hybridplan {

using Json = nlohmann::json;

struct SweepPoint {
  int64_t devices = 0;
  std::optional<Plan> dp_only;   // empty: no pure-DP plan fits on `devices` devices
  std::optional<Plan> best;      // empty: nothing fits
  std::string dp_only_infeasible;  // why, when dp_only is empty
  std::string best_infeasible;
};

// 1, 2, 4, ... (powers of two) up to max_devices, plus max_devices itself when it is not one.
std::vector<int64_t> sweep_device_counts(int64_t max_devices);

// Searches every device count (SearchOptions::devices = N, top_k = 1; `base` supplies the MP
// modes and placement limits). Throws InputError when max_devices < 1 or exceeds the cluster.
std::vector<SweepPoint> sweep(const Problem& problem, int64_t max_devices,
                              const SearchOptions& base = {});

// [{"devices": N, "dp_only": S | null, "best": S | null}, ...] where S = {"dp", "mp", "mode",
// "schedule", "num_microbatches", "per_replica_batch", "global_batch", "step_s", "compute_s",
// "allreduce_s", "bubble_s", "epochs", "time_to_train_s", "samples_per_s"}; a null S comes with
// "<which>_infeasible": reason.
Json sweep_to_json(const std::vector<SweepPoint>& points);

// One row per device count; columns devices, then dp_only_<field> and best_<field> for the
// fields of S above (empty cells where no plan fits).
std::string sweep_to_csv(const std::vector<SweepPoint>& points);

}  // namespace hybridplan
