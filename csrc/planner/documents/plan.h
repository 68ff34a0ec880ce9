// Plan: one complete decision (kind "hybridplan.plan"), the only contract between planner and
// executor. See docs/formats.md "Plan" for the JSON.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/documents/cluster.h"
#include "planner/documents/graph.h"
#include "planner/documents/precision.h"

namespace hybridplan {

using Json = nlohmann::json;

enum class MpMode { kPlacement, kPipeline };
// Pipeline schedules (pipeline_schedule.h). kNone for placement plans. gpipe and 1f1b run one
// stage per rank; the others several ("virtual stages", torch.distributed.pipelining's
// PipelineScheduleMulti): interleaved-1f1b (Megatron-LM's interleaved schedule,
// https://arxiv.org/abs/2104.04473) and interleaved-zb (ZB-1P, https://arxiv.org/abs/2401.10241)
// place stage s on rank s % mp ("loop"); zbv (the ZB-V schedule, same paper) places two stages
// per rank in a V (stage s on rank s for s < mp, else 2mp-1-s). The zero-bubble ones split a
// stage's backward into the input gradient (I) and the weight gradient (W).
enum class Schedule { kNone, kGpipe, k1F1B, kInterleaved1F1B, kInterleavedZB, kZBV };
// Sharded data parallelism over each data-parallel group (docs/sharding.md): kNone replicates
// (DDP); kZero2 shards gradients and optimizer state and gathers the parameters once per step
// (FSDP2 fully_shard with reshard_after_forward=False); kZero3 also frees the gathered
// parameters after each unit's forward and gathers them again for its backward
// (reshard_after_forward=True).
enum class Sharding { kNone, kZero2, kZero3 };

// Plan::recompute's values.
constexpr uint8_t kRecomputeNone = 0, kRecomputeFull = 1, kRecomputeSelective = 2;

struct Prediction {
  // compute_s + exposed allreduce_s + sharding_s + optimizer_s + overhead_s (transfer and bubble are inside
  // compute)
  double step_s = 0;
  double compute_s = 0;    // the replica's schedule: makespan (placement) or pipeline length
  double allreduce_s = 0;  // exposed (not overlapped with backward) gradient all-reduce
  double sharding_s = 0;   // exposed all-gathers and reduce-scatters of a sharded plan
  double optimizer_s = 0;  // the optimizer step of the fullest device (optimizer_cost.h)
  double overhead_s = 0;   // the runtime's fixed cost per step (Runtime::step_overhead_s)
  double transfer_s = 0;   // time spent on cross-device activation/gradient transfers (informative)
  double bubble_s = 0;     // pipeline idle time on the critical stage (informative)
  // Tensor parallelism's collectives on the critical path, inside compute_s (informative;
  // evaluate.h "tensor parallel"): placement, the replica's; pipeline, the busiest stage's
  // over its micro-batches. 0 with tp = 1 (JSON: absent).
  double tp_comm_s = 0;
  std::vector<int64_t> memory_bytes;  // per local device (placement) or stage (pipeline)
  double epochs = 0;                  // 0 without a convergence model
  double time_to_train_s = 0;         // 0 without a convergence model
  double samples_per_s = 0;           // global_batch / step_s
  // How node times were taken at the plan's batch (compute_cost.h), and the compute multiplier
  // for processes sharing a node (Cluster runtime.shared_host_slowdown), as evaluated.
  std::string compute_model;
  double compute_slowdown = 1;
  // How the activations kept for the backward were priced in a 16-bit job on a float32 graph
  // (precision_cost.h memory_model): as profiled under autocast, or halved (an estimate where
  // the graph has no autocast recording). Empty otherwise (JSON: absent).
  std::string memory_model;
  // Per data-parallel group (local device or stage k): its members in the order the
  // collective library runs the ring (allreduce_cost.h); empty when dp == 1.
  std::vector<std::vector<DeviceIndex>> allreduce_rings;
  bool feasible = true;
  std::string infeasible_reason;      // e.g. "device 1 needs 18.2 GB > 16.0 GB"
};

// The largest of a prediction's per-device (or per-stage) memory_bytes; 0 when none.
int64_t peak_memory_bytes(const Prediction& p);

struct Plan {
  std::string graph_name;
  std::string graph_sha256;
  std::string cluster_name;
  int64_t world_size = 1;  // devices = dp * mp * tp
  int64_t dp = 1;
  int64_t mp = 1;
  // Tensor-parallel degree (JSON "tp", absent = 1; docs/tensor_parallel.md): each of the mp
  // local devices (placement) or pipeline ranks is a group of tp consecutive devices of one
  // node, mesh[r][k] its first (a multiple of tp), splitting the nodes with tensor_parallel.
  int64_t tp = 1;
  // Sequence parallelism (JSON "sequence_parallel", absent = false, written only when true;
  // docs/tensor_parallel.md "Sequence parallelism"): the TP group also splits the tokens of the
  // nodes between its regions (graph.h SequenceParallel). Needs tp > 1 and a graph whose nodes
  // allow it at tp (tensor_parallel_cost.h sequence_parallel_refusal).
  bool sequence_parallel = false;
  MpMode mode = MpMode::kPlacement;
  // Samples one replica's forward and backward take at once: a micro-step's (the whole step's
  // when accumulation_steps = 1).
  int64_t per_replica_batch = 1;
  // Gradient accumulation (JSON "accumulation_steps", absent = 1; docs/training_step.md): a
  // step runs accumulation_steps forward and backward passes of per_replica_batch samples per
  // replica, synchronises the gradients once, after the last, then steps the optimizer.
  int64_t accumulation_steps = 1;
  // Samples per optimizer step: dp * per_replica_batch * accumulation_steps.
  int64_t global_batch = 1;
  // JSON "compile" (absent = false, written only when true): the job's compile, which the
  // search copies here and evaluate() prices (each node at its measured compile speed-up); the
  // Python executor then compiles each graph block with torch.compile.
  bool compile = false;
  int64_t num_microbatches = 1;
  Schedule schedule = Schedule::kNone;
  // Pipeline stages per rank (JSON "virtual_stages", absent = 1): 1 for gpipe and 1f1b, >= 2
  // for interleaved-1f1b and interleaved-zb, 2 for zbv. A pipeline has num_stages() =
  // mp * virtual_stages stages; stage s runs on local rank stage_rank(s).
  int64_t virtual_stages = 1;
  // mesh[replica][local] = global device index (with tp > 1, the first device of the TP group).
  // Process ranks, TP rank t innermost: placement -> rank = replica * tp + t (one process owns
  // the replica's mp devices; tp > 1 needs mp = 1); pipeline -> rank = (replica * mp + stage) *
  // tp + t. With tp = 1: replica, replica * mp + stage.
  std::vector<std::vector<DeviceIndex>> mesh;
  // assignment[node index] = local device (placement, 0..mp-1) or stage (pipeline,
  // 0..num_stages()-1).
  std::vector<int32_t> assignment;
  // recompute[node index] = kRecomputeFull: the node keeps only its inputs in forward and runs
  // its forward again in backward (activation checkpointing, memory_cost.h and evaluate.h);
  // kRecomputeSelective: it also keeps the outputs of its costly ops and runs only the others
  // again (the node's measured Node::selective_*; docs/recompute.md). Empty = none. JSON:
  // "recompute": true or "full", or "selective", on the node's assignment entry (absent =
  // false). A pipeline recomputes whole stages alike (the executor checkpoints a stage's
  // forward), and the calls of one module ("name", "name@1", ...) recompute together (one
  // module, one wrapper).
  std::vector<uint8_t> recompute;
  // JSON "sharding" (absent = "none"). Needs dp >= 2; a placement plan shards only with mp = 1
  // (FSDP shards a module held on one device per rank); a pipeline only "zero2" (pipelining
  // keeps a stage's parameters gathered across its micro-batches, as torch's schedules do).
  Sharding sharding = Sharding::kNone;
  // JSON "dp_shard" (absent = dp): a sharded plan's shard group size. dp_shard = dp shards over
  // the whole data-parallel group (FSDP); 2 <= dp_shard < dp, dividing dp, is FSDP2's hybrid
  // sharding (HSDP, torchtitan's dp_shard x dp_replicate): replicas r with the same r / dp_shard
  // shard among themselves, and the dp / dp_shard shard groups all-reduce their gradient shards
  // (replicas with the same r % dp_shard). 0 = dp. Only with sharding != none.
  int64_t dp_shard = 0;
  int64_t shard_degree() const { return dp_shard > 0 ? dp_shard : dp; }
  int64_t dp_replicate() const { return dp / shard_degree(); }
  bool recomputes(size_t node) const { return !recompute.empty() && recompute[node] != 0; }
  bool recomputes_selectively(size_t node) const {
    return !recompute.empty() && recompute[node] == kRecomputeSelective;
  }
  // JSON "precision" (absent = "fp32", written only otherwise; precision.h): the Job's
  // precision, which the search copies here and evaluate() prices; the executor applies it.
  Precision precision = Precision::kFp32;
  std::string device_mapping_note;  // e.g. "NVLink quad {0,1,2,3} of each DGX-1 node"
  Prediction predicted;             // filled by search/evaluate

  // The cluster shape recorded in the plan JSON ("cluster": {...}); 0 = not recorded (a plan
  // built in code); plan_to_json writes the shape of the cluster passed to it.
  int64_t cluster_num_nodes = 0;
  int64_t cluster_devices_per_node = 0;
  // Filled by plan_from_json: the node id and name of each assignment entry, in file order.
  // Empty for plans built in code (assignment is then in graph node order by construction).
  std::vector<NodeId> assignment_node_ids;
  std::vector<std::string> assignment_names;

  // Processes the executor runs: placement -> dp * tp (one per replica and TP rank), pipeline
  // -> dp * mp * tp.
  int64_t num_processes() const { return (mode == MpMode::kPipeline ? dp * mp : dp) * tp; }
  // Values an assignment entry takes: mp local devices (placement), mp * virtual_stages stages.
  int64_t num_stages() const { return mode == MpMode::kPipeline ? mp * virtual_stages : mp; }
  // The local device (0..mp-1) that runs assignment value a: a itself for placement; for a
  // pipeline the rank of stage a (stage_rank in pipeline_schedule.h).
  int64_t device_of(int32_t a) const;
  // Checks that need neither graph nor cluster (dp * mp * tp = world_size, mesh shape, enums,
  // batch arithmetic, assignment range, tp's combinations); plan_from_json and validate both
  // run it.
  void validate_structure(const std::string& source) const;

  // Checks that the plan fits a graph and cluster, whatever they are named: world size and mesh
  // within the cluster, one assignment entry per node in graph order, pipeline stages never
  // decreasing along an edge and none empty; with tp > 1, tp dividing devices_per_node and at
  // least one node splitting at tp (tensor_parallel_cost.h tp_split_mask: tp divides its
  // max_degree; the others run whole); with sequence_parallel, the graph's nodes allowing it
  // at tp (tensor_parallel_cost.h sequence_parallel_refusal). Evaluator::evaluate runs
  // validate_structure and this
  // (a searched plan is not hashed per candidate).
  void validate_fit(const std::string& source, const Graph& graph, const Cluster& cluster) const;

  // The one plan validation, at every boundary (load, CLI, Python, executor): validate_structure,
  // then the plan's identity (graph sha256, cluster name and shape), then validate_fit. Throws
  // InputError "<source>: <json.path> <rule> (got <value>)".
  void validate(const std::string& source, const Graph& graph, const Cluster& cluster) const;
};

// "layer@2" -> "layer": the module whose call a per-call graph node is (the profiler's
// block_list.module_name); other names are their own module.
std::string module_of_call(const std::string& name);

Plan plan_from_json(const Json& j, const std::string& source);  // structural checks only
Json plan_to_json(const Plan& p, const Graph& graph);           // includes node names
// As above, also recording the cluster's shape under "cluster" (what the executor checks).
Json plan_to_json(const Plan& p, const Graph& graph, const Cluster& cluster);
Plan load_plan(const std::string& path);
// load_plan + reorder a hand-written assignment (any node order) into graph order by node id
// + validate(path, graph, cluster): what the CLI and the executor should call.
Plan load_plan(const std::string& path, const Graph& graph, const Cluster& cluster);
void save_plan(const Plan& p, const Graph& graph, const std::string& path);  // atomic
void save_plan(const Plan& p, const Graph& graph, const Cluster& cluster, const std::string& path);

// Puts a loaded plan's assignment into graph node order using assignment_node_ids; rejects
// unknown, duplicate and missing nodes.
void align_assignment_to_graph(Plan& plan, const Graph& graph, const std::string& source);
Json prediction_to_json(const Prediction& p);

const char* mode_name(MpMode m);       // "placement" | "pipeline"
// "none" | "gpipe" | "1f1b" | "interleaved-1f1b" | "interleaved-zb" | "zbv"
const char* schedule_name(Schedule s);
// The inverse of schedule_name; nullopt for any other name.
std::optional<Schedule> schedule_from_name(const std::string& name);
// The stage's local rank under the schedule: s % mp ("loop"), or the V of zbv.
int64_t stage_rank(Schedule schedule, int64_t mp, int64_t stage);
// Whether the schedule runs several stages per rank (interleaved-1f1b, interleaved-zb, zbv).
bool schedule_is_multi_stage(Schedule s);
// Whether the schedule splits a stage's backward into input (I) and weight (W) passes.
bool schedule_splits_backward(Schedule s);
const char* sharding_name(Sharding s); // "none" | "zero2" | "zero3"
// The inverse of sharding_name; nullopt for any other name.
std::optional<Sharding> sharding_from_name(const std::string& name);

}  // namespace hybridplan
