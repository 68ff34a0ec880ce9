// Job: what is trained and how it converges (kind "hybridplan.job").
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/documents/precision.h"

namespace hybridplan {

using Json = nlohmann::json;

enum class Optimizer { kSgd, kSgdMomentum, kAdam };  // state: 0x, 1x, 2x parameter bytes

struct Convergence {
  enum class Model { kNone, kCriticalBatch, kTable };
  Model model = Model::kNone;
  double epochs_min = 0;      // critical_batch: epochs(B) = epochs_min * (1 + B / critical_batch)
  double critical_batch = 0;
  // critical_batch given as a trajectory [[progress, B_crit], ...] (progress in [0, 1] of the
  // run, increasing; convergence.h): the critical batch grows as training proceeds. Empty: the
  // constant critical_batch above.
  std::vector<std::pair<double, double>> critical_batch_trajectory;
  std::vector<std::pair<double, double>> points;  // table: (global batch, epochs), B ascending
};

// The batch sizes a job allows. JSON: an integer (that batch), a list of integers, or a range
// {"min": a, "max": b} meaning a, b and every power of two between them. Sorted, unique.
using BatchCandidates = std::vector<int64_t>;

struct Job {
  int64_t samples_per_epoch = 0;   // required when a convergence model is given
  // At most one of the two is non-empty. per_replica_batches: samples per replica per step the
  // search may choose; global_batches: global batches it may choose (per-replica = global / dp
  // where dp divides it). Both empty: the graph's profiled batch size per replica.
  BatchCandidates per_replica_batches;
  BatchCandidates global_batches;
  // Gradient accumulation steps the search may give a plan (JSON "accumulation_steps": an
  // integer, a list or a {min, max} range, as the batches; Plan::accumulation_steps). Each
  // micro-step runs the per-replica batch; a step's global batch is dp * per-replica batch *
  // steps. Each listed candidate is searched (with global_batches: the same global batch in
  // that many micro-steps; else a global batch of its own). Empty: 1, and with global_batches
  // the search tries 2, 4, ..., kDefaultMaxAccumulationSteps in turn where no plan of a point
  // fits in memory (search.h search_space).
  BatchCandidates accumulation_steps;
  static constexpr int64_t kDefaultMaxAccumulationSteps = 64;
  // The candidates the search walks (accumulation_steps, or its default above).
  BatchCandidates accumulation_candidates() const;
  Optimizer optimizer = Optimizer::kSgd;
  // The precision it trains in (JSON "precision": "fp32" | "bf16" | "fp16", absent = "fp32";
  // precision.h). The older boolean "mixed_precision" is read as "bf16" (true) or "fp32"; the
  // two disagreeing is an error. A 16-bit precision keeps an fp32 master copy of the parameters
  // and the optimizer state in fp32 (memory_cost.h OptimizerState) and reduces gradients in
  // fp32; on a graph profiled in float32 the search prices compute at the device's rate for the
  // dtype (Cluster device.compute_speedup) and activations, messages and tensor-parallel
  // collectives at its bytes (costs/precision_cost.h). The search copies it into each Plan.
  Precision precision = Precision::kFp32;
  bool mixed_precision() const { return precision != Precision::kFp32; }
  // torch.compile per graph block (JSON "compile", absent = false; docs/training_step.md):
  // the search prices each node at its measured speed-up (Node compile_forward_speedup /
  // compile_backward_speedup; eager where not measured) and marks its plans "compile".
  bool compile = false;
  Convergence convergence;
  std::vector<int64_t> num_microbatches;  // candidates for pipelines; empty: 1,2,4,... dividing
                                          // the batch, and the batch itself (search.cc)

  void validate(const std::string& source) const;
};

// The candidates of a JSON batch field at `path` (see BatchCandidates).
BatchCandidates batch_candidates_from_json(const Json& v, const std::string& source,
                                           const std::string& path);

Job job_from_json(const Json& j, const std::string& source);
Json job_to_json(const Job& job);
Job load_job(const std::string& path);
Job default_job();  // no convergence model: objective is samples/s at the profiled batch

const char* optimizer_name(Optimizer o);

}  // namespace hybridplan
