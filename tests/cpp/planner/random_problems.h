// Seeded random small Problems for brute-force tests of the search: DAGs (chains, branches,
// random edges), clusters (1-2 nodes, uniform links or a random bandwidth matrix) and jobs
// (samples/s or a convergence model, fixed per-replica or global batch).
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <string>

#include "planner/documents/problem.h"

namespace hybridplan::testing {

struct RandomGraphOptions {
  int num_nodes = 6;
  double edge_probability = 0.3;  // extra forward edges beyond the spanning chain/tree
  bool chain = false;             // only the edges i -> i+1
  int64_t profiled_batch = 8;
  bool batch_curves = false;      // nodes also measured at batch sizes 1, 2, 4 (sublinear)
  bool cut_constraints = false;   // some nodes (never the first) forbid a stage to begin there
};

// Node i's times are in [1, 10] ms, params up to 64 MiB, outputs up to 32 MiB. Every node but
// the first gets one edge from an earlier node (so the graph is connected), plus random extra
// edges i -> j (i < j). Edge bytes sometimes differ from the source's output_bytes.
inline Graph random_graph(std::mt19937_64& rng, const RandomGraphOptions& o) {
  std::uniform_real_distribution<double> ms(1e-3, 10e-3);
  std::uniform_int_distribution<int64_t> mib(0, 64);
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  Graph g;
  g.name = "random" + std::to_string(o.num_nodes);
  g.profiled.batch_size = o.profiled_batch;
  for (int i = 0; i < o.num_nodes; ++i) {
    Node n;
    n.id = 100 + 7 * i;  // ids need not be dense
    n.name = "layer" + std::to_string(i);
    n.op = "linear";
    n.forward_s = ms(rng);
    n.backward_s = 2 * ms(rng);
    n.param_bytes = mib(rng) << 20;
    n.output_bytes = (mib(rng) / 2 + 1) << 20;
    if (o.batch_curves) {  // a per-call share f of the profiled time: t(b) = t0 (f + (1-f) b/b0)
      const double f = coin(rng) * 0.5;
      for (int64_t b = 1; b < o.profiled_batch; b *= 2) {
        const double x = f + (1 - f) * static_cast<double>(b) / static_cast<double>(o.profiled_batch);
        n.batch_times.push_back({b, n.forward_s * x, n.backward_s * x});
      }
    }
    if (o.cut_constraints && i > 0) n.cut_before = coin(rng) < 0.5;
    g.nodes.push_back(n);
  }
  auto add_edge = [&](int src, int dst) {
    for (const Edge& e : g.edges)
      if (e.src == src && e.dst == dst) return;
    Edge e;
    e.src = src;
    e.dst = dst;
    e.bytes = coin(rng) < 0.8 ? g.nodes[src].output_bytes : (mib(rng) + 1) << 19;
    g.edges.push_back(e);
  };
  for (int j = 1; j < o.num_nodes; ++j) {
    if (o.chain) {
      add_edge(j - 1, j);
      continue;
    }
    add_edge(static_cast<int>(rng() % j), j);
    for (int i = 0; i < j; ++i)
      if (coin(rng) < o.edge_probability) add_edge(i, j);
  }
  g.finalize("random_graph");
  return g;
}

struct RandomClusterOptions {
  int64_t num_nodes = 1;
  int64_t devices_per_node = 4;
  bool bandwidth_matrix = false;
  int64_t memory_bytes = 0;  // 0: random between 64 MiB and 1 GiB
};

// Links between 1 and 50 GB/s; a random asymmetric matrix when asked.
inline Cluster random_cluster(std::mt19937_64& rng, const RandomClusterOptions& o) {
  std::uniform_real_distribution<double> gbps(1e9, 50e9);
  Cluster c;
  c.name = "random-cluster";
  c.num_nodes = o.num_nodes;
  c.devices_per_node = o.devices_per_node;
  c.device.name = "fake";
  c.device.memory_bytes =
      o.memory_bytes > 0 ? o.memory_bytes : static_cast<int64_t>((64 + rng() % 960)) << 20;
  c.intra_node = {gbps(rng), 5e-6};
  c.inter_node = {gbps(rng) / 4, 2e-5};
  // Runtime terms and the collective library, sometimes (they must not break optimality).
  if (rng() % 2) c.device.call_floor_s = 2e-4;
  if (rng() % 2) c.runtime.action_s = 1e-4;
  if (rng() % 2) c.device.memory_bandwidth_bytes_per_s = 5e11;
  if (rng() % 2) c.collectives = CollectiveLibrary::kGloo;
  if (o.bandwidth_matrix) {
    c.bandwidth_matrix.assign(o.devices_per_node, std::vector<double>(o.devices_per_node, 0));
    // A few distinct values so that some pairs of devices are interchangeable and some not.
    const double levels[3] = {gbps(rng), gbps(rng), gbps(rng)};
    for (int64_t i = 0; i < o.devices_per_node; ++i)
      for (int64_t j = 0; j < o.devices_per_node; ++j)
        if (i != j) c.bandwidth_matrix[i][j] = levels[rng() % 3];
  }
  c.validate("random_cluster");
  return c;
}

// Samples/s (no convergence model) or a critical-batch model; batch fixed per replica, by the
// global batch, chosen by the search among candidates, or left to the graph's profiled batch.
inline Job random_job(std::mt19937_64& rng, int64_t world) {
  Job job;
  switch (rng() % 4) {
    case 0: job.per_replica_batches = {int64_t{1} << (rng() % 4)}; break;
    case 1: job.global_batches = {world * (int64_t{1} << (rng() % 3))}; break;
    case 2: job.per_replica_batches = {2, 4, 8}; break;
    default: break;  // profiled batch
  }
  if (rng() % 2) {
    job.samples_per_epoch = 10000;
    job.convergence.model = Convergence::Model::kCriticalBatch;
    job.convergence.epochs_min = 10;
    job.convergence.critical_batch = 16;
  }
  job.optimizer = static_cast<Optimizer>(rng() % 3);
  job.validate("random_job");
  return job;
}

// A whole random Problem, varied by `trial`: 2..6 nodes (a chain every fourth trial, measured
// at several batch sizes two trials in three, some cuts forbidden every fifth), 1-2 nodes of 2
// or 4 devices (a bandwidth matrix every other trial), a random job.
inline Problem random_problem(std::mt19937_64& rng, int trial) {
  Problem problem;
  RandomGraphOptions go;
  go.num_nodes = 2 + static_cast<int>(rng() % 5);  // 2..6 nodes
  go.chain = trial % 4 == 0;
  go.batch_curves = trial % 3 != 0;
  go.cut_constraints = trial % 5 == 1;
  problem.graph = random_graph(rng, go);
  RandomClusterOptions co;
  co.num_nodes = 1 + static_cast<int64_t>(rng() % 2);
  co.devices_per_node = trial % 3 == 0 ? 2 : 4;
  co.bandwidth_matrix = trial % 2 == 1;
  problem.cluster = random_cluster(rng, co);
  problem.job = random_job(rng, problem.cluster.num_devices());
  return problem;
}

}  // namespace hybridplan::testing
