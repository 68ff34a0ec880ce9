// Cluster loading and validation, and the point-to-point link model.
//
// Assumptions: all devices are identical; links are full duplex and a transfer does not slow
// another one down (no contention model for point-to-point traffic; collectives model sharing
// of the inter-node injection bandwidth in allreduce_cost.h). `inter_node` is the per-node
// injection bandwidth (one NIC pool per node), so its latency/bandwidth also serve device pairs
// on different nodes.
#include "planner/documents/cluster.h"

#include "planner/documents/precision.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <limits>

#include "common/error.h"
#include "common/json_fields.h"
#include "common/json_io.h"
#include "common/limits.h"
#include "planner/documents/job.h"
#include "planner/documents/plan.h"
#include "planner/documents/presets.h"

namespace hybridplan {
namespace {

using NamedSeconds = std::vector<std::pair<std::string, double>>;

// The runtime's maps of seconds by name, with their JSON keys (read by runtime_from_json, each
// with the names it accepts).
std::array<std::pair<const char*, const NamedSeconds*>, 4> named_seconds_of(const Runtime& r) {
  return {{{"schedule_action_s", &r.schedule_action_s},
           {"schedule_action_sample_s", &r.schedule_action_sample_s},
           {"optimizer_tensor_s_by_optimizer", &r.optimizer_tensor_s_by_optimizer},
           {"sharded_optimizer_tensor_s_by_optimizer", &r.sharded_optimizer_tensor_s_by_optimizer}}};
}

// `name`'s entry in `by`, or nullptr.
const double* named_entry(const NamedSeconds& by, const std::string& name) {
  for (const auto& [key, seconds] : by) {
    if (key == name) return &seconds;
  }
  return nullptr;
}

constexpr const char* kClusterKind = "hybridplan.cluster";

void check_positive(const std::string& source, const std::string& path, double v) {
  if (!std::isfinite(v) || v <= 0) throw_input_error(source, path, "must be finite and > 0", json_number_text(v));
}

void check_non_negative(const std::string& source, const std::string& path, double v) {
  if (!std::isfinite(v) || v < 0) throw_input_error(source, path, "must be finite and >= 0", json_number_text(v));
}

Link link_from_json(const JsonReader& in, const Json& j, const std::string& path,
                    bool bandwidth_required) {
  Link link;
  if (bandwidth_required || in.optional(j, "bandwidth_bytes_per_s") != nullptr) {
    link.bandwidth_bytes_per_s = in.field_number(j, path, "bandwidth_bytes_per_s");
  }
  link.latency_s = in.field_number(j, path, "latency_s");
  return link;
}

std::optional<Link> collective_override(const JsonReader& in, const Json& level,
                                        const std::string& path, const char* key) {
  const Json* j = in.optional(level, key);
  if (j == nullptr) return std::nullopt;
  const std::string child = path + "." + key;
  in.object(*j, child);
  return link_from_json(in, *j, child, true);
}

Json link_to_json(const Link& link) {
  return {{"bandwidth_bytes_per_s", link.bandwidth_bytes_per_s}, {"latency_s", link.latency_s}};
}

Runtime runtime_from_json(const JsonReader& in, const Json& j) {
  in.object(j, "runtime");
  Runtime r;
  if (const Json* v = in.optional(j, "step_s")) r.step_s = in.number(*v, "runtime.step_s");
  if (const Json* v = in.optional(j, "action_s")) r.action_s = in.number(*v, "runtime.action_s");
  if (const Json* v = in.optional(j, "optimizer_tensor_s")) {
    r.optimizer_tensor_s = in.number(*v, "runtime.optimizer_tensor_s");
  }
  if (const Json* v = in.optional(j, "sharded_optimizer_tensor_s")) {
    r.sharded_optimizer_tensor_s = in.number(*v, "runtime.sharded_optimizer_tensor_s");
  }
  if (const Json* v = in.optional(j, "sharded_compute_slowdown")) {
    r.sharded_compute_slowdown = in.number(*v, "runtime.sharded_compute_slowdown");
  }
  if (const Json* v = in.optional(j, "selective_op_s")) {
    r.selective_op_s = in.number(*v, "runtime.selective_op_s");
  }
  // A JSON object of seconds keyed by names that `known` accepts (`keys` says which in the
  // error), read into `out` in its order.
  const auto named_seconds = [&](const char* key, const auto& known, const char* keys,
                                 NamedSeconds& out) {
    const Json* map = in.optional(j, key);
    if (!map) return;
    const std::string path = std::string("runtime.") + key;
    in.object(*map, path);
    for (const auto& [name, value] : map->items()) {
      if (!known(name)) in.fail(path + "." + name, keys, value);
      out.emplace_back(name, in.number(value, path + "." + name));
    }
  };
  const auto is_schedule = [](const std::string& name) {
    const std::optional<Schedule> schedule = schedule_from_name(name);
    return schedule && *schedule != Schedule::kNone;
  };
  const char* schedule_keys =
      "is not a pipeline schedule (the keys are \"gpipe\", \"1f1b\", \"interleaved-1f1b\", "
      "\"interleaved-zb\" and \"zbv\")";
  named_seconds("schedule_action_s", is_schedule, schedule_keys, r.schedule_action_s);
  if (const Json* v = in.optional(j, "action_sample_s")) {
    r.action_sample_s = in.number(*v, "runtime.action_sample_s");
  }
  named_seconds("schedule_action_sample_s", is_schedule, schedule_keys, r.schedule_action_sample_s);
  const auto is_optimizer = [](const std::string& name) {
    for (Optimizer o : {Optimizer::kSgd, Optimizer::kSgdMomentum, Optimizer::kAdam}) {
      if (name == optimizer_name(o)) return true;
    }
    return false;
  };
  const char* optimizer_keys =
      "is not a Job optimizer (the keys are \"sgd\", \"sgd_momentum\" and \"adam\")";
  named_seconds("optimizer_tensor_s_by_optimizer", is_optimizer, optimizer_keys,
                r.optimizer_tensor_s_by_optimizer);
  named_seconds("sharded_optimizer_tensor_s_by_optimizer", is_optimizer, optimizer_keys,
                r.sharded_optimizer_tensor_s_by_optimizer);
  if (const Json* table = in.optional(j, "shared_host_slowdown")) {
    const std::string path = "runtime.shared_host_slowdown";
    in.array(*table, path);
    for (size_t k = 0; k < table->size(); ++k) {
      const std::string p = json_index_path(path, k);
      const Json& pair = in.array((*table)[k], p);
      if (pair.size() != 2) in.fail(p, "must be a [processes, factor] pair", pair);
      r.shared_host_slowdown.emplace_back(in.integer(pair[0], p + "[0]"), in.number(pair[1], p + "[1]"));
    }
  }
  return r;
}

void validate_runtime(const std::string& source, const Runtime& r) {
  check_non_negative(source, "runtime.step_s", r.step_s);
  check_non_negative(source, "runtime.action_s", r.action_s);
  check_non_negative(source, "runtime.optimizer_tensor_s", r.optimizer_tensor_s);
  check_non_negative(source, "runtime.sharded_optimizer_tensor_s", r.sharded_optimizer_tensor_s);
  check_non_negative(source, "runtime.sharded_compute_slowdown", r.sharded_compute_slowdown);
  check_non_negative(source, "runtime.selective_op_s", r.selective_op_s);
  check_non_negative(source, "runtime.action_sample_s", r.action_sample_s);
  for (const auto& [key, by] : named_seconds_of(r)) {
    for (const auto& [name, seconds] : *by) {
      check_non_negative(source, std::string("runtime.") + key + "." + name, seconds);
    }
  }
  const auto& table = r.shared_host_slowdown;
  for (size_t k = 0; k < table.size(); ++k) {
    const std::string p = json_index_path("runtime.shared_host_slowdown", k);
    if (table[k].first < 1) throw_input_error(source, p + "[0]", "must be >= 1", std::to_string(table[k].first));
    if (k > 0 && table[k].first <= table[k - 1].first) {
      throw_input_error(source, p + "[0]",
                        "must be greater than the previous entry's " +
                            std::to_string(table[k - 1].first) + " (processes increasing)",
                        std::to_string(table[k].first));
    }
    check_positive(source, p + "[1]", table[k].second);
  }
}

}  // namespace

const char* collective_library_name(CollectiveLibrary library) {
  return library == CollectiveLibrary::kGloo ? "gloo" : "nccl";
}

double Runtime::action_s_for(const std::string& schedule) const {
  const double* s = named_entry(schedule_action_s, schedule);
  return s ? *s : action_s;
}

double Runtime::action_sample_s_for(const std::string& schedule) const {
  const double* s = named_entry(schedule_action_sample_s, schedule);
  return s ? *s : action_sample_s;
}

double Runtime::optimizer_tensor_s_for(const std::string& optimizer, bool sharded) const {
  if (sharded) {
    if (const double* s = named_entry(sharded_optimizer_tensor_s_by_optimizer, optimizer)) return *s;
    if (sharded_optimizer_tensor_s > 0) return sharded_optimizer_tensor_s;
  }
  const double* s = named_entry(optimizer_tensor_s_by_optimizer, optimizer);
  return s ? *s : optimizer_tensor_s;
}

double Runtime::slowdown(int64_t processes) const {
  double factor = 1.0;
  for (const auto& [k, f] : shared_host_slowdown) {
    if (k > processes) break;
    factor = f;
  }
  return factor;
}

Link Cluster::allreduce_link(DeviceIndex a, DeviceIndex b) const {
  const bool same_node = a / devices_per_node == b / devices_per_node;
  const std::optional<Link>& calibrated = same_node ? intra_node_allreduce : inter_node_allreduce;
  return calibrated ? *calibrated : link(a, b);
}

Link Cluster::collective_link(Collective kind, DeviceIndex a, DeviceIndex b) const {
  const bool same_node = a / devices_per_node == b / devices_per_node;
  const std::optional<Link>* calibrated = nullptr;
  if (kind == Collective::kAllGather) calibrated = same_node ? &intra_node_allgather : &inter_node_allgather;
  if (kind == Collective::kReduceScatter) {
    calibrated = same_node ? &intra_node_reduce_scatter : &inter_node_reduce_scatter;
  }
  return calibrated != nullptr && *calibrated ? **calibrated : allreduce_link(a, b);
}

Link Cluster::link(DeviceIndex a, DeviceIndex b) const {
  if (a == b) return {std::numeric_limits<double>::infinity(), 0.0};
  const int64_t node_a = a / devices_per_node;
  const int64_t node_b = b / devices_per_node;
  if (node_a != node_b) return inter_node;
  if (bandwidth_matrix.empty()) return intra_node;
  return {bandwidth_matrix[a % devices_per_node][b % devices_per_node], intra_node.latency_s};
}

void Cluster::validate(const std::string& source) const {
  if (name.empty()) throw_input_error(source, "name", "must be a non-empty string", "\"\"");
  // Each bounded before their product (num_devices()) is taken.
  check_device_count(source, "num_nodes", num_nodes);
  check_device_count(source, "devices_per_node", devices_per_node);
  if (num_nodes * devices_per_node > kMaxDevices) {
    throw_input_error(source, "num_nodes * devices_per_node",
                      "must be at most " + std::to_string(kMaxDevices) + " (2^20 devices)",
                      std::to_string(num_nodes * devices_per_node));
  }
  if (device.memory_bytes <= 0) {
    throw_input_error(source, "device.memory_bytes", "must be > 0", std::to_string(device.memory_bytes));
  }
  check_bytes_at_most(source, "device.memory_bytes", device.memory_bytes);
  check_non_negative(source, "device.peak_flops", device.peak_flops);
  check_non_negative(source, "device.memory_bandwidth_bytes_per_s", device.memory_bandwidth_bytes_per_s);
  check_non_negative(source, "device.call_floor_s", device.call_floor_s);
  for (const auto& [path, link] : {std::pair{"intra_node.allreduce", &intra_node_allreduce},
                                   {"inter_node.allreduce", &inter_node_allreduce},
                                   {"intra_node.allgather", &intra_node_allgather},
                                   {"inter_node.allgather", &inter_node_allgather},
                                   {"intra_node.reduce_scatter", &intra_node_reduce_scatter},
                                   {"inter_node.reduce_scatter", &inter_node_reduce_scatter},
                                   {"intra_node.tp_allreduce", &intra_node_tp_allreduce}}) {
    if (!*link) continue;
    check_positive(source, std::string(path) + ".bandwidth_bytes_per_s", (*link)->bandwidth_bytes_per_s);
    check_non_negative(source, std::string(path) + ".latency_s", (*link)->latency_s);
  }
  validate_runtime(source, runtime);
  check_non_negative(source, "intra_node.latency_s", intra_node.latency_s);
  if (bandwidth_matrix.empty()) {
    check_positive(source, "intra_node.bandwidth_bytes_per_s", intra_node.bandwidth_bytes_per_s);
  } else {
    check_non_negative(source, "intra_node.bandwidth_bytes_per_s", intra_node.bandwidth_bytes_per_s);
    const std::string path = "intra_node.bandwidth_matrix_bytes_per_s";
    const auto rows = static_cast<int64_t>(bandwidth_matrix.size());
    if (rows != devices_per_node) {
      throw_input_error(source, path,
                        "must have devices_per_node = " + std::to_string(devices_per_node) + " rows",
                        std::to_string(rows) + " rows");
    }
    for (int64_t i = 0; i < rows; ++i) {
      const auto& row = bandwidth_matrix[i];
      const std::string row_path = json_index_path(path, i);
      if (static_cast<int64_t>(row.size()) != devices_per_node) {
        throw_input_error(source, row_path,
                          "must have devices_per_node = " + std::to_string(devices_per_node) +
                              " entries",
                          std::to_string(row.size()) + " entries");
      }
      for (int64_t k = 0; k < devices_per_node; ++k) {
        if (k == i) continue;  // the diagonal is ignored
        check_positive(source, json_index_path(row_path, k), row[k]);
      }
    }
  }
  if (num_nodes > 1) {
    check_positive(source, "inter_node.bandwidth_bytes_per_s", inter_node.bandwidth_bytes_per_s);
  } else {
    check_non_negative(source, "inter_node.bandwidth_bytes_per_s", inter_node.bandwidth_bytes_per_s);
  }
  check_non_negative(source, "inter_node.latency_s", inter_node.latency_s);
  if (!sources.is_array()) throw_input_error(source, "sources", "must be an array", sources.dump());
}

Cluster cluster_from_json(const Json& j, const std::string& source) {
  const JsonReader in(source);
  in.header(j, kClusterKind);
  Cluster c;
  c.name = in.field_string(j, "", "name");
  c.num_nodes = in.field_int(j, "", "num_nodes");
  c.devices_per_node = in.field_int(j, "", "devices_per_node");

  const Json& device = in.object(in.required(j, "", "device"), "device");
  c.device.name = in.field_string(device, "device", "name");
  c.device.memory_bytes = in.field_int(device, "device", "memory_bytes");
  if (const Json* t = in.optional(device, "type")) {
    c.device.type = in.string(*t, "device.type");
    if (c.device.type != "cuda" && c.device.type != "cpu") in.fail("device.type", "must be \"cuda\" or \"cpu\"", *t);
  }
  if (const Json* f = in.optional(device, "peak_flops")) {
    c.device.peak_flops = in.number(*f, "device.peak_flops");
  }
  if (const Json* f = in.optional(device, "memory_bandwidth_bytes_per_s")) {
    c.device.memory_bandwidth_bytes_per_s = in.number(*f, "device.memory_bandwidth_bytes_per_s");
  }
  if (const Json* f = in.optional(device, "call_floor_s")) {
    c.device.call_floor_s = in.number(*f, "device.call_floor_s");
  }
  if (const Json* by_dtype = in.optional(device, "compute_speedup")) {
    in.object(*by_dtype, "device.compute_speedup");
    for (const auto& [name, value] : by_dtype->items()) {
      const std::string path = "device.compute_speedup." + name;
      const std::optional<Precision> p = precision_from_name(name);
      if (!p || *p == Precision::kFp32) in.fail(path, "must name \"bf16\" or \"fp16\"", value);
      const double x = in.number(value, path);
      if (!(x > 0)) in.fail(path, "must be > 0", value);
      c.device.compute_speedup.emplace_back(name, x);
    }
  }

  const Json& intra = in.object(in.required(j, "", "intra_node"), "intra_node");
  const Json* matrix = in.optional(intra, "bandwidth_matrix_bytes_per_s");
  c.intra_node = link_from_json(in, intra, "intra_node", matrix == nullptr);
  c.intra_node_allreduce = collective_override(in, intra, "intra_node", "allreduce");
  c.intra_node_allgather = collective_override(in, intra, "intra_node", "allgather");
  c.intra_node_reduce_scatter = collective_override(in, intra, "intra_node", "reduce_scatter");
  c.intra_node_tp_allreduce = collective_override(in, intra, "intra_node", "tp_allreduce");
  if (matrix != nullptr) {
    const std::string path = "intra_node.bandwidth_matrix_bytes_per_s";
    in.array(*matrix, path);
    for (size_t i = 0; i < matrix->size(); ++i) {
      const std::string row_path = json_index_path(path, i);
      const Json& row = in.array((*matrix)[i], row_path);
      std::vector<double> values;
      for (size_t k = 0; k < row.size(); ++k) values.push_back(in.number(row[k], json_index_path(row_path, k)));
      c.bandwidth_matrix.push_back(std::move(values));
    }
  }

  if (const Json* inter = in.optional(j, "inter_node")) {
    in.object(*inter, "inter_node");
    c.inter_node = link_from_json(in, *inter, "inter_node", true);
    c.inter_node_allreduce = collective_override(in, *inter, "inter_node", "allreduce");
    c.inter_node_allgather = collective_override(in, *inter, "inter_node", "allgather");
    c.inter_node_reduce_scatter = collective_override(in, *inter, "inter_node", "reduce_scatter");
  } else if (c.num_nodes > 1) {
    in.fail("inter_node", "is required when num_nodes > 1", std::to_string(c.num_nodes) + " nodes");
  }
  if (const Json* col = in.optional(j, "collectives")) {
    in.object(*col, "collectives");
    const Json& lib = in.required(*col, "collectives", "library");
    const std::string name = in.string(lib, "collectives.library");
    if (name == "nccl") {
      c.collectives = CollectiveLibrary::kNccl;
    } else if (name == "gloo") {
      c.collectives = CollectiveLibrary::kGloo;
    } else {
      in.fail("collectives.library", "must be \"nccl\" or \"gloo\"", lib);
    }
  }
  if (const Json* r = in.optional(j, "runtime")) c.runtime = runtime_from_json(in, *r);
  if (const Json* s = in.optional(j, "sources")) c.sources = in.array(*s, "sources");
  if (const Json* m = in.optional(j, "measured")) c.measured = *m;
  c.validate(source);
  return c;
}

Json cluster_to_json(const Cluster& c) {
  Json intra = {{"latency_s", c.intra_node.latency_s}};
  if (c.intra_node.bandwidth_bytes_per_s > 0) {
    intra["bandwidth_bytes_per_s"] = c.intra_node.bandwidth_bytes_per_s;
  }
  if (!c.bandwidth_matrix.empty()) intra["bandwidth_matrix_bytes_per_s"] = c.bandwidth_matrix;
  if (c.intra_node_allreduce) intra["allreduce"] = link_to_json(*c.intra_node_allreduce);
  if (c.intra_node_allgather) intra["allgather"] = link_to_json(*c.intra_node_allgather);
  if (c.intra_node_reduce_scatter) intra["reduce_scatter"] = link_to_json(*c.intra_node_reduce_scatter);
  if (c.intra_node_tp_allreduce) intra["tp_allreduce"] = link_to_json(*c.intra_node_tp_allreduce);
  Json device = {{"name", c.device.name},
                 {"type", c.device.type},
                 {"memory_bytes", c.device.memory_bytes},
                 {"peak_flops", c.device.peak_flops}};
  if (c.device.memory_bandwidth_bytes_per_s > 0) {
    device["memory_bandwidth_bytes_per_s"] = c.device.memory_bandwidth_bytes_per_s;
  }
  if (c.device.call_floor_s > 0) device["call_floor_s"] = c.device.call_floor_s;
  for (const auto& [name, x] : c.device.compute_speedup) device["compute_speedup"][name] = x;
  Json j = {{"schema_version", 1},
            {"kind", kClusterKind},
            {"name", c.name},
            {"num_nodes", c.num_nodes},
            {"devices_per_node", c.devices_per_node},
            {"device", std::move(device)},
            {"intra_node", std::move(intra)},
            {"collectives", {{"library", collective_library_name(c.collectives)}}},
            {"sources", c.sources}};
  if (c.inter_node.bandwidth_bytes_per_s > 0) {
    j["inter_node"] = link_to_json(c.inter_node);
    if (c.inter_node_allreduce) j["inter_node"]["allreduce"] = link_to_json(*c.inter_node_allreduce);
    if (c.inter_node_allgather) j["inter_node"]["allgather"] = link_to_json(*c.inter_node_allgather);
    if (c.inter_node_reduce_scatter) {
      j["inter_node"]["reduce_scatter"] = link_to_json(*c.inter_node_reduce_scatter);
    }
  }
  const Runtime& r = c.runtime;
  if (r.step_s > 0 || r.action_s > 0 || r.optimizer_tensor_s > 0 || r.sharded_optimizer_tensor_s > 0 ||
      r.sharded_compute_slowdown > 0 || r.selective_op_s > 0 || !r.shared_host_slowdown.empty() ||
      r.action_sample_s > 0 ||
      std::ranges::any_of(named_seconds_of(r), [](const auto& m) { return !m.second->empty(); })) {
    j["runtime"] = {{"step_s", r.step_s}, {"action_s", r.action_s},
                    {"shared_host_slowdown", r.shared_host_slowdown}};
    if (r.optimizer_tensor_s > 0) j["runtime"]["optimizer_tensor_s"] = r.optimizer_tensor_s;
    if (r.sharded_optimizer_tensor_s > 0) {
      j["runtime"]["sharded_optimizer_tensor_s"] = r.sharded_optimizer_tensor_s;
    }
    if (r.sharded_compute_slowdown > 0) {
      j["runtime"]["sharded_compute_slowdown"] = r.sharded_compute_slowdown;
    }
    if (r.selective_op_s > 0) j["runtime"]["selective_op_s"] = r.selective_op_s;
    if (r.action_sample_s > 0) j["runtime"]["action_sample_s"] = r.action_sample_s;
    for (const auto& [key, by] : named_seconds_of(r)) {
      if (by->empty()) continue;
      Json map = Json::object();
      for (const auto& [name, seconds] : *by) map[name] = seconds;
      j["runtime"][key] = std::move(map);
    }
  }
  if (!c.measured.is_null()) j["measured"] = c.measured;
  return j;
}

Cluster load_cluster(const std::string& path_or_preset) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(path_or_preset, ec)) {
    return cluster_from_json(read_json_file(path_or_preset, "cluster"), path_or_preset);
  }
  if (const std::string* text = preset_json_text(path_or_preset)) {
    const std::string source = "preset " + path_or_preset;
    return cluster_from_json(parse_json_text(*text, source), source);
  }
  std::string names;
  for (const std::string& name : preset_names()) names += (names.empty() ? "" : ", ") + name;
  throw InputError(path_or_preset + ": no such file, and not a cluster preset (presets: " +
                   names + ")");
}

}  // namespace hybridplan
