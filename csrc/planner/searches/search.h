// search(problem, options): the top-K plans over dp x mp, both MP modes, micro-batch counts and
// device mappings, each with its evaluate() breakdown. A pipeline point's split chooses each
// stage's recompute with it (pipeline_search.h). A point that still does not fit in memory is
// tried again with recompute on the devices or stages over memory (search.cc recompute_to_fit),
// after the data-parallel sharding kinds (SearchOptions::shardings) were tried on it.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/costs/evaluate.h"
#include "planner/documents/plan.h"
#include "planner/documents/problem.h"

namespace hybridplan {

// Whether the search gives its tensor-parallel points sequence parallelism (Plan::
// sequence_parallel): kAuto tries each point with tp > 1 whose degree allows it
// (tensor_parallel_cost.h sequence_parallel_refusal) both without and with; kOff never; kOn
// only with it, leaving out the points with tp > 1 whose degree does not allow it (points with
// tp = 1 stay: SearchOptions::tensor_degrees decides those).
enum class SequenceParallelSearch { kAuto, kOff, kOn };
const char* sequence_parallel_search_name(SequenceParallelSearch s);  // "auto" | "off" | "on"
std::optional<SequenceParallelSearch> sequence_parallel_search_from_name(const std::string& name);

struct SearchOptions {
  int64_t devices = 0;  // 0: the whole cluster
  int top_k = 5;
  bool placement = true;
  bool pipeline = true;
  int exact_placement_max_nodes = 10;  // above this, heuristic placement with a reported gap
  bool dp_only = false;                // only mp = 1 (the pure-DP baseline)
  // The data-parallel sharding kinds the search may give a plan with dp >= 2 (plan.h Sharding;
  // a point takes those its mode allows: placement mp = 1 all, pipeline none and zero2). Each
  // point's assignment is searched unsharded, then every allowed kind is evaluated on it and
  // the best kept (a plan that fits beats one that does not).
  std::vector<Sharding> shardings = {Sharding::kNone, Sharding::kZero2, Sharding::kZero3};
  // The pipeline schedules the search may give a pipeline point (plan.h Schedule). The
  // multi-stage ones are tried with 2 stages per rank (torch's ZB-V needs exactly 2; more
  // interleaved stages cut the bubble further for more transfers and are left to a
  // hand-written plan).
  std::vector<Schedule> schedules = {Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved1F1B,
                                     Schedule::kInterleavedZB, Schedule::kZBV};
  // The tensor-parallel degrees (Plan::tp) the search may choose; empty: 1 and every degree the
  // graph and cluster allow (tensor_parallel_cost.h tp_degrees). A listed degree other than 1
  // must be one of those (InputError otherwise). {1}: no tensor parallelism; {4}: only tp = 4.
  std::vector<int64_t> tensor_degrees;
  // Sequence parallelism on the points with tp > 1 (above). kOn with no degree > 1 of the space
  // allowing it: InputError.
  SequenceParallelSearch sequence_parallel = SequenceParallelSearch::kAuto;
  // Every point searched: none left out by its lower bound, and a point of more accumulation
  // steps that several chains reach searched again on each arrival instead of once (search.cc).
  // The same plans, by many more evaluations: the reference the pruned search is tested
  // against.
  bool exhaustive = false;
};

struct SearchResult {
  std::vector<Plan> plans;              // best first, plans[i].predicted filled
  int64_t candidates_evaluated = 0;
  std::vector<std::string> notes;       // e.g. "placement mp=4: heuristic, gap to lower bound 3.1%"
  std::vector<std::string> infeasible;  // why rejected candidates did not fit (for exit 3)
};

// One point of the search space: everything about a plan except the device mapping and the
// node -> device/stage assignment, which search() optimises for each point.
struct SearchSpacePoint {
  int64_t dp = 1;
  int64_t mp = 1;
  int64_t tp = 1;
  bool sequence_parallel = false;  // only with tp > 1
  MpMode mode = MpMode::kPlacement;
  Schedule schedule = Schedule::kNone;
  int64_t virtual_stages = 1;
  int64_t num_microbatches = 1;
  int64_t per_replica_batch = 1;  // a micro-step's, per replica
  int64_t accumulation_steps = 1;  // micro-steps per step (Plan::accumulation_steps)
};

// The accumulation step counts after `after` (0: from the first) that the job allows for a
// replica's `replica_samples` per step (Job::accumulation_candidates): the smallest candidate
// K > after dividing replica_samples with replica_samples / K >= the graph's
// profiled.min_batch_size; 0 when none.
int64_t next_accumulation_steps(const Problem& problem, int64_t replica_samples, int64_t after);

// The point search() tries after `point` where nothing fits (search_space's comment): with a
// job's global_batch and no accumulation_steps listed, the same global batch in the next
// accumulation step count
// (next_accumulation_steps), a pipeline's micro-batch count kept or else its micro-batch size
// kept (torch's schedule rules holding); nullopt when the job has no global_batch or nothing
// is left to try.
std::optional<SearchSpacePoint> next_accumulation_point(const Problem& problem,
                                                        const SearchSpacePoint& point);

// The points search() considers, in its order: for every tensor-parallel degree tp
// (options.tensor_degrees; 1 first, so ties go to plans without tensor parallelism; only 1 with
// dp_only), for every mp with mp * tp dividing the device count N and dividing
// devices_per_node or, for pipelines only, a multiple of it (a pipeline spanning
// mp * tp / devices_per_node whole nodes; at most 64 ranks, the graph's nodes and its places
// to cut plus one: search.cc kMaxSpanningStages) (dp = N / (mp * tp); only mp = 1 with dp_only;
// placement with tp > 1 only at mp = 1), for every per-replica batch the job
// allows (problem.h per_replica_batches_for: the search chooses the batch, hence the global
// batch): mp = 1 as one placement point (pure DP); for mp >= 2 placement (options.placement;
// not on "cpu" devices, where a replica's devices run one after another in one process) and
// pipeline (options.pipeline; when the graph can be split, has at least mp nodes and mp - 1
// places where a stage may begin) with each of options.schedules for every micro-batch count M
// (job.num_microbatches, else 1, 2, 4, ...) with M dividing the batch, 1F1B only for M >= mp
// (torch.distributed.pipelining's Schedule1F1B requires it), the multi-stage schedules with 2
// stages per rank where the graph has 2 mp nodes and 2 mp - 1 places where a stage may begin,
// and M a multiple of torch's rounds max(1, M / mp) for the interleaved ones. Each point with
// tp > 1 comes without and then with sequence parallelism where options.sequence_parallel and
// the graph allow (SequenceParallelSearch), so ties go to the plan without.
// Gradient accumulation (Job::accumulation_steps): with the job's per_replica_batch (or none),
// every accumulation candidate K is a point of its own (global batch dp * b * K); with its
// global_batch and listed accumulation_steps, every listed K dividing the replica's samples is
// a point of its own (b = global / (dp K)); with its global_batch alone, a point takes K = 1
// and search() tries the next K (2, 4, ..., 64: b halved for K doubled; a pipeline's
// micro-batch count M kept, or where b no longer splits into M its micro-batch size kept)
// only where no plan of the point fits in memory, sharded or recomputing: for one global
// batch, more micro-steps only add compute (each at a smaller batch, a pipeline's fill and
// drain each time) unless memory needs them. (Whether more micro-steps beat recomputing is
// searched where the job lists the steps.)
// Why a dp/mp/M was left out goes to `skipped` (may be null). Throws InputError on bad options.
std::vector<SearchSpacePoint> search_space(const Problem& problem, const SearchOptions& options,
                                           std::vector<std::string>* skipped);

// The plan skeleton of a point: names, hash, world size, batch, schedule and mesh (from
// device_mapping.h) filled; assignment all zeros; predicted empty.
Plan plan_skeleton(const Problem& problem, const SearchSpacePoint& point,
                   const std::string& graph_sha256);

// The shard group sizes (Plan::dp_shard) the search gives a sharded plan: 0 (the whole
// data-parallel group) and, across nodes, one node's replicas (HSDP: shard within a node over
// its fast links, all-reduce the shards across nodes) when that is >= 2 and divides dp.
std::vector<int64_t> shard_degrees(const Plan& plan, const Cluster& cluster);

// A lower bound on evaluate(plan).step_s for every assignment of the plan's point (mesh,
// batch, micro-batches and schedule fixed): the compute at least the placement bound (critical
// path, work per device), or for a pipeline the stage work M * (F + B) spread perfectly over
// the ranks with every action's runtime cost, or more: the fill and drain no split avoids
// (search.cc); that times the plan's accumulation steps, plus the fixed step overhead
// (all-reduce and optimizer >= 0).
// search() leaves out a point whose bound exceeds the top k found.
double step_lower_bound_s(const Evaluator& evaluator, const Plan& plan);

// Throws InfeasibleError (naming what does not fit and by how much) when no candidate fits.
SearchResult search(const Problem& problem, const SearchOptions& options);

}  // namespace hybridplan
