// Device mapping: replicas on the best-connected devices of a node, pipeline order along fast
// links, nodes filled in order.
#include <set>

#include "catch.h"
#include "planner/searches/device_mapping.h"

using namespace hybridplan;

namespace {

constexpr double kGB = 1e9;

// The DGX-1 V100 hybrid cube-mesh (presets/dgx1-v100.json): quads {0,1,2,3} and
// {4,5,6,7} fully connected; double NVLink (50 GB/s) on 0-3 0-4 1-2 1-5 2-3 4-7 5-6 6-7, single
// (25 GB/s) on the other quad pairs and i-(i+4), PCIe/QPI (10 GB/s) elsewhere.
Cluster dgx1(int64_t num_nodes) {
  Cluster c;
  c.name = "dgx1-test";
  c.num_nodes = num_nodes;
  c.devices_per_node = 8;
  c.device.memory_bytes = 16LL << 30;
  c.intra_node = {25 * kGB, 5e-6};
  c.inter_node = {50 * kGB, 1e-5};
  const double a = 50 * kGB, b = 25 * kGB, p = 10 * kGB;
  c.bandwidth_matrix = {{0, b, b, a, a, p, p, p}, {b, 0, a, b, p, a, p, p},
                        {b, a, 0, a, p, p, b, p}, {a, b, a, 0, p, p, p, b},
                        {a, p, p, p, 0, b, b, a}, {p, a, p, p, b, 0, a, b},
                        {p, p, b, p, b, a, 0, a}, {p, p, p, b, a, b, a, 0}};
  return c;
}

Cluster uniform(int64_t num_nodes, int64_t per_node) {
  Cluster c;
  c.name = "uniform-test";
  c.num_nodes = num_nodes;
  c.devices_per_node = per_node;
  c.device.memory_bytes = 1LL << 30;
  c.intra_node = {10 * kGB, 1e-6};
  c.inter_node = {1 * kGB, 1e-5};
  return c;
}

}  // namespace

TEST_CASE("device mapping: DGX-1 mp=4 uses the two NVLink quads", "[device_mapping]") {
  const Cluster c = dgx1(2);
  const DeviceMapping m = map_devices(c, 4, 4);
  REQUIRE(m.mesh.size() == 4);
  const std::set<std::set<DeviceIndex>> replicas(
      {std::set<DeviceIndex>(m.mesh[0].begin(), m.mesh[0].end()),
       std::set<DeviceIndex>(m.mesh[1].begin(), m.mesh[1].end()),
       std::set<DeviceIndex>(m.mesh[2].begin(), m.mesh[2].end()),
       std::set<DeviceIndex>(m.mesh[3].begin(), m.mesh[3].end())});
  CHECK(replicas == std::set<std::set<DeviceIndex>>(
                        {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  // Consecutive stages ride double NVLinks: 0-3-2-1 is 50, 50, 50 GB/s.
  CHECK(m.mesh[0] == std::vector<DeviceIndex>{0, 3, 2, 1});
  CHECK(m.slowest_link_bytes_per_s == 25 * kGB);  // every quad has single-link pairs
  CHECK(m.note.find("{0,3,2,1} / {4,") != std::string::npos);
  CHECK(m.note.find("slowest link") != std::string::npos);
}

TEST_CASE("device mapping: DGX-1 mp=2 pairs only double-NVLink neighbours", "[device_mapping]") {
  const Cluster c = dgx1(1);
  const DeviceMapping m = map_devices(c, 4, 2);
  std::set<DeviceIndex> used;
  for (const auto& r : m.mesh) {
    REQUIRE(r.size() == 2);
    CHECK(c.link(r[0], r[1]).bandwidth_bytes_per_s == 50 * kGB);
    used.insert(r.begin(), r.end());
  }
  CHECK(used.size() == 8);
  CHECK(m.slowest_link_bytes_per_s == 50 * kGB);
}

TEST_CASE("device mapping: DGX-1 mp=8 orders stages along a 50 GB/s ring", "[device_mapping]") {
  const Cluster c = dgx1(1);
  const DeviceMapping m = map_devices(c, 1, 8);
  REQUIRE(m.mesh.size() == 1);
  for (size_t s = 0; s + 1 < 8; ++s)
    CHECK(c.link(m.mesh[0][s], m.mesh[0][s + 1]).bandwidth_bytes_per_s == 50 * kGB);
}

TEST_CASE("device mapping: a partly used node takes its best groups", "[device_mapping]") {
  const Cluster c = dgx1(2);
  // dp=3, mp=4: node 0 holds two quads, node 1 one quad (devices 8..11 in NVLink order).
  const DeviceMapping m = map_devices(c, 3, 4);
  REQUIRE(m.mesh.size() == 3);
  CHECK(m.mesh[2] == std::vector<DeviceIndex>{8, 11, 10, 9});
  // dp=1, mp=2 on one node: a double-NVLink pair.
  const DeviceMapping one = map_devices(c, 1, 2);
  CHECK(c.link(one.mesh[0][0], one.mesh[0][1]).bandwidth_bytes_per_s == 50 * kGB);
}

TEST_CASE("device mapping: uniform links give consecutive devices", "[device_mapping]") {
  const Cluster c = uniform(2, 4);
  const DeviceMapping m = map_devices(c, 3, 2);
  CHECK(m.mesh == std::vector<std::vector<DeviceIndex>>{{0, 1}, {2, 3}, {4, 5}});
  CHECK(m.note.find("all intra-node links are equal") != std::string::npos);
  const DeviceMapping d = map_devices(c, 6, 1);
  CHECK(d.mesh == std::vector<std::vector<DeviceIndex>>{{0}, {1}, {2}, {3}, {4}, {5}});
  CHECK(d.note.find("one device per replica") != std::string::npos);
}

TEST_CASE("device mapping: 16-device nodes fall back to greedy groups", "[device_mapping]") {
  // 16 devices in groups of 2: 2,027,025 groupings exceed the exhaustive budget.
  Cluster c = uniform(1, 16);
  c.bandwidth_matrix.assign(16, std::vector<double>(16, 1 * kGB));
  for (int i = 0; i < 16; ++i) c.bandwidth_matrix[i][i] = 0;
  // Fast pairs (i, 15 - i).
  for (int i = 0; i < 16; ++i) c.bandwidth_matrix[i][15 - i] = 9 * kGB;
  const DeviceMapping m = map_devices(c, 8, 2);
  std::set<DeviceIndex> used;
  for (const auto& r : m.mesh) {
    CHECK(r[0] + r[1] == 15);
    used.insert(r.begin(), r.end());
  }
  CHECK(used.size() == 16);
}

TEST_CASE("device mapping: a pipeline spanning nodes takes whole nodes, each in pipeline order",
          "[device_mapping]") {
  const Cluster c = dgx1(4);
  // dp=2, mp=16: replica 0 on nodes 0-1, replica 1 on nodes 2-3; on every node the devices in
  // the order of its best 8-stage pipeline (50 GB/s between consecutive stages).
  const DeviceMapping m = map_devices(c, 2, 16);
  const std::vector<int64_t> order = best_local_groups(c, 8, 1).front();
  REQUIRE(m.mesh.size() == 2);
  for (int64_t r = 0; r < 2; ++r) {
    REQUIRE(m.mesh[r].size() == 16);
    for (int64_t s = 0; s < 16; ++s) {
      CHECK(m.mesh[r][s] == (2 * r + s / 8) * 8 + order[s % 8]);
    }
  }
  for (int64_t s = 0; s + 1 < 16; ++s) {
    const double bw = c.link(m.mesh[0][s], m.mesh[0][s + 1]).bandwidth_bytes_per_s;
    CHECK(bw == (s == 7 ? c.inter_node.bandwidth_bytes_per_s : 50 * kGB));  // 7|8: node 0 -> 1
  }
  CHECK(m.slowest_link_bytes_per_s == 10 * kGB);  // the PCIe pairs inside a node
  CHECK(m.note.find("span 2 whole nodes") != std::string::npos);
  // Tensor parallelism: TP groups {0-3} and {4-7} of each node as the positions, mp=4 spanning
  // two nodes (mp * tp = 16).
  const DeviceMapping t = map_devices(c, 2, 4, 4);
  CHECK(t.mesh == std::vector<std::vector<DeviceIndex>>{{0, 4, 8, 12}, {16, 20, 24, 28}});
  const Cluster u = uniform(3, 4);
  CHECK(map_devices(u, 1, 12).mesh ==
        std::vector<std::vector<DeviceIndex>>{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}});
}
