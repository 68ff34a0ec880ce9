// Graph loading, validation, canonical JSON and hashing.
//
// Validation happens in two layers with one message style: graph_from_json checks JSON
// presence and types while it builds the Graph (it must, to read the values at all), then
// Graph::validate checks every value rule (finite, >= 0, unique, in range, acyclic). Graphs
// built in code go through the same validate() via finalize(), so there is one set of rules.
#include "planner/documents/graph.h"

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "common/error.h"
#include "common/json_fields.h"
#include "common/json_io.h"
#include "common/limits.h"
#include "common/sha256.h"

namespace hybridplan {
namespace {

constexpr const char* kGraphKind = "hybridplan.graph";

std::string quoted(const std::string& s) { return Json(s).dump(); }

void check_time(const std::string& source, size_t i, const char* field, double value) {
  const std::string path = json_child_path(json_index_path("nodes", i), field);
  if (!std::isfinite(value) || value < 0) {
    throw_input_error(source, path, "must be finite and >= 0", json_number_text(value));
  }
  check_seconds_at_most(source, path, value);
}

void check_bytes(const std::string& source, const std::string& path, int64_t value) {
  if (value < 0) throw_input_error(source, path, "must be >= 0", std::to_string(value));
  check_bytes_at_most(source, path, value);
}

void validate_batch_times(const std::string& source, const std::string& node_path,
                          const std::vector<BatchTime>& points, int64_t profiled_batch) {
  for (size_t k = 0; k < points.size(); ++k) {
    const std::string path = json_index_path(node_path + ".batch_times", k);
    const BatchTime& p = points[k];
    check_batch_size(source, path + ".batch_size", p.batch_size);
    if (p.batch_size == profiled_batch) {
      throw_input_error(source, path + ".batch_size",
                        "must differ from profiled.batch_size (whose times are the node's "
                        "forward_s and backward_s)",
                        std::to_string(p.batch_size));
    }
    if (k > 0 && p.batch_size <= points[k - 1].batch_size) {
      throw_input_error(source, path + ".batch_size",
                        "must be greater than the previous entry's " +
                            std::to_string(points[k - 1].batch_size) + " (strictly increasing)",
                        std::to_string(p.batch_size));
    }
    for (const auto& [field, value] : {std::pair{"forward_s", p.forward_s}, {"backward_s", p.backward_s}}) {
      if (!std::isfinite(value) || value < 0) {
        throw_input_error(source, path + "." + field, "must be finite and >= 0",
                          json_number_text(value));
      }
      check_seconds_at_most(source, path + "." + field, value);
    }
  }
}

// Smallest node index first so that the order is reproducible. Returns fewer than n nodes when
// the edges contain a cycle.
std::vector<NodeIndex> kahn_order(size_t n, const std::vector<Edge>& edges) {
  std::vector<std::vector<NodeIndex>> succs(n), preds(n);
  for (const Edge& e : edges) {
    succs[e.src].push_back(e.dst);
    preds[e.dst].push_back(e.src);
  }
  return hybridplan::kahn_order(succs, preds, std::greater<>());
}

// A node that lies on a cycle, given that Kahn's algorithm could not order all nodes: every
// unordered node has an unordered predecessor, so walking predecessors must repeat a node, and
// the first repeated node is on a cycle.
NodeIndex node_on_cycle(size_t n, const std::vector<Edge>& edges,
                        const std::vector<NodeIndex>& partial_order) {
  std::vector<bool> ordered(n, false);
  for (NodeIndex v : partial_order) ordered[v] = true;
  std::vector<NodeIndex> unordered_pred(n, -1);
  for (const Edge& e : edges) {
    if (!ordered[e.src] && !ordered[e.dst] && unordered_pred[e.dst] < 0) {
      unordered_pred[e.dst] = e.src;
    }
  }
  NodeIndex v = 0;
  while (ordered[v]) ++v;
  std::vector<bool> seen(n, false);
  while (!seen[v]) {
    seen[v] = true;
    v = unordered_pred[v];
  }
  return v;
}

std::vector<BatchTime> batch_times_from_json(const JsonReader& in, const Json& j,
                                            const std::string& path) {
  in.array(j, path);
  std::vector<BatchTime> points;
  for (size_t k = 0; k < j.size(); ++k) {
    const std::string p = json_index_path(path, k);
    const Json& jp = in.object(j[k], p);
    points.push_back({in.field_int(jp, p, "batch_size"), in.field_number(jp, p, "forward_s"),
                      in.field_number(jp, p, "backward_s")});
  }
  return points;
}

// split_times of tensor_parallel or sequence_parallel at `path`: degrees >= 2 dividing
// max_degree, strictly increasing, times finite and >= 0.
void validate_split_times(const std::string& source, const std::string& path,
                          const std::vector<TpSplitTime>& points, int64_t max_degree) {
  for (size_t k = 0; k < points.size(); ++k) {
    const std::string p = json_index_path(path + ".split_times", k);
    const TpSplitTime& point = points[k];
    if (point.degree < 2 || point.degree > max_degree || max_degree % point.degree != 0) {
      throw_input_error(source, p + ".degree",
                        "must be >= 2 and divide max_degree = " + std::to_string(max_degree),
                        std::to_string(point.degree));
    }
    if (k > 0 && point.degree <= points[k - 1].degree) {
      throw_input_error(source, p + ".degree",
                        "must be greater than the previous entry's " +
                            std::to_string(points[k - 1].degree) + " (strictly increasing)",
                        std::to_string(point.degree));
    }
    for (const auto& [field, value] : {std::pair{"forward_s", point.forward_s}, {"backward_s", point.backward_s}}) {
      if (!std::isfinite(value) || value < 0) {
        throw_input_error(source, p + "." + field, "must be finite and >= 0", json_number_text(value));
      }
      check_seconds_at_most(source, p + "." + field, value);
    }
  }
}

// The rules of Node::tensor_parallel (docs/tensor_parallel.md "In the graph").
void validate_tensor_parallel(const std::string& source, const std::string& node_path,
                              const Node& node) {
  const TensorParallel& tp = *node.tensor_parallel;
  const std::string path = node_path + ".tensor_parallel";
  check_device_count(source, path + ".max_degree", tp.max_degree);
  if (tp.split_param_bytes < 0 || tp.split_param_bytes > node.param_bytes) {
    throw_input_error(source, path + ".split_param_bytes",
                      "must be in 0..param_bytes = 0.." + std::to_string(node.param_bytes) +
                          " (the part of the node's parameters the TP ranks divide)",
                      std::to_string(tp.split_param_bytes));
  }
  if (tp.style == TpStyle::kSharded && tp.split_param_bytes != 0) {
    throw_input_error(source, path + ".split_param_bytes",
                      "must be 0 for style \"sharded\" (it runs on slices of its inputs and splits "
                      "no parameters)",
                      std::to_string(tp.split_param_bytes));
  }
  for (const auto& [key, collective] : {std::pair{"forward_collective", &tp.forward_collective},
                                        {"backward_collective", &tp.backward_collective}}) {
    if (*collective) check_bytes(source, path + "." + key + ".bytes", (*collective)->bytes);
  }
  validate_split_times(source, path, tp.split_times, tp.max_degree);
}

// The rules of Node::sequence_parallel (docs/tensor_parallel.md "Sequence parallelism").
void validate_sequence_parallel(const std::string& source, const std::string& node_path,
                                const Node& node) {
  const SequenceParallel& sp = *node.sequence_parallel;
  const std::string path = node_path + ".sequence_parallel";
  const std::string role = std::string("\"") + sp_role_name(sp.role) + "\"";
  if (sp.max_degree < 2) {
    throw_input_error(source, path + ".max_degree",
                      "must be >= 2 (the sequence splits over at least two TP ranks)",
                      std::to_string(sp.max_degree));
  }
  check_device_count(source, path + ".max_degree", sp.max_degree);
  const bool split_role = sp.role == SpRole::kColwise || sp.role == SpRole::kRowwise;
  if (split_role && !node.tensor_parallel) {
    throw_input_error(source, path + ".role",
                      "must be \"per_token\" or \"gather\" for a node without tensor_parallel "
                      "(\"colwise\" and \"rowwise\" replace a split node's TP collectives)",
                      role);
  }
  if (split_role && node.tensor_parallel->style == TpStyle::kSharded) {
    throw_input_error(source, path + ".role",
                      "must not be \"colwise\" or \"rowwise\" for tensor_parallel style "
                      "\"sharded\" (it runs between the split nodes, inside the TP region)",
                      role);
  }
  if (!split_role && node.tensor_parallel) {
    throw_input_error(source, path + ".role",
                      "must be \"colwise\" or \"rowwise\" for a node with tensor_parallel "
                      "(\"per_token\" and \"gather\" nodes run outside the TP region)",
                      role);
  }
  for (const auto& [key, list] : {std::pair{"forward_collectives", &sp.forward_collectives},
                                  {"backward_collectives", &sp.backward_collectives}}) {
    for (size_t k = 0; k < list->size(); ++k) {
      check_bytes(source, json_index_path(path + "." + key, k) + ".bytes", (*list)[k].bytes);
    }
  }
  if (!sp.split_times.empty() && sp.role != SpRole::kPerToken) {
    throw_input_error(source, path + ".split_times",
                      "must be absent for role " + role +
                          " (only a \"per_token\" node runs on a share of the tokens)",
                      std::to_string(sp.split_times.size()) + " entries");
  }
  validate_split_times(source, path, sp.split_times, sp.max_degree);
  if (sp.saved_share) {
    if (sp.role != SpRole::kGather) {
      throw_input_error(source, path + ".saved_share",
                        "must be absent for role " + role +
                            " (only a \"gather\" node runs on inputs gathered apart)",
                        std::to_string(*sp.saved_share));
    }
    if (!std::isfinite(*sp.saved_share) || *sp.saved_share <= 0) {
      throw_input_error(source, path + ".saved_share",
                        "must be a finite number > 0 (kept activations under sequence "
                        "parallelism over those kept in one process)",
                        std::to_string(*sp.saved_share));
    }
  }
}

TpCollective tp_collective_from_json(const JsonReader& in, const Json& j, const std::string& path) {
  in.object(j, path);
  TpCollective c;
  const Json& op = in.required(j, path, "op");
  const std::optional<Collective> kind = tp_collective_from_name(in.string(op, path + ".op"));
  if (!kind) in.fail(path + ".op", "must be \"all_reduce\", \"all_gather\" or \"reduce_scatter\"", op);
  c.op = *kind;
  c.bytes = in.field_int(j, path, "bytes");
  if (const Json* fixed = in.optional(j, "fixed_bytes")) c.fixed_bytes = in.boolean(*fixed, path + ".fixed_bytes");
  return c;
}

std::vector<TpSplitTime> split_times_from_json(const JsonReader& in, const Json& j,
                                               const std::string& path) {
  in.array(j, path);
  std::vector<TpSplitTime> points;
  for (size_t k = 0; k < j.size(); ++k) {
    const std::string p = json_index_path(path, k);
    const Json& jp = in.object(j[k], p);
    points.push_back({in.field_int(jp, p, "degree"), in.field_number(jp, p, "forward_s"),
                      in.field_number(jp, p, "backward_s")});
  }
  return points;
}

Json split_times_to_json(const std::vector<TpSplitTime>& points) {
  Json out = Json::array();
  for (const TpSplitTime& p : points) {
    out.push_back({{"degree", p.degree}, {"forward_s", p.forward_s}, {"backward_s", p.backward_s}});
  }
  return out;
}

Json tp_collective_to_json(const TpCollective& c) {
  Json j = {{"op", tp_collective_name(c.op)}, {"bytes", c.bytes}};
  if (c.fixed_bytes) j["fixed_bytes"] = true;  // absent: scaled with the batch
  return j;
}

TensorParallel tensor_parallel_from_json(const JsonReader& in, const Json& j, const std::string& path) {
  in.object(j, path);
  TensorParallel tp;
  const Json& style = in.required(j, path, "style");
  const std::optional<TpStyle> kind = tp_style_from_name(in.string(style, path + ".style"));
  if (!kind) {
    in.fail(path + ".style",
            "must be \"colwise\", \"rowwise\", \"sharded\", \"vocab_rowwise\" or \"colwise_gather\"",
            style);
  }
  tp.style = *kind;
  tp.max_degree = in.field_int(j, path, "max_degree");
  tp.split_param_bytes = in.field_int(j, path, "split_param_bytes");
  tp.activation_split = in.boolean(in.required(j, path, "activation_split"), path + ".activation_split");
  if (const Json* c = in.optional(j, "forward_collective")) {
    tp.forward_collective = tp_collective_from_json(in, *c, path + ".forward_collective");
  }
  if (const Json* c = in.optional(j, "backward_collective")) {
    tp.backward_collective = tp_collective_from_json(in, *c, path + ".backward_collective");
  }
  if (const Json* times = in.optional(j, "split_times")) {
    tp.split_times = split_times_from_json(in, *times, path + ".split_times");
  }
  return tp;
}

Json tensor_parallel_to_json(const TensorParallel& tp) {
  Json j = {{"style", tp_style_name(tp.style)},
            {"max_degree", tp.max_degree},
            {"split_param_bytes", tp.split_param_bytes},
            {"activation_split", tp.activation_split}};
  if (tp.forward_collective) {
    j["forward_collective"] = tp_collective_to_json(*tp.forward_collective);
  }
  if (tp.backward_collective) {
    j["backward_collective"] = tp_collective_to_json(*tp.backward_collective);
  }
  if (!tp.split_times.empty()) j["split_times"] = split_times_to_json(tp.split_times);
  return j;
}

SequenceParallel sequence_parallel_from_json(const JsonReader& in, const Json& j,
                                             const std::string& path) {
  in.object(j, path);
  SequenceParallel sp;
  const Json& role = in.required(j, path, "role");
  const std::optional<SpRole> kind = sp_role_from_name(in.string(role, path + ".role"));
  if (!kind) in.fail(path + ".role", "must be \"per_token\", \"gather\", \"colwise\" or \"rowwise\"", role);
  sp.role = *kind;
  sp.max_degree = in.field_int(j, path, "max_degree");
  for (const auto& [key, list] : {std::pair{"forward_collectives", &sp.forward_collectives},
                                  {"backward_collectives", &sp.backward_collectives}}) {
    if (const Json* c = in.optional(j, key)) {
      const std::string list_path = path + "." + key;
      in.array(*c, list_path);
      for (size_t k = 0; k < c->size(); ++k) {
        list->push_back(tp_collective_from_json(in, (*c)[k], json_index_path(list_path, k)));
      }
    }
  }
  if (const Json* times = in.optional(j, "split_times")) {
    sp.split_times = split_times_from_json(in, *times, path + ".split_times");
  }
  if (const Json* share = in.optional(j, "saved_share")) {
    sp.saved_share = in.number(*share, path + ".saved_share");
  }
  return sp;
}

// Canonical: the collective lists always (empty when none), split_times when measured.
Json sequence_parallel_to_json(const SequenceParallel& sp) {
  Json j = {{"role", sp_role_name(sp.role)}, {"max_degree", sp.max_degree}};
  for (const auto& [key, list] : {std::pair{"forward_collectives", &sp.forward_collectives},
                                  {"backward_collectives", &sp.backward_collectives}}) {
    Json out = Json::array();
    for (const TpCollective& c : *list) out.push_back(tp_collective_to_json(c));
    j[key] = std::move(out);
  }
  if (!sp.split_times.empty()) j["split_times"] = split_times_to_json(sp.split_times);
  if (sp.saved_share) j["saved_share"] = *sp.saved_share;
  return j;
}

// AutocastBytes from its JSON object {"bf16": n, "fp16": n} (each key optional, n >= 0).
AutocastBytes autocast_bytes_from_json(const JsonReader& in, const Json& v, const std::string& path) {
  in.object(v, path);
  AutocastBytes out;
  for (const auto& [key, value] : v.items()) {
    const std::string at = json_child_path(path, key);
    const std::optional<Precision> p = precision_from_name(key);
    if (!p || *p == Precision::kFp32) in.fail(at, "must be \"bf16\" or \"fp16\" (a 16-bit precision)", Json(key));
    const int64_t bytes = in.integer(value, at);
    if (bytes < 0) in.fail(at, "must be >= 0", value);
    (*p == Precision::kBf16 ? out.bf16 : out.fp16) = bytes;
  }
  return out;
}

Json autocast_bytes_to_json(const AutocastBytes& b) {
  Json out = Json::object();
  if (b.bf16 >= 0) out["bf16"] = b.bf16;
  if (b.fp16 >= 0) out["fp16"] = b.fp16;
  return out;
}

// The autocast recordings measure a float32 profile again (graph.h AutocastBytes): a node's
// saved bytes with its saved_bytes, its weight copies with its saved bytes, in the same dtypes.
void validate_autocast(const std::string& source, const Graph& g) {
  const bool float32 = g.profiled.dtype == "float32";
  if (g.profiled.autocast_loss_backward_bytes.any()) {
    if (!float32) {
      throw_input_error(source, "profiled.autocast_loss_backward_bytes",
                        "is measured on a float32 profile only (profiled.dtype is " +
                            quoted(g.profiled.dtype) + ")",
                        "present");
    }
    if (g.profiled.loss_backward_bytes <= 0) {
      throw_input_error(source, "profiled.autocast_loss_backward_bytes",
                        "must be given with profiled.loss_backward_bytes", "present");
    }
  }
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const std::string path = json_index_path("nodes", i);
    if (n.autocast_saved_bytes.any()) {
      if (!float32) {
        throw_input_error(source, path + ".autocast_saved_bytes",
                          "is measured on a float32 profile only (profiled.dtype is " +
                              quoted(g.profiled.dtype) + ")",
                          "present");
      }
      if (n.saved_bytes < 0) {
        throw_input_error(source, path + ".autocast_saved_bytes", "must be given with saved_bytes",
                          "present");
      }
    }
    for (Precision p : {Precision::kBf16, Precision::kFp16}) {
      if (n.autocast_weight_copy_bytes.of(p) >= 0 && n.autocast_saved_bytes.of(p) < 0) {
        throw_input_error(source, path + ".autocast_weight_copy_bytes." + precision_name(p),
                          std::string("must be given with autocast_saved_bytes.") + precision_name(p),
                          std::to_string(n.autocast_weight_copy_bytes.of(p)));
      }
    }
  }
}

}  // namespace

const char* tp_style_name(TpStyle style) {
  switch (style) {
    case TpStyle::kColwise: return "colwise";
    case TpStyle::kRowwise: return "rowwise";
    case TpStyle::kSharded: return "sharded";
    case TpStyle::kVocabRowwise: return "vocab_rowwise";
    case TpStyle::kColwiseGather: return "colwise_gather";
  }
  return "colwise";
}

std::optional<TpStyle> tp_style_from_name(const std::string& name) {
  for (TpStyle s : {TpStyle::kColwise, TpStyle::kRowwise, TpStyle::kSharded, TpStyle::kVocabRowwise,
                    TpStyle::kColwiseGather}) {
    if (name == tp_style_name(s)) return s;
  }
  return std::nullopt;
}

const char* sp_role_name(SpRole role) {
  switch (role) {
    case SpRole::kPerToken: return "per_token";
    case SpRole::kGather: return "gather";
    case SpRole::kColwise: return "colwise";
    case SpRole::kRowwise: return "rowwise";
  }
  return "per_token";
}

std::optional<SpRole> sp_role_from_name(const std::string& name) {
  for (SpRole r : {SpRole::kPerToken, SpRole::kGather, SpRole::kColwise, SpRole::kRowwise}) {
    if (name == sp_role_name(r)) return r;
  }
  return std::nullopt;
}

const char* tp_collective_name(Collective op) {
  switch (op) {
    case Collective::kAllReduce: return "all_reduce";
    case Collective::kAllGather: return "all_gather";
    case Collective::kReduceScatter: return "reduce_scatter";
  }
  return "all_reduce";
}

std::optional<Collective> tp_collective_from_name(const std::string& name) {
  for (Collective c : {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter}) {
    if (name == tp_collective_name(c)) return c;
  }
  return std::nullopt;
}

std::optional<int64_t> dtype_bytes(const std::string& dtype) {
  static const std::pair<const char*, int64_t> kKnown[] = {
      {"float64", 8}, {"double", 8}, {"float32", 4}, {"float", 4},   {"float16", 2},
      {"half", 2},    {"bfloat16", 2}, {"float8_e4m3fn", 1}, {"float8_e5m2", 1}};
  for (const auto& [name, bytes] : kKnown) {
    if (dtype == name) return bytes;
  }
  // "<bits>-bit" (graphs built from a model config with another element size)
  const size_t dash = dtype.find("-bit");
  if (dash != std::string::npos && dash > 0 && dash <= 2 && dash + 4 == dtype.size() &&
      dtype.find_first_not_of("0123456789") == dash) {
    const int64_t bits = std::stoll(dtype.substr(0, dash));
    if (bits > 0 && bits % 8 == 0 && bits <= 64) return bits / 8;
  }
  return std::nullopt;
}

bool Graph::has_tensor_parallel() const {
  for (const Node& node : nodes) {
    if (node.tensor_parallel) return true;
  }
  return false;
}

bool Graph::has_sequence_parallel() const {
  for (const Node& node : nodes) {
    if (node.sequence_parallel) return true;
  }
  return false;
}

void Graph::validate(const std::string& source) const {
  if (name.empty()) throw_input_error(source, "name", "must be a non-empty string", "\"\"");
  check_batch_size(source, "profiled.batch_size", profiled.batch_size);
  if (nodes.empty()) throw_input_error(source, "nodes", "must list at least one node", "[]");
  std::unordered_map<NodeId, size_t> id_at;
  std::unordered_map<std::string, size_t> name_at;
  check_bytes(source, "profiled.input_bytes", profiled.input_bytes);
  check_bytes(source, "profiled.loss_backward_bytes", profiled.loss_backward_bytes);
  validate_autocast(source, *this);
  if (profiled.min_batch_size < 1 || profiled.min_batch_size > profiled.batch_size) {
    throw_input_error(source, "profiled.min_batch_size",
                      "must be >= 1 and <= profiled.batch_size = " + std::to_string(profiled.batch_size) +
                          " (the smallest batch the model accepts; it ran at the profiled one)",
                      std::to_string(profiled.min_batch_size));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& node = nodes[i];
    const std::string path = json_index_path("nodes", i);
    if (!id_at.emplace(node.id, i).second) {
      throw_input_error(source, path + ".id",
                        "must be unique (also nodes[" + std::to_string(id_at[node.id]) + "])",
                        std::to_string(node.id));
    }
    if (node.name.empty()) throw_input_error(source, path + ".name", "must be non-empty", "\"\"");
    if (!name_at.emplace(node.name, i).second) {
      throw_input_error(source, path + ".name",
                        "must be unique (also nodes[" + std::to_string(name_at[node.name]) + "])",
                        quoted(node.name));
    }
    check_time(source, i, "forward_s", node.forward_s);
    check_time(source, i, "backward_s", node.backward_s);
    check_bytes(source, path + ".param_bytes", node.param_bytes);
    check_bytes(source, path + ".output_bytes", node.output_bytes);
    if (node.saved_bytes < -1) check_bytes(source, path + ".saved_bytes", node.saved_bytes);
    if (node.param_tensors < -1) {
      throw_input_error(source, path + ".param_tensors", "must be >= 0", std::to_string(node.param_tensors));
    }
    if (!std::isfinite(node.flops) || node.flops < 0) {
      throw_input_error(source, path + ".flops", "must be finite and >= 0",
                        json_number_text(node.flops));
    }
    validate_batch_times(source, path, node.batch_times, profiled.batch_size);
    if (node.tensor_parallel) validate_tensor_parallel(source, path, node);
    if (node.sequence_parallel) validate_sequence_parallel(source, path, node);
  }
  for (size_t t = 0; t < tied_params.size(); ++t) {
    const std::string path = json_index_path("tied_params", t);
    const TiedParams& tied = tied_params[t];
    if (tied.nodes.size() < 2) {
      throw_input_error(source, path + ".nodes", "must name at least two nodes that share the parameter",
                        std::to_string(tied.nodes.size()) + " nodes");
    }
    std::set<NodeIndex> seen;
    for (NodeIndex v : tied.nodes) {
      if (v < 0 || v >= static_cast<NodeIndex>(nodes.size())) {
        throw_input_error(source, path + ".nodes", "names no node (node index)", std::to_string(v));
      }
      if (!seen.insert(v).second) {
        throw_input_error(source, path + ".nodes", "must name each node once", quoted(nodes[v].name));
      }
    }
    check_bytes(source, path + ".bytes", tied.bytes);
  }
  // Totals, so that any device's or stage's sum (times the optimizer's copies) fits int64.
  int64_t total_param_bytes = 0, total_output_bytes = 0;
  for (const Node& node : nodes) {
    total_param_bytes += node.param_bytes;   // each <= 2^50 (checked above): no overflow
    total_output_bytes += node.output_bytes;
    check_bytes_at_most(source, "the nodes' total param_bytes", total_param_bytes);
    check_bytes_at_most(source, "the nodes' total output_bytes", total_output_bytes);
  }
  for (const TiedParams& tied : tied_params) {
    for (size_t copy = 0; copy < tied.nodes.size(); ++copy) {  // a copy per stage, at most
      total_param_bytes += tied.bytes;
      check_bytes_at_most(source, "the nodes' total param_bytes with tied_params copies", total_param_bytes);
    }
  }
  if (!pipeline_split.supported && pipeline_split.reason.empty()) {
    throw_input_error(source, "pipeline_split.reason",
                      "must say why the model cannot be split when supported is false", "\"\"");
  }
  const auto n = static_cast<NodeIndex>(nodes.size());
  std::set<std::pair<NodeIndex, NodeIndex>> seen_edges;
  for (size_t k = 0; k < edges.size(); ++k) {
    const Edge& e = edges[k];
    const std::string path = json_index_path("edges", k);
    if (e.src < 0 || e.src >= n) {
      throw_input_error(source, path + ".src", "names no node (node index)", std::to_string(e.src));
    }
    if (e.dst < 0 || e.dst >= n) {
      throw_input_error(source, path + ".dst", "names no node (node index)", std::to_string(e.dst));
    }
    if (e.src == e.dst) {
      throw_input_error(source, path, "must not be a self loop",
                        "node " + std::to_string(nodes[e.src].id));
    }
    if (!seen_edges.emplace(e.src, e.dst).second) {
      throw_input_error(source, path, "duplicates an earlier edge",
                        std::to_string(nodes[e.src].id) + " -> " + std::to_string(nodes[e.dst].id));
    }
    check_bytes(source, path + ".bytes", e.bytes);
  }
  const std::vector<NodeIndex> order = kahn_order(nodes.size(), edges);
  if (order.size() != nodes.size()) {
    const NodeIndex v = node_on_cycle(nodes.size(), edges, order);
    throw InputError(source + ": edges form a cycle through nodes[" + std::to_string(v) + "] " +
                     quoted(nodes[v].name));
  }
}

void Graph::finalize(const std::string& source) {
  validate(source);
  const size_t n = nodes.size();
  preds.assign(n, {});
  succs.assign(n, {});
  in_edges.assign(n, {});
  out_edges.assign(n, {});
  for (size_t k = 0; k < edges.size(); ++k) {
    const Edge& e = edges[k];
    preds[e.dst].push_back(e.src);
    succs[e.src].push_back(e.dst);
    in_edges[e.dst].push_back(static_cast<int32_t>(k));
    out_edges[e.src].push_back(static_cast<int32_t>(k));
  }
  topo_order = kahn_order(n, edges);
}

Graph graph_from_json(const Json& j, const std::string& source) {
  const JsonReader in(source);
  in.header(j, kGraphKind);
  Graph g;
  g.name = in.field_string(j, "", "name");
  const Json& profiled = in.object(in.required(j, "", "profiled"), "profiled");
  g.profiled.batch_size = in.field_int(profiled, "profiled", "batch_size");
  if (const Json* d = in.optional(profiled, "device")) g.profiled.device = in.string(*d, "profiled.device");
  if (const Json* d = in.optional(profiled, "dtype")) g.profiled.dtype = in.string(*d, "profiled.dtype");
  if (const Json* b = in.optional(profiled, "input_bytes")) {
    g.profiled.input_bytes = in.integer(*b, "profiled.input_bytes");
  }
  if (const Json* b = in.optional(profiled, "loss_backward_bytes")) {
    g.profiled.loss_backward_bytes = in.integer(*b, "profiled.loss_backward_bytes");
  }
  if (const Json* b = in.optional(profiled, "min_batch_size")) {
    g.profiled.min_batch_size = in.integer(*b, "profiled.min_batch_size");
  }
  if (const Json* b = in.optional(profiled, "autocast_loss_backward_bytes")) {
    g.profiled.autocast_loss_backward_bytes =
        autocast_bytes_from_json(in, *b, "profiled.autocast_loss_backward_bytes");
  }

  if (const Json* split = in.optional(j, "pipeline_split")) {
    in.object(*split, "pipeline_split");
    g.pipeline_split.supported = in.boolean(in.required(*split, "pipeline_split", "supported"),
                                            "pipeline_split.supported");
    if (const Json* r = in.optional(*split, "reason")) {
      g.pipeline_split.reason = in.string(*r, "pipeline_split.reason");
    }
  }
  const Json& nodes = in.array(in.required(j, "", "nodes"), "nodes");
  g.nodes.reserve(nodes.size());
  std::unordered_map<NodeId, NodeIndex> index_of;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string path = json_index_path("nodes", i);
    const Json& jn = in.object(nodes[i], path);
    Node node;
    node.id = in.field_int(jn, path, "id");
    node.name = in.field_string(jn, path, "name");
    node.op = in.field_string(jn, path, "op");
    node.forward_s = in.field_number(jn, path, "forward_s");
    node.backward_s = in.field_number(jn, path, "backward_s");
    node.param_bytes = in.field_int(jn, path, "param_bytes");
    node.output_bytes = in.field_int(jn, path, "output_bytes");
    if (const Json* f = in.optional(jn, "flops")) node.flops = in.number(*f, path + ".flops");
    if (const Json* b = in.optional(jn, "saved_bytes")) {
      node.saved_bytes = in.integer(*b, path + ".saved_bytes");
      if (node.saved_bytes < 0) in.fail(path + ".saved_bytes", "must be >= 0", *b);
    }
    if (const Json* b = in.optional(jn, "autocast_saved_bytes")) {
      node.autocast_saved_bytes = autocast_bytes_from_json(in, *b, path + ".autocast_saved_bytes");
    }
    if (const Json* b = in.optional(jn, "autocast_weight_copy_bytes")) {
      node.autocast_weight_copy_bytes =
          autocast_bytes_from_json(in, *b, path + ".autocast_weight_copy_bytes");
    }
    if (const Json* w = in.optional(jn, "backward_workspace_bytes")) {
      node.backward_workspace_bytes = in.integer(*w, path + ".backward_workspace_bytes");
      if (node.backward_workspace_bytes < 0) in.fail(path + ".backward_workspace_bytes", "must be >= 0", *w);
    }
    if (const Json* h = in.optional(jn, "split_held_bytes")) {
      node.split_held_bytes = in.integer(*h, path + ".split_held_bytes");
      if (node.split_held_bytes < 0) in.fail(path + ".split_held_bytes", "must be >= 0", *h);
    }
    if (const Json* x = in.optional(jn, "split_backward_extra_s")) {
      node.split_backward_extra_s = in.number(*x, path + ".split_backward_extra_s");
      if (!(node.split_backward_extra_s >= 0)) in.fail(path + ".split_backward_extra_s", "must be >= 0", *x);
    }
    if (const Json* f = in.optional(jn, "weight_backward_fraction")) {
      node.weight_backward_fraction = in.number(*f, path + ".weight_backward_fraction");
      if (!(node.weight_backward_fraction >= 0 && node.weight_backward_fraction <= 1)) {
        in.fail(path + ".weight_backward_fraction", "must be in [0, 1]", *f);
      }
    }
    const Json* kept = in.optional(jn, "selective_saved_bytes");
    const Json* again = in.optional(jn, "selective_recompute_fraction");
    if ((kept == nullptr) != (again == nullptr)) {
      in.fail(path + (kept ? ".selective_recompute_fraction" : ".selective_saved_bytes"),
              "must be given with " + std::string(kept ? "selective_saved_bytes"
                                                       : "selective_recompute_fraction"),
              Json(nullptr));
    }
    if (kept != nullptr) {
      node.selective_saved_bytes = in.integer(*kept, path + ".selective_saved_bytes");
      if (node.selective_saved_bytes < 0) in.fail(path + ".selective_saved_bytes", "must be >= 0", *kept);
      node.selective_recompute_fraction = in.number(*again, path + ".selective_recompute_fraction");
      if (!(node.selective_recompute_fraction >= 0 && node.selective_recompute_fraction <= 1)) {
        in.fail(path + ".selective_recompute_fraction", "must be in [0, 1]", *again);
      }
    }
    if (const Json* c = in.optional(jn, "compile_speedup")) {
      const std::string cpath = path + ".compile_speedup";
      in.object(*c, cpath);
      for (const auto& [key, out] : {std::pair<const char*, double*>{"forward", &node.compile_forward_speedup},
                                     {"backward", &node.compile_backward_speedup}}) {
        const Json& v = in.required(*c, cpath, key);
        *out = in.number(v, json_child_path(cpath, key));
        if (!(std::isfinite(*out) && *out > 0)) {
          in.fail(json_child_path(cpath, key), "must be finite and > 0 (eager time / compiled time)", v);
        }
      }
    }
    if (const Json* ops = in.optional(jn, "selective_ops")) {
      node.selective_ops = in.integer(*ops, path + ".selective_ops");
      if (node.selective_ops < 0) in.fail(path + ".selective_ops", "must be >= 0", *ops);
    }
    if (const Json* t = in.optional(jn, "param_tensors")) {
      node.param_tensors = in.integer(*t, path + ".param_tensors");
      if (node.param_tensors < 0) in.fail(path + ".param_tensors", "must be >= 0", *t);
    }
    if (const Json* bt = in.optional(jn, "batch_times")) {
      node.batch_times = batch_times_from_json(in, *bt, path + ".batch_times");
    }
    if (const Json* c = in.optional(jn, "cut_before")) node.cut_before = in.boolean(*c, path + ".cut_before");
    if (const Json* t = in.optional(jn, "tensor_parallel")) {
      node.tensor_parallel = tensor_parallel_from_json(in, *t, path + ".tensor_parallel");
    }
    if (const Json* sp = in.optional(jn, "sequence_parallel")) {
      node.sequence_parallel = sequence_parallel_from_json(in, *sp, path + ".sequence_parallel");
    }
    const auto [it, fresh] = index_of.emplace(node.id, static_cast<NodeIndex>(i));
    if (!fresh) {
      in.fail(path + ".id", "must be unique (also nodes[" + std::to_string(it->second) + "])",
              std::to_string(node.id));
    }
    g.nodes.push_back(std::move(node));
  }

  if (const Json* tied = in.optional(j, "tied_params")) {
    in.array(*tied, "tied_params");
    for (size_t t = 0; t < tied->size(); ++t) {
      const std::string path = json_index_path("tied_params", t);
      const Json& jt = in.object((*tied)[t], path);
      TiedParams params;
      const Json& ids = in.array(in.required(jt, path, "nodes"), path + ".nodes");
      for (size_t k = 0; k < ids.size(); ++k) {
        const NodeId id = in.integer(ids[k], json_index_path(path + ".nodes", k));
        const auto it = index_of.find(id);
        if (it == index_of.end()) in.fail(json_index_path(path + ".nodes", k), "names no node", std::to_string(id));
        params.nodes.push_back(it->second);
      }
      params.bytes = in.field_int(jt, path, "bytes");
      g.tied_params.push_back(std::move(params));
    }
  }
  const Json& edges = in.array(in.required(j, "", "edges"), "edges");
  g.edges.reserve(edges.size());
  for (size_t k = 0; k < edges.size(); ++k) {
    const std::string path = json_index_path("edges", k);
    const Json& je = in.object(edges[k], path);
    Edge e;
    const NodeId src = in.field_int(je, path, "src");
    const NodeId dst = in.field_int(je, path, "dst");
    const auto src_it = index_of.find(src);
    if (src_it == index_of.end()) in.fail(path + ".src", "names no node", std::to_string(src));
    const auto dst_it = index_of.find(dst);
    if (dst_it == index_of.end()) in.fail(path + ".dst", "names no node", std::to_string(dst));
    e.src = src_it->second;
    e.dst = dst_it->second;
    const Json* bytes = in.optional(je, "bytes");
    e.bytes = bytes ? in.integer(*bytes, path + ".bytes") : g.nodes[e.src].output_bytes;
    g.edges.push_back(e);
  }
  g.finalize(source);
  return g;
}

Json graph_to_json(const Graph& g) {
  Json nodes = Json::array();
  for (const Node& n : g.nodes) {
    Json jn = {{"id", n.id},
               {"name", n.name},
               {"op", n.op},
               {"forward_s", n.forward_s},
               {"backward_s", n.backward_s},
               {"param_bytes", n.param_bytes},
               {"output_bytes", n.output_bytes}};
    if (n.flops > 0) jn["flops"] = n.flops;
    if (n.saved_bytes >= 0) jn["saved_bytes"] = n.saved_bytes;
    if (n.autocast_saved_bytes.any()) jn["autocast_saved_bytes"] = autocast_bytes_to_json(n.autocast_saved_bytes);
    if (n.autocast_weight_copy_bytes.any()) {
      jn["autocast_weight_copy_bytes"] = autocast_bytes_to_json(n.autocast_weight_copy_bytes);
    }
    if (n.backward_workspace_bytes >= 0) jn["backward_workspace_bytes"] = n.backward_workspace_bytes;
    if (n.weight_backward_fraction >= 0) jn["weight_backward_fraction"] = n.weight_backward_fraction;
    if (n.split_backward_extra_s >= 0) jn["split_backward_extra_s"] = n.split_backward_extra_s;
    if (n.split_held_bytes >= 0) jn["split_held_bytes"] = n.split_held_bytes;
    if (n.has_selective()) {
      jn["selective_saved_bytes"] = n.selective_saved_bytes;
      jn["selective_recompute_fraction"] = n.selective_recompute_fraction;
    }
    if (n.has_compile_speedup()) {
      jn["compile_speedup"] = {{"forward", n.compile_forward_speedup},
                               {"backward", n.compile_backward_speedup}};
    }
    if (n.selective_ops >= 0) jn["selective_ops"] = n.selective_ops;
    if (n.param_tensors >= 0) jn["param_tensors"] = n.param_tensors;
    if (!n.batch_times.empty()) {
      Json points = Json::array();
      for (const BatchTime& p : n.batch_times) {
        points.push_back({{"batch_size", p.batch_size}, {"forward_s", p.forward_s},
                          {"backward_s", p.backward_s}});
      }
      jn["batch_times"] = std::move(points);
    }
    if (!n.cut_before) jn["cut_before"] = false;
    // absent when not set, so graphs without tensor parallelism keep their hash
    if (n.tensor_parallel) jn["tensor_parallel"] = tensor_parallel_to_json(*n.tensor_parallel);
    if (n.sequence_parallel) jn["sequence_parallel"] = sequence_parallel_to_json(*n.sequence_parallel);
    nodes.push_back(std::move(jn));
  }
  Json edges = Json::array();
  for (const Edge& e : g.edges) {
    edges.push_back({{"src", g.nodes[e.src].id}, {"dst", g.nodes[e.dst].id}, {"bytes", e.bytes}});
  }
  Json j = {{"schema_version", 1},
            {"kind", kGraphKind},
            {"name", g.name},
            {"profiled",
             {{"device", g.profiled.device},
              {"batch_size", g.profiled.batch_size},
              {"dtype", g.profiled.dtype}}},
            {"nodes", std::move(nodes)},
            {"edges", std::move(edges)}};
  // Written only when known, so graphs without it keep their hash.
  if (g.profiled.input_bytes > 0) j["profiled"]["input_bytes"] = g.profiled.input_bytes;
  if (g.profiled.loss_backward_bytes > 0) {
    j["profiled"]["loss_backward_bytes"] = g.profiled.loss_backward_bytes;
  }
  if (g.profiled.min_batch_size > 1) j["profiled"]["min_batch_size"] = g.profiled.min_batch_size;
  if (g.profiled.autocast_loss_backward_bytes.any()) {
    j["profiled"]["autocast_loss_backward_bytes"] =
        autocast_bytes_to_json(g.profiled.autocast_loss_backward_bytes);
  }
  // Written only when they say something, so graphs without them keep their hash.
  if (!g.pipeline_split.supported) {
    j["pipeline_split"] = {{"supported", false}, {"reason", g.pipeline_split.reason}};
  }
  if (!g.tied_params.empty()) {
    Json tied = Json::array();
    for (const TiedParams& t : g.tied_params) {
      Json ids = Json::array();
      for (NodeIndex v : t.nodes) ids.push_back(g.nodes[v].id);
      tied.push_back({{"nodes", std::move(ids)}, {"bytes", t.bytes}});
    }
    j["tied_params"] = std::move(tied);
  }
  return j;
}

Graph load_graph(const std::string& path) {
  return graph_from_json(read_json_file(path, "graph"), path);
}

void save_graph(const Graph& g, const std::string& path) {
  write_json_file(path, graph_to_json(g));
}

std::string graph_sha256(const Graph& g) { return sha256_hex(graph_to_json(g).dump()); }

}  // namespace hybridplan
