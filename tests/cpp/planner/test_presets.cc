// The embedded cluster presets: every one loads and validates, carries a description and
// sources, and the DGX-1 V100 matrix is the hybrid cube-mesh.
#include <algorithm>
#include <string>

#include "catch.h"
#include "common/json_io.h"
#include "planner/documents/cluster.h"
#include "planner/documents/presets.h"

using namespace hybridplan;

TEST_CASE("presets: the shipped names, sorted") {
  const std::vector<std::string> names = preset_names();
  CHECK(std::is_sorted(names.begin(), names.end()));
  for (const char* expected :
       {"dgx-a100", "dgx-h100", "dgx-h200", "dgx1-v100", "localhost-cpu", "pcie-8gpu"}) {
    INFO(expected);
    CHECK(std::find(names.begin(), names.end(), expected) != names.end());
  }
  CHECK(preset_json_text("no-such-cluster") == nullptr);
}

TEST_CASE("presets: each loads, validates, has a description and cites sources") {
  for (const std::string& name : preset_names()) {
    INFO(name);
    const std::string* text = preset_json_text(name);
    REQUIRE(text != nullptr);
    const Json j = parse_json_text(*text, name);
    const Cluster c = cluster_from_json(j, name);
    c.validate(name);
    CHECK(c.name == name);
    REQUIRE(j.contains("description"));
    CHECK(!j["description"].get<std::string>().empty());
    REQUIRE(j["sources"].is_array());
    CHECK(j["sources"].size() >= 2);
    for (const Json& s : j["sources"]) CHECK(!s.get<std::string>().empty());
    CHECK(c.device.memory_bytes > 0);
    CHECK(c.device.peak_flops > 0);
    // load_cluster falls back to the preset when no such file exists
    CHECK(load_cluster(name).num_devices() == c.num_devices());
  }
}

TEST_CASE("presets: dgx1-v100 is the hybrid cube-mesh") {
  const Cluster c = load_cluster("dgx1-v100");
  REQUIRE(c.devices_per_node == 8);
  REQUIRE(c.bandwidth_matrix.size() == 8);
  constexpr double kLink = 25e9;  // one NVLink2 link, per direction
  int double_link_pairs = 0;
  for (int i = 0; i < 8; ++i) {
    double nvlink_bytes_per_s = 0;
    for (int j = 0; j < 8; ++j) {
      if (i == j) continue;
      CHECK(c.bandwidth_matrix[i][j] == c.bandwidth_matrix[j][i]);
      if (c.bandwidth_matrix[i][j] >= kLink) nvlink_bytes_per_s += c.bandwidth_matrix[i][j];
      if (j > i && c.bandwidth_matrix[i][j] == 2 * kLink) ++double_link_pairs;
    }
    CHECK(nvlink_bytes_per_s == 6 * kLink);  // six NVLink2 ports per V100, all used
  }
  CHECK(double_link_pairs == 8);  // 24 links over 16 connected pairs
  CHECK(c.link(0, 3).bandwidth_bytes_per_s == 50e9);
  CHECK(c.link(0, 1).bandwidth_bytes_per_s == 25e9);
  CHECK(c.link(0, 5).bandwidth_bytes_per_s == 10e9);  // no NVLink: PCIe + QPI
  CHECK(c.link(0, 8).bandwidth_bytes_per_s == c.inter_node.bandwidth_bytes_per_s);
  CHECK(c.inter_node.bandwidth_bytes_per_s == 50e9);  // 4x 100 Gb/s EDR
}
