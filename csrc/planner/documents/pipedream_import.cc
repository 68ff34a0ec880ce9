#include "planner/documents/pipedream_import.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "common/error.h"

namespace hybridplan {
namespace {

// Where a parse error is reported: "<file>:<line>".
struct LineRef {
  const std::string& path;
  int64_t line_number;
  [[noreturn]] void fail(const std::string& what, const std::string& got) const {
    std::string msg = path + ":" + std::to_string(line_number) + ": " + what;
    if (!got.empty()) msg += " (got '" + got + "')";
    throw InputError(msg);
  }
};

std::string trim(const std::string& s) {
  const auto first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos) return "";
  const auto last = s.find_last_not_of(" \t\r");
  return s.substr(first, last - first + 1);
}

// Numbers are read with std::from_chars: locale-independent, no exceptions, and an overflow
// ("1e999", a 30-digit node number) is reported as bad input instead of escaping as
// std::out_of_range (an "unexpected error" in the CLI).
double parse_number(const std::string& text, const std::string& field, const LineRef& at) {
  const std::string t = trim(text);
  double value = 0;
  const char* const end = t.data() + t.size();
  const auto [stop, ec] = std::from_chars(t.data(), end, value);
  if (ec == std::errc::result_out_of_range) at.fail(field + " must be a finite number >= 0", t);
  if (ec != std::errc() || stop != end) at.fail(field + " must be a number", t);
  if (!std::isfinite(value) || value < 0) at.fail(field + " must be a finite number >= 0", t);
  return value;
}

// "123.0" or "[6291456.0; 131072.0; 131072.0]" (a node with several outputs): the total bytes.
int64_t parse_bytes(const std::string& text, const std::string& field, const LineRef& at) {
  std::string t = trim(text);
  if (!t.empty() && t.front() == '[') {
    if (t.size() < 2 || t.back() != ']') at.fail(field + " list must end with ']'", t);
    t = t.substr(1, t.size() - 2);
  }
  double total = 0;
  size_t start = 0;
  while (true) {
    const size_t end = t.find(';', start);
    total += parse_number(t.substr(start, end - start), field, at);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  // 2^53 bytes (8 PiB) is far beyond any layer and keeps the double -> int64 rounding exact;
  // a larger total (e.g. "1e300") would overflow llround.
  constexpr double kMaxBytes = 9007199254740992.0;
  if (!(total <= kMaxBytes)) at.fail(field + " must be at most 2^53 bytes", trim(text));
  return static_cast<int64_t>(std::llround(total));
}

// "nodeN" -> N (0 <= N < 2^63).
NodeId parse_node_ref(const std::string& text, const LineRef& at) {
  const std::string t = trim(text);
  const bool ok = t.size() > 4 && t.compare(0, 4, "node") == 0 &&
                  std::all_of(t.begin() + 4, t.end(), [](unsigned char c) { return std::isdigit(c); });
  if (!ok) at.fail("expected a node name 'nodeN'", t);
  NodeId id = 0;
  const char* const end = t.data() + t.size();
  const auto [stop, ec] = std::from_chars(t.data() + 4, end, id);
  if (ec != std::errc() || stop != end) at.fail("node number must fit in a 64-bit integer", t);
  return id;
}

// "Conv2d(3, 64, ...)" -> "conv2d"; "Input0" -> "input".
std::string op_of(const std::string& repr, const LineRef& at) {
  size_t n = 0;
  while (n < repr.size() && (std::isalnum(static_cast<unsigned char>(repr[n])) || repr[n] == '_')) ++n;
  if (n == 0) at.fail("module repr must start with an identifier", repr);
  std::string op = repr.substr(0, n);
  std::transform(op.begin(), op.end(), op.begin(), [](unsigned char c) { return std::tolower(c); });
  const bool is_input = op.rfind("input", 0) == 0 &&
                        std::all_of(op.begin() + 5, op.end(), [](unsigned char c) { return std::isdigit(c); });
  return is_input ? "input" : op;
}

// "nodeN -- <repr> -- forward_compute_time=..., ...": the repr may itself contain " -- " or ", ",
// so the metrics are found from the right.
Node parse_node_line(const std::string& line, const LineRef& at) {
  static const std::string kMetrics = " -- forward_compute_time=";
  const size_t metrics_at = line.rfind(kMetrics);
  if (metrics_at == std::string::npos) at.fail("node line lacks ' -- forward_compute_time='", line);
  const std::string head = line.substr(0, metrics_at);
  const size_t repr_at = head.find(" -- ");
  if (repr_at == std::string::npos) at.fail("node line must read 'nodeN -- <repr> -- ...'", line);

  Node node;
  node.id = parse_node_ref(head.substr(0, repr_at), at);
  node.name = "node" + std::to_string(node.id);
  const std::string repr = trim(head.substr(repr_at + 4));
  node.op = op_of(repr, at);

  std::map<std::string, std::string> fields;
  const std::string tail = line.substr(metrics_at + 4);  // "forward_compute_time=..., ..."
  size_t start = 0;
  while (start < tail.size()) {
    size_t end = tail.find(", ", start);
    if (end == std::string::npos) end = tail.size();
    const std::string item = tail.substr(start, end - start);
    const size_t eq = item.find('=');
    if (eq == std::string::npos) at.fail("expected key=value", item);
    fields[trim(item.substr(0, eq))] = item.substr(eq + 1);
    start = end + 2;
  }
  for (const char* key : {"forward_compute_time", "backward_compute_time", "activation_size",
                          "parameter_size"}) {
    if (!fields.count(key)) at.fail(std::string("node line lacks ") + key, line);
  }
  constexpr double kSecondsPerMs = 1e-3;
  node.forward_s = parse_number(fields["forward_compute_time"], "forward_compute_time", at) * kSecondsPerMs;
  node.backward_s = parse_number(fields["backward_compute_time"], "backward_compute_time", at) * kSecondsPerMs;
  node.output_bytes = parse_bytes(fields["activation_size"], "activation_size", at);
  node.param_bytes = parse_bytes(fields["parameter_size"], "parameter_size", at);
  if (node.op == "input") node.forward_s = node.backward_s = 0;  // data loading, not compute
  return node;
}

std::string default_name(const std::string& path) {
  const std::string file = std::filesystem::path(path).filename().string();
  return file.substr(0, file.find('.'));
}

}  // namespace

Graph import_pipedream(const std::string& path, int64_t batch_size, const std::string& name) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open PipeDream profile");
  return import_pipedream(in, path, batch_size, name.empty() ? default_name(path) : name);
}

Graph import_pipedream(std::istream& in, const std::string& path, int64_t batch_size,
                       const std::string& name) {
  if (batch_size < 1) {
    throw InputError(path + ": --batch-size must be >= 1 (got " + std::to_string(batch_size) + ")");
  }

  std::map<NodeId, Node> nodes;  // by id, so the Graph lists them in id order
  std::map<NodeId, int64_t> defined_at_line;
  std::vector<std::pair<std::pair<NodeId, NodeId>, int64_t>> edge_refs;  // (src, dst), line
  std::string line;
  int64_t line_number = 0;
  bool saw_text = false;
  while (std::getline(in, line)) {
    ++line_number;
    const LineRef at{path, line_number};
    if (trim(line).empty()) continue;
    saw_text = true;
    if (line[0] == '\t' || line[0] == ' ') {
      const std::string edge = trim(line);
      const size_t sep = edge.find(" -- ");
      if (sep == std::string::npos) at.fail("edge line must read 'nodeA -- nodeB'", edge);
      edge_refs.push_back({{parse_node_ref(edge.substr(0, sep), at),
                            parse_node_ref(edge.substr(sep + 4), at)},
                           line_number});
      continue;
    }
    Node node = parse_node_line(line, at);
    if (nodes.count(node.id)) {
      at.fail("node" + std::to_string(node.id) + " is defined twice (first on line " +
                  std::to_string(defined_at_line[node.id]) + ")", "");
    }
    defined_at_line[node.id] = line_number;
    nodes.emplace(node.id, std::move(node));
  }
  if (nodes.empty()) {
    throw InputError("PipeDream profile " + path + (saw_text ? " has no node lines (is this a PipeDream graph.txt?)" : " is empty"));
  }

  Graph g;
  g.name = name.empty() ? default_name(path) : name;
  g.profiled.device = "gpu";
  g.profiled.batch_size = batch_size;
  g.profiled.dtype = "float32";
  std::map<NodeId, NodeIndex> index_of;
  for (auto& [id, node] : nodes) {
    index_of[id] = static_cast<NodeIndex>(g.nodes.size());
    g.nodes.push_back(std::move(node));
  }
  std::set<std::pair<NodeId, NodeId>> seen;
  for (const auto& [ends, edge_line] : edge_refs) {
    const LineRef at{path, edge_line};
    for (NodeId end : {ends.first, ends.second}) {
      if (!index_of.count(end)) at.fail("edge names an undefined node", "node" + std::to_string(end));
    }
    if (!seen.insert(ends).second) {
      at.fail("duplicate edge", "node" + std::to_string(ends.first) + " -- node" + std::to_string(ends.second));
    }
    const NodeIndex src = index_of[ends.first];
    // A multi-output node's edge carries all its outputs: the profile does not say which one
    // each consumer reads, so the transfer estimate errs on the large side.
    g.edges.push_back({src, index_of[ends.second], g.nodes[src].output_bytes});
  }
  g.finalize(path);
  g.validate(path);  // cycles, names: the same rules as a graph.json
  return g;
}

}  // namespace hybridplan
