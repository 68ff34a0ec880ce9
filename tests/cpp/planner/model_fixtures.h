// Small builders for planner tests: graphs, clusters and plans written in code, a scratch
// directory for files, and the message of the InputError an expression throws.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <unistd.h>
#include <vector>

#include "catch.h"
#include "common/error.h"
#include "planner/documents/cluster.h"
#include "planner/documents/graph.h"
#include "planner/documents/plan.h"

#if __has_include(<catch2/catch_all.hpp>)
using Catch::Approx;  // Catch2 v3; v2 declares ::Approx
#endif

namespace hybridplan::test {

struct NodeSpec {
  std::string name;
  double forward_s = 0;
  double backward_s = 0;
  int64_t param_bytes = 0;
  int64_t output_bytes = 0;
};

struct EdgeSpec {
  NodeIndex src = 0;
  NodeIndex dst = 0;
  int64_t bytes = 0;
};

// Node ids are 0..n-1 in the given order.
inline Graph make_graph(const std::vector<NodeSpec>& nodes, const std::vector<EdgeSpec>& edges,
                        int64_t profiled_batch = 1, const std::string& name = "g") {
  Graph g;
  g.name = name;
  g.profiled.device = "cpu";
  g.profiled.batch_size = profiled_batch;
  for (size_t i = 0; i < nodes.size(); ++i) {
    Node n;
    n.id = static_cast<NodeId>(i);
    n.name = nodes[i].name;
    n.op = "test";
    n.forward_s = nodes[i].forward_s;
    n.backward_s = nodes[i].backward_s;
    n.param_bytes = nodes[i].param_bytes;
    n.output_bytes = nodes[i].output_bytes;
    g.nodes.push_back(n);
  }
  for (const EdgeSpec& e : edges) g.edges.push_back({e.src, e.dst, e.bytes});
  g.finalize("test graph");
  return g;
}

// One link type inside nodes, another across; memory per device.
inline Cluster make_cluster(int64_t num_nodes, int64_t devices_per_node,
                            double intra_bytes_per_s = 1e9, double intra_latency_s = 0,
                            double inter_bytes_per_s = 1e8, double inter_latency_s = 0,
                            int64_t memory_bytes = int64_t{1} << 40) {
  Cluster c;
  c.name = "test-cluster";
  c.num_nodes = num_nodes;
  c.devices_per_node = devices_per_node;
  c.device.name = "test-device";
  c.device.memory_bytes = memory_bytes;
  c.device.peak_flops = 1e12;
  c.intra_node = {intra_bytes_per_s, intra_latency_s};
  c.inter_node = {inter_bytes_per_s, inter_latency_s};
  c.validate("test cluster");
  return c;
}

// A plan for `graph`: mesh rows are consecutive devices (replica r owns r*mp .. r*mp+mp-1).
inline Plan make_plan(const Graph& graph, const Cluster& cluster, int64_t dp, int64_t mp,
                      MpMode mode, int64_t per_replica_batch, std::vector<int32_t> assignment,
                      int64_t num_microbatches = 1, Schedule schedule = Schedule::kNone) {
  Plan p;
  p.graph_name = graph.name;
  p.graph_sha256 = graph_sha256(graph);
  p.cluster_name = cluster.name;
  p.world_size = dp * mp;
  p.dp = dp;
  p.mp = mp;
  p.mode = mode;
  p.per_replica_batch = per_replica_batch;
  p.global_batch = dp * per_replica_batch;
  p.num_microbatches = num_microbatches;
  p.schedule = schedule;
  for (int64_t r = 0; r < dp; ++r) {
    std::vector<DeviceIndex> row;
    for (int64_t k = 0; k < mp; ++k) row.push_back(r * mp + k);
    p.mesh.push_back(row);
  }
  p.assignment = std::move(assignment);
  return p;
}

// The diamond a -> {b, c} -> d of test_placement_simulation.cc: forward 1, 2, 3, 1 s and
// backward 2, 4, 6, 2 s at the profiled batch 1; parameters a = 100, c = 200 bytes; outputs
// a = b = d = 100, c = 40 bytes; every edge carries 100 bytes.
inline Graph diamond_graph() {
  return make_graph({{"a", 1, 2, 100, 100}, {"b", 2, 4, 0, 100}, {"c", 3, 6, 200, 40},
                     {"d", 1, 2, 0, 100}},
                    {{0, 1, 100}, {0, 2, 100}, {1, 3, 100}, {2, 3, 100}}, 1, "diamond");
}

// A fresh directory per test process under the system temp directory.
// A node's tensor_parallel object: its style, max degree, split parameter bytes and whether
// its kept activations divide by the degree (no collectives, no split times).
inline TensorParallel tp_split(TpStyle style, int64_t max_degree, int64_t split_param_bytes,
                               bool activation_split) {
  TensorParallel tp;
  tp.style = style;
  tp.max_degree = max_degree;
  tp.split_param_bytes = split_param_bytes;
  tp.activation_split = activation_split;
  return tp;
}

// bench_search's tensor-parallel chain: 1000 nodes, every fourth a colwise split of
// max_degree 8 (1 MiB split, a 4 MiB input-gradient all-reduce); 4 MiB activations.
inline Graph tp_chain_graph() {
  std::vector<NodeSpec> nodes;
  std::vector<EdgeSpec> edges;
  for (int i = 0; i < 1000; ++i) {
    nodes.push_back({"layer" + std::to_string(i), 1e-3 * (1 + i % 3), 2e-3 * (1 + i % 3),
                     int64_t{1} << 20, int64_t{1} << 22});
    if (i > 0) edges.push_back({i - 1, i, int64_t{1} << 22});
  }
  Graph graph = make_graph(nodes, edges, 32, "chain1000");
  for (int i = 0; i < 1000; i += 4) {
    TensorParallel tp = tp_split(TpStyle::kColwise, 8, int64_t{1} << 20, true);
    tp.backward_collective = TpCollective{Collective::kAllReduce, int64_t{1} << 22};
    graph.nodes[i].tensor_parallel = tp;
  }
  graph.finalize("chain1000");
  return graph;
}

inline std::filesystem::path scratch_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() /
             ("hybridplan-planner-tests-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline std::string write_file(const std::string& name, const std::string& text) {
  const auto path = scratch_dir() / name;
  std::ofstream(path) << text;
  return path.string();
}

// The checkout: $HYBRIDPLAN_SOURCE_DIR (set by ctest), else the folder this test was built from.
inline std::filesystem::path source_dir() {
  const char* env = std::getenv("HYBRIDPLAN_SOURCE_DIR");
  return (env && *env) ? std::filesystem::path(env) : std::filesystem::path(HYBRIDPLAN_SOURCE_DIR);
}

// The message of the InputError `f` throws; "no error" when it returns normally.
inline std::string input_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace hybridplan::test
