// Cluster: devices and links (kind "hybridplan.cluster"). Global device index
// d = node * devices_per_node + local; devices of one node share the intra-node links.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace hybridplan {

using Json = nlohmann::json;
using DeviceIndex = int64_t;  // global device index, 0..num_nodes*devices_per_node-1

struct DeviceSpec {
  std::string name;
  int64_t memory_bytes = 0;
  double peak_flops = 0;
};

struct Link {
  double bandwidth_bytes_per_s = 0;  // per direction
  double latency_s = 0;
};

struct Cluster {
  std::string name;
  int64_t num_nodes = 1;
  int64_t devices_per_node = 1;
  DeviceSpec device;
  Link intra_node;  // used where bandwidth_matrix is empty
  // bandwidth_matrix[i][j]: bytes/s from local device i to j inside a node (0 on the diagonal).
  std::vector<std::vector<double>> bandwidth_matrix;
  Link inter_node;
  Json sources = Json::array();  // citations for the numbers, carried through untouched

  int64_t num_devices() const { return num_nodes * devices_per_node; }
  // Point-to-point link between two global devices (intra: matrix entry or intra_node).
  Link link(DeviceIndex a, DeviceIndex b) const;
  void validate(const std::string& source) const;
};

Cluster cluster_from_json(const Json& j, const std::string& source);
Json cluster_to_json(const Cluster& c);
// A file path, or a preset name (planner/presets.h) when no such file exists.
Cluster load_cluster(const std::string& path_or_preset);

}  // namespace hybridplan
