// Plan JSON and its validation against the graph and cluster it is applied to.
#include "planner/documents/plan.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "common/error.h"
#include "common/json_fields.h"
#include "common/json_io.h"
#include "common/limits.h"
#include "planner/costs/tensor_parallel_cost.h"

namespace hybridplan {
namespace {

constexpr const char* kPlanKind = "hybridplan.plan";

std::string quoted(const std::string& s) { return Json(s).dump(); }
std::string str(int64_t v) { return std::to_string(v); }

MpMode mode_from_json(const JsonReader& in, const Json& v) {
  const std::string name = in.string(v, "mode");
  if (name == "placement") return MpMode::kPlacement;
  if (name == "pipeline") return MpMode::kPipeline;
  in.fail("mode", "must be \"placement\" or \"pipeline\"", v);
}

Schedule schedule_from_json(const JsonReader& in, const Json& v) {
  if (const std::optional<Schedule> s = schedule_from_name(in.string(v, "schedule"))) return *s;
  in.fail("schedule",
          "must be \"none\", \"gpipe\", \"1f1b\", \"interleaved-1f1b\", \"interleaved-zb\" or "
          "\"zbv\"",
          v);
}

Sharding sharding_from_json(const JsonReader& in, const Json& v) {
  if (const std::optional<Sharding> s = sharding_from_name(in.string(v, "sharding"))) return *s;
  in.fail("sharding", "must be \"none\", \"zero2\" or \"zero3\"", v);
}

Prediction prediction_from_json(const JsonReader& in, const Json& j) {
  const std::string path = "predicted";
  in.object(j, path);
  Prediction p;
  const auto number = [&](const char* key, double& out) {
    if (const Json* v = in.optional(j, key)) out = in.number(*v, json_child_path(path, key));
  };
  number("step_s", p.step_s);
  number("compute_s", p.compute_s);
  number("allreduce_s", p.allreduce_s);
  number("sharding_s", p.sharding_s);
  number("optimizer_s", p.optimizer_s);
  number("overhead_s", p.overhead_s);
  number("compute_slowdown", p.compute_slowdown);
  number("transfer_s", p.transfer_s);
  number("bubble_s", p.bubble_s);
  number("tp_comm_s", p.tp_comm_s);
  number("epochs", p.epochs);
  number("time_to_train_s", p.time_to_train_s);
  number("samples_per_s", p.samples_per_s);
  if (const Json* m = in.optional(j, "memory_bytes")) {
    in.array(*m, "predicted.memory_bytes");
    for (size_t i = 0; i < m->size(); ++i) {
      p.memory_bytes.push_back(in.integer((*m)[i], json_index_path("predicted.memory_bytes", i)));
    }
  }
  if (const Json* f = in.optional(j, "feasible")) {
    if (!f->is_boolean()) in.fail("predicted.feasible", "must be true or false", *f);
    p.feasible = f->get<bool>();
  }
  if (const Json* r = in.optional(j, "infeasible_reason")) {
    p.infeasible_reason = in.string(*r, "predicted.infeasible_reason");
  }
  if (const Json* c = in.optional(j, "compute_model")) {
    p.compute_model = in.string(*c, "predicted.compute_model");
  }
  if (const Json* m = in.optional(j, "memory_model")) {
    p.memory_model = in.string(*m, "predicted.memory_model");
  }
  if (const Json* rings = in.optional(j, "allreduce_rings")) {
    const std::string rings_path = "predicted.allreduce_rings";
    in.array(*rings, rings_path);
    for (size_t k = 0; k < rings->size(); ++k) {
      const std::string ring_path = json_index_path(rings_path, k);
      const Json& ring = in.array((*rings)[k], ring_path);
      std::vector<DeviceIndex> devices;
      for (size_t i = 0; i < ring.size(); ++i) devices.push_back(in.integer(ring[i], json_index_path(ring_path, i)));
      p.allreduce_rings.push_back(std::move(devices));
    }
  }
  return p;
}

}  // namespace

const char* mode_name(MpMode m) { return m == MpMode::kPipeline ? "pipeline" : "placement"; }

const char* schedule_name(Schedule s) {
  switch (s) {
    case Schedule::kNone: return "none";
    case Schedule::kGpipe: return "gpipe";
    case Schedule::k1F1B: return "1f1b";
    case Schedule::kInterleaved1F1B: return "interleaved-1f1b";
    case Schedule::kInterleavedZB: return "interleaved-zb";
    case Schedule::kZBV: return "zbv";
  }
  return "none";
}

std::optional<Schedule> schedule_from_name(const std::string& name) {
  for (Schedule s : {Schedule::kNone, Schedule::kGpipe, Schedule::k1F1B, Schedule::kInterleaved1F1B,
                     Schedule::kInterleavedZB, Schedule::kZBV}) {
    if (name == schedule_name(s)) return s;
  }
  return std::nullopt;
}

bool schedule_is_multi_stage(Schedule s) {
  return s == Schedule::kInterleaved1F1B || s == Schedule::kInterleavedZB || s == Schedule::kZBV;
}

bool schedule_splits_backward(Schedule s) {
  return s == Schedule::kInterleavedZB || s == Schedule::kZBV;
}

int64_t stage_rank(Schedule schedule, int64_t mp, int64_t stage) {
  // torch.distributed.pipelining._utils.generate_stage_to_rank_mapping: "v" for ZBV, else "loop"
  if (schedule == Schedule::kZBV && stage >= mp) return 2 * mp - 1 - stage;
  return stage % mp;
}

int64_t Plan::device_of(int32_t a) const {
  return mode == MpMode::kPipeline ? stage_rank(schedule, mp, a) : a;
}

const char* sharding_name(Sharding s) {
  switch (s) {
    case Sharding::kNone: return "none";
    case Sharding::kZero2: return "zero2";
    case Sharding::kZero3: return "zero3";
  }
  return "none";
}

std::optional<Sharding> sharding_from_name(const std::string& name) {
  for (Sharding s : {Sharding::kNone, Sharding::kZero2, Sharding::kZero3}) {
    if (name == sharding_name(s)) return s;
  }
  return std::nullopt;
}

int64_t peak_memory_bytes(const Prediction& p) {
  return p.memory_bytes.empty() ? 0 : *std::max_element(p.memory_bytes.begin(), p.memory_bytes.end());
}

// The rule an assignment entry's value breaks: one message for the loader and the validation.
static std::string assignment_range_rule(const Plan& plan) {
  const std::string last = std::to_string(plan.num_stages() - 1);
  return plan.mode == MpMode::kPipeline && plan.virtual_stages > 1
             ? "must be a stage in 0..mp*virtual_stages-1 = 0.." + last
             : "must be in 0..mp-1 = 0.." + last;
}

// A pipeline's stages per rank against its schedule (plan.h Schedule), and torch's own
// conditions on the micro-batch count, so that a plan torch would refuse fails here, first.
static void check_virtual_stages(const Plan& plan, const std::string& source) {
  constexpr int64_t kMaxVirtualStages = 64;
  const int64_t v = plan.virtual_stages;
  const std::string name = std::string("\"") + schedule_name(plan.schedule) + "\"";
  if (v < 1 || v > kMaxVirtualStages) {
    throw_input_error(source, "virtual_stages", "must be in 1.." + str(kMaxVirtualStages), str(v));
  }
  if (!schedule_is_multi_stage(plan.schedule) && v != 1) {
    throw_input_error(source, "virtual_stages",
                      "must be 1 for schedule " + name + " (one stage per rank)", str(v));
  }
  if (plan.schedule == Schedule::kZBV && v != 2) {
    throw_input_error(source, "virtual_stages",
                      "must be 2 for schedule \"zbv\" (two stages per rank in a V)", str(v));
  }
  if (schedule_is_multi_stage(plan.schedule) && plan.schedule != Schedule::kZBV && v < 2) {
    throw_input_error(source, "virtual_stages",
                      "must be >= 2 for schedule " + name + " (it interleaves several stages per rank)",
                      str(v));
  }
  if (plan.schedule == Schedule::kInterleaved1F1B || plan.schedule == Schedule::kInterleavedZB) {
    // torch's interleaved schedules run rounds of max(1, M / mp) micro-batches.
    const int64_t rounds = std::max<int64_t>(1, plan.num_microbatches / plan.mp);
    if (plan.num_microbatches % rounds != 0) {
      throw_input_error(source, "num_microbatches",
                        "must be a multiple of the rounds max(1, num_microbatches / mp) = " +
                            str(rounds) + " for schedule " + name +
                            " (torch.distributed.pipelining's interleaved schedules)",
                        str(plan.num_microbatches));
    }
  }
}

// Plan::validate_structure's checks, field group by field group.

// The sizes: dp, mp, tp and world_size, the batch sizes. Bounded first, so that dp * mp and
// dp * per_replica_batch cannot overflow in the checks after them.
static void check_sizes(const Plan& plan, const std::string& source) {
  check_device_count(source, "dp", plan.dp);
  check_device_count(source, "mp", plan.mp);
  check_device_count(source, "tp", plan.tp);
  if (plan.tp == 1 && plan.world_size != plan.dp * plan.mp) {
    throw_input_error(source, "world_size", "must equal dp * mp = " + str(plan.dp * plan.mp), str(plan.world_size));
  }
  if (plan.tp > 1 && plan.world_size != plan.dp * plan.mp * plan.tp) {  // each <= 2^20: no overflow
    throw_input_error(source, "world_size", "must equal dp * mp * tp = " + str(plan.dp * plan.mp * plan.tp),
                      str(plan.world_size));
  }
  check_batch_size(source, "per_replica_batch", plan.per_replica_batch);
  check_accumulation_steps(source, "accumulation_steps", plan.accumulation_steps);
  // each bounded: dp * per_replica_batch * accumulation_steps < 2^61
  const int64_t samples = plan.dp * plan.per_replica_batch * plan.accumulation_steps;
  if (plan.global_batch != samples) {
    throw_input_error(source, "global_batch",
                      plan.accumulation_steps == 1
                          ? "must equal dp * per_replica_batch = " + str(samples)
                          : "must equal dp * per_replica_batch * accumulation_steps = " + str(samples),
                      str(plan.global_batch));
  }
}

// The fields one MP mode fixes: schedule, num_microbatches, virtual_stages.
static void check_mode_fields(const Plan& plan, const std::string& source) {
  if (plan.mode == MpMode::kPlacement) {
    if (plan.schedule != Schedule::kNone) {
      throw_input_error(source, "schedule", "must be \"none\" for a placement plan",
                        quoted(schedule_name(plan.schedule)));
    }
    if (plan.num_microbatches != 1) {
      throw_input_error(source, "num_microbatches", "must be 1 for a placement plan",
                        str(plan.num_microbatches));
    }
    if (plan.virtual_stages != 1) {
      throw_input_error(source, "virtual_stages", "must be 1 for a placement plan",
                        str(plan.virtual_stages));
    }
  } else {
    if (plan.schedule == Schedule::kNone) {
      throw_input_error(source, "schedule",
                        "must be \"gpipe\", \"1f1b\", \"interleaved-1f1b\", \"interleaved-zb\" "
                        "or \"zbv\" for a pipeline plan",
                        quoted(schedule_name(plan.schedule)));
    }
    check_virtual_stages(plan, source);
    if (plan.num_microbatches < 1 || plan.num_microbatches > plan.per_replica_batch) {
      throw_input_error(source, "num_microbatches",
                        "must be in 1..per_replica_batch = " + str(plan.per_replica_batch),
                        str(plan.num_microbatches));
    }
  }
}

// How data parallelism shards and how tensor and sequence parallelism compose with the mode.
static void check_sharding_and_tp(const Plan& plan, const std::string& source) {
  if (plan.sharding != Sharding::kNone) {
    const std::string got = quoted(sharding_name(plan.sharding));
    if (plan.dp < 2) {
      throw_input_error(source, "sharding",
                        "must be \"none\" with dp = 1 (there is no data-parallel group to "
                        "shard over)", got);
    }
    if (plan.mode == MpMode::kPlacement && plan.mp != 1) {
      throw_input_error(source, "sharding",
                        "must be \"none\" for a placement plan with mp = " + str(plan.mp) +
                            " > 1 (FSDP shards a module held on one device per rank)", got);
    }
    if (plan.mode == MpMode::kPipeline && plan.sharding != Sharding::kZero2) {
      throw_input_error(source, "sharding",
                        "must be \"none\" or \"zero2\" for a pipeline plan (torch's pipeline "
                        "schedules keep a stage's parameters gathered across its micro-batches)",
                        got);
    }
  }
  if (plan.sequence_parallel && plan.tp <= 1) {
    throw_input_error(source, "sequence_parallel",
                      "must be false with tp = " + str(plan.tp) +
                          " (sequence parallelism splits the tokens over a TP group)",
                      "true");
  }
  if (plan.sequence_parallel && plan.mode == MpMode::kPipeline) {
    // The Python executor splits the sequence between a module's blocks; a pipeline stage is
    // a graph torch.export traced, with the sequence length as a literal in its operations
    // (docs/tensor_parallel.md "Sequence parallelism").
    throw_input_error(source, "sequence_parallel",
                      "must be false for a pipeline plan (mode pipeline): sequence "
                      "parallelism is applied to placement plans only",
                      "true");
  }
  if (plan.tp > 1 && plan.mode == MpMode::kPlacement && plan.mp != 1) {
    throw_input_error(source, "tp",
                      "must be 1 for a placement plan with mp = " + str(plan.mp) +
                          " > 1 (tensor parallelism splits a replica held on one device per "
                          "rank; a pipeline splits each stage)",
                      str(plan.tp));
  }
  if (plan.tp > 1 && plan.mode == MpMode::kPipeline && plan.sharding != Sharding::kNone) {
    throw_input_error(source, "sharding",
                      "must be \"none\" for a pipeline plan with tp = " + str(plan.tp) +
                          " > 1 (sharding composes with tensor parallelism on a placement plan: "
                          "FSDP2 over the data-parallel dimension of a 2-D mesh)",
                      quoted(sharding_name(plan.sharding)));
  }
  if (plan.dp_shard != 0) {
    if (plan.sharding == Sharding::kNone) {
      throw_input_error(source, "dp_shard",
                        "must be absent when sharding is \"none\" (there are no shards)",
                        str(plan.dp_shard));
    }
    if (plan.dp_shard < 2 || plan.dp_shard > plan.dp || plan.dp % plan.dp_shard != 0) {
      throw_input_error(source, "dp_shard",
                        "must divide dp = " + str(plan.dp) + " and be >= 2 (shard groups of dp_shard "
                        "replicas, dp / dp_shard of them replicating)",
                        str(plan.dp_shard));
    }
  }
}

// The mesh: dp rows of mp devices, each the first of its TP group, none reused.
static void check_mesh(const Plan& plan, const std::string& source) {
  if (static_cast<int64_t>(plan.mesh.size()) != plan.dp) {
    throw_input_error(source, "mesh", "must have dp = " + str(plan.dp) + " rows",
                      str(static_cast<int64_t>(plan.mesh.size())) + " rows");
  }
  // No string is built unless a check fails (evaluate() runs this for every candidate plan).
  const auto mesh_path = [&](int64_t flat) {
    return json_index_path(json_index_path("mesh", static_cast<size_t>(flat / plan.mp)),
                           static_cast<size_t>(flat % plan.mp));
  };
  for (size_t r = 0; r < plan.mesh.size(); ++r) {
    if (static_cast<int64_t>(plan.mesh[r].size()) != plan.mp) {
      throw_input_error(source, json_index_path("mesh", r), "must have mp = " + str(plan.mp) + " devices",
                        str(static_cast<int64_t>(plan.mesh[r].size())) + " devices");
    }
    for (size_t k = 0; k < plan.mesh[r].size(); ++k) {
      const int64_t flat = static_cast<int64_t>(r) * plan.mp + static_cast<int64_t>(k);
      if (plan.mesh[r][k] < 0) {
        throw_input_error(source, mesh_path(flat), "must be a device index >= 0", str(plan.mesh[r][k]));
      }
      if (plan.mesh[r][k] % plan.tp != 0) {
        throw_input_error(source, mesh_path(flat),
                          "must be a multiple of tp = " + str(plan.tp) +
                              " (the first of its TP group's tp consecutive devices)",
                          str(plan.mesh[r][k]));
      }
    }
  }
  // A reused device: marked off in a table where the indices are few (a cluster's devices;
  // thousands of them in a search's every evaluate()), else, and to name it, found as equal
  // neighbours of the (device, flat position r * mp + k) sorted.
  DeviceIndex most = 0;
  for (const auto& row : plan.mesh) {
    for (DeviceIndex d : row) most = std::max(most, d);
  }
  bool reused = true;
  if (most < 4 * plan.dp * plan.mp + 4096) {
    std::vector<uint8_t> seen(static_cast<size_t>(most) + 1, 0);
    reused = false;
    for (const auto& row : plan.mesh) {
      for (DeviceIndex d : row) reused = reused || seen[d]++ != 0;
    }
  }
  if (reused) {
    std::vector<std::pair<DeviceIndex, int64_t>> devices;
    devices.reserve(static_cast<size_t>(plan.dp * plan.mp));
    for (size_t r = 0; r < plan.mesh.size(); ++r) {
      for (size_t k = 0; k < plan.mesh[r].size(); ++k) {
        devices.emplace_back(plan.mesh[r][k], static_cast<int64_t>(r) * plan.mp + static_cast<int64_t>(k));
      }
    }
    std::sort(devices.begin(), devices.end());
    for (size_t i = 1; i < devices.size(); ++i) {
      if (devices[i].first == devices[i - 1].first) {
        throw_input_error(source, mesh_path(devices[i].second),
                          "must not reuse a device (also " + mesh_path(devices[i - 1].second) + ")",
                          str(devices[i].first));
      }
    }
  }
}

void Plan::validate_structure(const std::string& source) const {
  check_sizes(*this, source);
  check_mode_fields(*this, source);
  check_sharding_and_tp(*this, source);
  check_mesh(*this, source);
  const int64_t values = num_stages();
  for (size_t i = 0; i < assignment.size(); ++i) {
    if (assignment[i] < 0 || assignment[i] >= values) {
      throw_input_error(source, json_index_path("assignment", i) + ".device",
                        assignment_range_rule(*this), str(assignment[i]));
    }
  }
  if (!recompute.empty() && recompute.size() != assignment.size()) {
    throw_input_error(source, "assignment",
                      "must give recompute for every entry or none (" +
                          str(static_cast<int64_t>(assignment.size())) + " entries)",
                      str(static_cast<int64_t>(recompute.size())) + " recompute flags");
  }
}

std::string module_of_call(const std::string& name) {
  const size_t at = name.rfind('@');
  if (at == std::string::npos || at + 1 == name.size()) return name;
  for (size_t i = at + 1; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return name;
  }
  return name.substr(0, at);
}

namespace {

// The recompute rules that need the graph (Plan::recompute's comment).
void validate_recompute(const Plan& plan, const std::string& source, const Graph& graph) {
  if (plan.recompute.empty()) return;
  std::unordered_map<std::string, size_t> first_call;  // module -> its first node
  std::vector<size_t> stage_first(plan.num_stages(), graph.nodes.size());  // pipeline: stage's first node
  const auto text = [](uint8_t kind) -> std::string {
    return kind == kRecomputeSelective ? "\"selective\"" : kind == kRecomputeFull ? "true" : "false";
  };
  for (size_t v = 0; v < graph.nodes.size(); ++v) {
    const uint8_t flag = plan.recompute[v];
    // built only to throw (evaluate() checks every candidate plan)
    const auto path = [v]() { return json_index_path("assignment", v) + ".recompute"; };
    if (flag == kRecomputeSelective && !graph.nodes[v].has_selective()) {
      throw_input_error(source, path(),
                        "may be \"selective\" only where the graph measured it (node " +
                            quoted(graph.nodes[v].name) +
                            " has no selective_saved_bytes: profile it again, or recompute it "
                            "fully)",
                        text(flag));
    }
    const auto [it, fresh] = first_call.emplace(module_of_call(graph.nodes[v].name), v);
    if (!fresh && plan.recompute[it->second] != flag) {
      throw_input_error(source, path(),
                        "must equal that of " + quoted(graph.nodes[it->second].name) +
                            ": the calls of one module recompute together",
                        text(flag));
    }
    if (plan.mode != MpMode::kPipeline) continue;
    const int32_t s = plan.assignment[v];
    if (stage_first[s] == graph.nodes.size()) {
      stage_first[s] = v;
    } else if (plan.recompute[stage_first[s]] != flag) {
      throw_input_error(source, path(),
                        "must equal that of " + quoted(graph.nodes[stage_first[s]].name) +
                            " on the same stage " + str(s) +
                            ": a pipeline recomputes whole stages (the executor checkpoints "
                            "a stage's forward)",
                        text(flag));
    }
  }
}

}  // namespace

void Plan::validate(const std::string& source, const Graph& graph, const Cluster& cluster) const {
  validate_structure(source);
  const std::string sha = hybridplan::graph_sha256(graph);
  if (graph_sha256 != sha) {
    throw_input_error(source, "graph.sha256",
                      "does not match the graph it is applied to (" + quoted(graph.name) +
                          " has sha256 " + sha + ")",
                      quoted(graph_sha256));
  }
  if (cluster_name != cluster.name) {
    throw_input_error(source, "cluster.name",
                      "does not match the cluster it is applied to (" + quoted(cluster.name) + ")",
                      quoted(cluster_name));
  }
  if (cluster_num_nodes != 0 && cluster_num_nodes != cluster.num_nodes) {
    throw_input_error(source, "cluster.num_nodes",
                      "does not match the cluster it is applied to (" + str(cluster.num_nodes) + ")",
                      str(cluster_num_nodes));
  }
  if (cluster_devices_per_node != 0 && cluster_devices_per_node != cluster.devices_per_node) {
    throw_input_error(source, "cluster.devices_per_node",
                      "does not match the cluster it is applied to (" +
                          str(cluster.devices_per_node) + ")",
                      str(cluster_devices_per_node));
  }
  validate_fit(source, graph, cluster);
}

void Plan::validate_fit(const std::string& source, const Graph& graph, const Cluster& cluster) const {
  if (tp > 1) {
    if (cluster.devices_per_node % tp != 0) {
      throw_input_error(source, "tp",
                        "must divide the cluster's devices_per_node = " +
                            str(cluster.devices_per_node) + " (a TP group is on one node)",
                        str(tp));
    }
    if (!graph.has_tensor_parallel()) {
      throw_input_error(source, "tp",
                        "must be 1: graph " + quoted(graph.name) +
                            " has no node with tensor_parallel (profile it again with tensor "
                            "parallelism detection)",
                        str(tp));
    }
    // the nodes tp does not split run whole (tensor_parallel_cost.h tp_split_mask); one must
    const std::vector<uint8_t> splits = tp_split_mask(graph, tp);
    if (std::find(splits.begin(), splits.end(), 1) == splits.end()) {
      std::string degrees;
      for (const Node& node : graph.nodes) {
        if (!node.tensor_parallel) continue;
        const std::string d = str(node.tensor_parallel->max_degree);
        if (degrees.find(" " + d + ",") == std::string::npos) degrees += " " + d + ",";
      }
      degrees.pop_back();
      throw_input_error(source, "tp",
                        "must divide the max_degree of a node with tensor_parallel, so that one "
                        "splits (graph " + quoted(graph.name) + " has max_degree" + degrees +
                            "; a tied group splits only where all its nodes do)",
                        str(tp));
    }
  }
  if (sequence_parallel) {  // tp > 1 (validate_structure)
    if (const std::optional<std::string> rule = sequence_parallel_refusal(graph, tp)) {
      throw_input_error(source, "sequence_parallel", *rule, "true");
    }
  }
  // the smallest forward: a pipeline's smallest micro-batch (the batch split into chunks of
  // floor or ceil of per_replica_batch / num_microbatches), placement the per-replica batch
  const int64_t device_batch = per_replica_batch / (mode == MpMode::kPipeline ? num_microbatches : 1);
  if (device_batch < graph.profiled.min_batch_size) {
    throw_input_error(source, mode == MpMode::kPipeline ? "num_microbatches" : "per_replica_batch",
                      "must leave each forward at least graph " + quoted(graph.name) +
                          "'s profiled.min_batch_size = " + str(graph.profiled.min_batch_size) +
                          " samples (the smallest batch the model accepts; " +
                          str(device_batch) + " per " +
                          (mode == MpMode::kPipeline ? "micro-batch" : "replica") +
                          "): use fewer micro-batches or a larger batch",
                      str(mode == MpMode::kPipeline ? num_microbatches : per_replica_batch));
  }
  if (world_size > cluster.num_devices()) {
    throw_input_error(source, "world_size",
                      "exceeds the cluster's " + str(cluster.num_devices()) + " devices",
                      str(world_size));
  }
  for (size_t r = 0; r < mesh.size(); ++r) {
    for (size_t k = 0; k < mesh[r].size(); ++k) {
      if (mesh[r][k] >= cluster.num_devices()) {
        throw_input_error(source, json_index_path(json_index_path("mesh", r), k),
                          "names no device of cluster " + quoted(cluster.name) + " (0.." +
                              str(cluster.num_devices() - 1) + ")",
                          str(mesh[r][k]));
      }
    }
  }
  const size_t n = graph.nodes.size();
  if (assignment.size() != n) {
    throw_input_error(source, "assignment",
                      "must have one entry per graph node (" + str(static_cast<int64_t>(n)) + ")",
                      str(static_cast<int64_t>(assignment.size())) + " entries");
  }
  if (!assignment_node_ids.empty()) {
    for (size_t i = 0; i < n; ++i) {
      if (assignment_node_ids[i] != graph.nodes[i].id) {
        throw_input_error(source, json_index_path("assignment", i) + ".node",
                          "must be node id " + str(graph.nodes[i].id) + " (" +
                              quoted(graph.nodes[i].name) +
                              "): entries follow the graph's node order "
                              "(load_plan(path, graph, cluster) reorders them)",
                          str(assignment_node_ids[i]));
      }
    }
  }
  validate_recompute(*this, source, graph);
  if (mode != MpMode::kPipeline) return;
  for (size_t k = 0; k < graph.edges.size(); ++k) {
    const Edge& e = graph.edges[k];
    if (assignment[e.dst] < assignment[e.src]) {
      throw_input_error(
          source, json_index_path("assignment", e.dst) + ".device",
          "must not be an earlier stage than its input " + quoted(graph.nodes[e.src].name) +
              " on stage " + str(assignment[e.src]) + " (edges[" + str(static_cast<int64_t>(k)) +
              "]): pipeline stages never decrease along an edge",
          str(assignment[e.dst]));
    }
  }
  const int64_t stages = num_stages();
  std::vector<bool> stage_used(stages, false);
  for (int32_t s : assignment) stage_used[s] = true;
  for (int64_t s = 0; s < stages; ++s) {
    if (!stage_used[s]) {
      throw_input_error(source, "assignment",
                        "must give every pipeline stage 0.." + std::string(virtual_stages > 1 ? "mp*virtual_stages-1" : "mp-1") + " a node",
                        "stage " + str(s) + " empty");
    }
  }
}

Plan plan_from_json(const Json& j, const std::string& source) {
  const JsonReader in(source);
  in.header(j, kPlanKind);
  Plan p;
  const Json& graph = in.object(in.required(j, "", "graph"), "graph");
  p.graph_name = in.field_string(graph, "graph", "name");
  p.graph_sha256 = in.field_string(graph, "graph", "sha256");
  const Json& cluster = in.object(in.required(j, "", "cluster"), "cluster");
  p.cluster_name = in.field_string(cluster, "cluster", "name");
  if (in.optional(cluster, "num_nodes")) p.cluster_num_nodes = in.field_int(cluster, "cluster", "num_nodes");
  if (in.optional(cluster, "devices_per_node")) {
    p.cluster_devices_per_node = in.field_int(cluster, "cluster", "devices_per_node");
  }
  p.world_size = in.field_int(j, "", "world_size");
  p.dp = in.field_int(j, "", "dp");
  p.mp = in.field_int(j, "", "mp");
  if (in.optional(j, "tp")) p.tp = in.field_int(j, "", "tp");
  if (const Json* sp = in.optional(j, "sequence_parallel")) {
    p.sequence_parallel = in.boolean(*sp, "sequence_parallel");
  }
  if (const Json* pr = in.optional(j, "precision")) {
    const std::optional<Precision> precision = precision_from_name(in.string(*pr, "precision"));
    if (!precision) in.fail("precision", precision_rule(), *pr);
    p.precision = *precision;
  }
  p.mode = mode_from_json(in, in.required(j, "", "mode"));
  p.per_replica_batch = in.field_int(j, "", "per_replica_batch");
  if (const Json* c = in.optional(j, "compile")) p.compile = in.boolean(*c, "compile");
  if (in.optional(j, "accumulation_steps")) {
    p.accumulation_steps = in.field_int(j, "", "accumulation_steps");
  }
  p.global_batch = in.field_int(j, "", "global_batch");
  p.num_microbatches = in.field_int(j, "", "num_microbatches");
  p.schedule = schedule_from_json(in, in.required(j, "", "schedule"));
  if (in.optional(j, "virtual_stages")) p.virtual_stages = in.field_int(j, "", "virtual_stages");
  if (const Json* sharding = in.optional(j, "sharding")) p.sharding = sharding_from_json(in, *sharding);
  if (in.optional(j, "dp_shard")) p.dp_shard = in.field_int(j, "", "dp_shard");
  if (p.dp_shard == p.dp && p.sharding != Sharding::kNone) p.dp_shard = 0;  // the default, spelled out

  const Json& mesh = in.array(in.required(j, "", "mesh"), "mesh");
  for (size_t r = 0; r < mesh.size(); ++r) {
    const std::string row_path = json_index_path("mesh", r);
    const Json& row = in.array(mesh[r], row_path);
    std::vector<DeviceIndex> devices;
    for (size_t k = 0; k < row.size(); ++k) devices.push_back(in.integer(row[k], json_index_path(row_path, k)));
    p.mesh.push_back(std::move(devices));
  }

  const Json& assignment = in.array(in.required(j, "", "assignment"), "assignment");
  for (size_t i = 0; i < assignment.size(); ++i) {
    const std::string path = json_index_path("assignment", i);
    const Json& entry = in.object(assignment[i], path);
    p.assignment_node_ids.push_back(in.field_int(entry, path, "node"));
    const Json* name = in.optional(entry, "name");
    p.assignment_names.push_back(name ? in.string(*name, path + ".name") : "");
    const int64_t device = in.field_int(entry, path, "device");
    // (an out-of-range virtual_stages fails validate_structure first)
    if (device < 0 || (p.virtual_stages >= 1 && device >= p.num_stages())) {
      in.fail(path + ".device", assignment_range_rule(p), str(device));
    }
    p.assignment.push_back(static_cast<int32_t>(device));
    if (const Json* flag = in.optional(entry, "recompute")) {
      uint8_t kind = kRecomputeNone;
      if (flag->is_string()) {
        const std::string name = flag->get<std::string>();
        if (name == "full") {
          kind = kRecomputeFull;
        } else if (name == "selective") {
          kind = kRecomputeSelective;
        } else {
          in.fail(path + ".recompute", "must be true, false, \"full\" or \"selective\"", *flag);
        }
      } else if (!flag->is_boolean()) {
        in.fail(path + ".recompute", "must be true, false, \"full\" or \"selective\"", *flag);
      } else if (flag->get<bool>()) {
        kind = kRecomputeFull;
      }
      if (kind != kRecomputeNone) {
        p.recompute.resize(assignment.size(), kRecomputeNone);
        p.recompute[i] = kind;
      }
    }
  }
  if (const Json* note = in.optional(j, "device_mapping")) {
    p.device_mapping_note = in.string(*note, "device_mapping");
  }
  if (const Json* predicted = in.optional(j, "predicted")) p.predicted = prediction_from_json(in, *predicted);
  p.validate_structure(source);
  return p;
}

void align_assignment_to_graph(Plan& plan, const Graph& graph, const std::string& source) {
  if (plan.assignment_node_ids.empty()) return;  // built in code: already in graph order
  std::unordered_map<NodeId, size_t> index_of;
  for (size_t i = 0; i < graph.nodes.size(); ++i) index_of.emplace(graph.nodes[i].id, i);
  const size_t n = graph.nodes.size();
  std::vector<int32_t> assignment(n, -1);
  std::vector<uint8_t> recompute(plan.recompute.empty() ? 0 : n, 0);
  std::vector<std::string> names(n);
  for (size_t e = 0; e < plan.assignment_node_ids.size(); ++e) {
    const std::string path = json_index_path("assignment", e) + ".node";
    const auto it = index_of.find(plan.assignment_node_ids[e]);
    if (it == index_of.end()) {
      throw_input_error(source, path, "names no node of graph " + quoted(graph.name),
                        str(plan.assignment_node_ids[e]));
    }
    if (assignment[it->second] >= 0) {
      throw_input_error(source, path, "assigns a node a second time", str(plan.assignment_node_ids[e]));
    }
    assignment[it->second] = plan.assignment[e];
    if (!recompute.empty()) recompute[it->second] = plan.recompute[e];
    names[it->second] = plan.assignment_names.size() > e ? plan.assignment_names[e] : "";
  }
  for (size_t i = 0; i < n; ++i) {
    if (assignment[i] < 0) {
      throw_input_error(source, "assignment",
                        "misses node " + str(graph.nodes[i].id) + " " + quoted(graph.nodes[i].name),
                        str(static_cast<int64_t>(plan.assignment_node_ids.size())) + " entries for " +
                            str(static_cast<int64_t>(n)) + " nodes");
    }
  }
  plan.assignment = std::move(assignment);
  plan.recompute = std::move(recompute);
  plan.assignment_names = std::move(names);
  plan.assignment_node_ids.clear();
  for (const Node& node : graph.nodes) plan.assignment_node_ids.push_back(node.id);
}

Json prediction_to_json(const Prediction& p) {
  Json j = {{"step_s", p.step_s},
            {"compute_s", p.compute_s},
            {"allreduce_s", p.allreduce_s},
            {"sharding_s", p.sharding_s},
            {"optimizer_s", p.optimizer_s},
            {"overhead_s", p.overhead_s},
            {"transfer_s", p.transfer_s},
            {"bubble_s", p.bubble_s},
            {"memory_bytes", p.memory_bytes},
            {"epochs", p.epochs},
            {"time_to_train_s", p.time_to_train_s},
            {"samples_per_s", p.samples_per_s},
            {"compute_model", p.compute_model},
            {"compute_slowdown", p.compute_slowdown},
            {"feasible", p.feasible}};
  if (p.tp_comm_s > 0) j["tp_comm_s"] = p.tp_comm_s;  // absent: 0 (tp = 1)
  if (!p.memory_model.empty()) j["memory_model"] = p.memory_model;  // absent: not converted
  if (!p.allreduce_rings.empty()) j["allreduce_rings"] = p.allreduce_rings;
  if (!p.infeasible_reason.empty()) j["infeasible_reason"] = p.infeasible_reason;
  return j;
}

Json plan_to_json(const Plan& p, const Graph& graph) {
  HP_INTERNAL_ASSERT(p.assignment.size() == graph.nodes.size(),
                     "plan has " << p.assignment.size() << " assignments for "
                                 << graph.nodes.size() << " nodes");
  Json assignment = Json::array();
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    assignment.push_back({{"node", graph.nodes[i].id}, {"name", graph.nodes[i].name},
                          {"device", p.assignment[i]}});
    if (p.recomputes_selectively(i)) {
      assignment.back()["recompute"] = "selective";
    } else if (p.recomputes(i)) {
      assignment.back()["recompute"] = true;  // absent: false (old plans)
    }
  }
  Json cluster = {{"name", p.cluster_name}};
  if (p.cluster_num_nodes > 0) cluster["num_nodes"] = p.cluster_num_nodes;
  if (p.cluster_devices_per_node > 0) cluster["devices_per_node"] = p.cluster_devices_per_node;
  Json j = {{"schema_version", 1},
            {"kind", kPlanKind},
            {"graph", {{"name", p.graph_name}, {"sha256", p.graph_sha256}}},
            {"cluster", std::move(cluster)},
            {"world_size", p.world_size},
            {"dp", p.dp},
            {"mp", p.mp},
            {"mode", mode_name(p.mode)},
            {"per_replica_batch", p.per_replica_batch},
            {"global_batch", p.global_batch},
            {"num_microbatches", p.num_microbatches},
            {"schedule", schedule_name(p.schedule)},
            {"mesh", p.mesh},
            {"assignment", std::move(assignment)},
            {"predicted", prediction_to_json(p.predicted)}};
  if (p.sharding != Sharding::kNone) j["sharding"] = sharding_name(p.sharding);  // absent: none
  if (p.virtual_stages != 1) j["virtual_stages"] = p.virtual_stages;              // absent: 1
  if (p.accumulation_steps != 1) j["accumulation_steps"] = p.accumulation_steps;  // absent: 1
  if (p.compile) j["compile"] = true;                                             // absent: false
  if (p.tp != 1) j["tp"] = p.tp;                                                  // absent: 1
  if (p.precision != Precision::kFp32) j["precision"] = precision_name(p.precision);  // absent: fp32
  if (p.sequence_parallel) j["sequence_parallel"] = true;                         // absent: false
  if (p.dp_shard != 0 && p.dp_shard != p.dp) j["dp_shard"] = p.dp_shard;          // absent: dp
  if (!p.device_mapping_note.empty()) j["device_mapping"] = p.device_mapping_note;
  return j;
}

Json plan_to_json(const Plan& p, const Graph& graph, const Cluster& cluster) {
  Json j = plan_to_json(p, graph);
  j["cluster"] = {{"name", cluster.name}, {"num_nodes", cluster.num_nodes},
                  {"devices_per_node", cluster.devices_per_node}};
  return j;
}

Plan load_plan(const std::string& path) { return plan_from_json(read_json_file(path, "plan"), path); }

Plan load_plan(const std::string& path, const Graph& graph, const Cluster& cluster) {
  Plan p = load_plan(path);
  align_assignment_to_graph(p, graph, path);
  p.validate(path, graph, cluster);
  return p;
}

void save_plan(const Plan& p, const Graph& graph, const std::string& path) {
  write_json_file(path, plan_to_json(p, graph));
}

void save_plan(const Plan& p, const Graph& graph, const Cluster& cluster, const std::string& path) {
  write_json_file(path, plan_to_json(p, graph, cluster));
}

}  // namespace hybridplan
