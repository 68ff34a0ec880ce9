#include <cmath>

#include "catch.h"
#include "model_fixtures.h"
#include "planner/documents/cluster.h"
#include "planner/documents/presets.h"

using namespace hybridplan;
using hybridplan::test::input_error_of;

namespace {

Json valid_cluster_json() {
  return Json::parse(R"({
    "schema_version": 1, "kind": "hybridplan.cluster", "name": "two-boxes",
    "num_nodes": 2, "devices_per_node": 4,
    "device": {"name": "V100-SXM2-16GB", "memory_bytes": 17179869184, "peak_flops": 1.25e14},
    "intra_node": {"bandwidth_bytes_per_s": 2.5e10, "latency_s": 5e-06},
    "inter_node": {"bandwidth_bytes_per_s": 1.25e10, "latency_s": 1e-05},
    "sources": ["https://example.org/spec"]})");
}

std::string load_error(const Json& j) {
  return input_error_of([&] { cluster_from_json(j, "cluster.json"); });
}

}  // namespace

TEST_CASE("cluster_from_json reads fields and round-trips", "[cluster]") {
  const Cluster c = cluster_from_json(valid_cluster_json(), "cluster.json");
  REQUIRE(c.num_devices() == 8);
  REQUIRE(c.device.memory_bytes == 17179869184);
  REQUIRE(c.sources.size() == 1);
  const Cluster again = cluster_from_json(cluster_to_json(c), "again");
  REQUIRE(cluster_to_json(again) == cluster_to_json(c));
}

TEST_CASE("cluster: device extras, collectives, calibrated all-reduce link and runtime", "[cluster]") {
  Json j = valid_cluster_json();
  REQUIRE(cluster_from_json(j, "c").collectives == CollectiveLibrary::kNccl);  // the default
  j["device"]["type"] = "cpu";
  j["device"]["memory_bandwidth_bytes_per_s"] = 9e11;
  j["device"]["call_floor_s"] = 2e-5;
  j["collectives"] = {{"library", "gloo"}};
  j["intra_node"]["allreduce"] = {{"bandwidth_bytes_per_s", 3e8}, {"latency_s", 1e-3}};
  j["runtime"] = Json::parse(R"({"step_s": 0.002, "action_s": 0.0004, "optimizer_tensor_s": 5e-6,
                                 "shared_host_slowdown": [[1, 1.0], [2, 1.3]]})");
  j["measured"] = {{"points", 3}};
  const Cluster c = cluster_from_json(j, "cluster.json");
  REQUIRE(c.device.type == "cpu");
  REQUIRE(c.device.call_floor_s == 2e-5);
  REQUIRE(c.collectives == CollectiveLibrary::kGloo);
  REQUIRE(c.allreduce_link(0, 1).bandwidth_bytes_per_s == 3e8);   // calibrated, same node
  REQUIRE(c.allreduce_link(0, 5).bandwidth_bytes_per_s == 1.25e10);  // across: the link
  REQUIRE(c.link(0, 1).bandwidth_bytes_per_s == 2.5e10);          // p2p keeps its own link
  REQUIRE(c.runtime.slowdown(1) == 1.0);
  REQUIRE(c.runtime.slowdown(4) == 1.3);
  REQUIRE(c.runtime.action_s == 0.0004);
  REQUIRE(c.runtime.optimizer_tensor_s == 5e-6);
  REQUIRE(c.runtime.action_s_for("gpipe") == 0.0004);  // no per-schedule entry: action_s
  REQUIRE(cluster_to_json(cluster_from_json(cluster_to_json(c), "again")) == cluster_to_json(c));
  j["runtime"]["schedule_action_s"] = {{"gpipe", 0.0009}};
  const Cluster by_schedule = cluster_from_json(j, "cluster.json");
  REQUIRE(by_schedule.runtime.action_s_for("gpipe") == 0.0009);
  REQUIRE(by_schedule.runtime.action_s_for("1f1b") == 0.0004);
  REQUIRE(cluster_to_json(by_schedule)["runtime"]["schedule_action_s"] == Json{{"gpipe", 0.0009}});
  REQUIRE(cluster_to_json(cluster_from_json(cluster_to_json(by_schedule), "again")) ==
          cluster_to_json(by_schedule));
  j["runtime"]["schedule_action_s"] = {{"interleaved", 0.001}};
  REQUIRE(load_error(j) ==
          "cluster.json: runtime.schedule_action_s.interleaved is not a pipeline schedule (the keys "
          "are \"gpipe\", \"1f1b\", \"interleaved-1f1b\", \"interleaved-zb\" and \"zbv\") (got 0.001)");
  j["runtime"]["schedule_action_s"] = {{"1f1b", -0.001}};
  REQUIRE(load_error(j) ==
          "cluster.json: runtime.schedule_action_s.1f1b must be finite and >= 0 (got -0.001)");
  j["runtime"]["schedule_action_s"] = Json::array();
  REQUIRE(load_error(j) == "cluster.json: runtime.schedule_action_s must be a JSON object (got [])");
  j["runtime"].erase("schedule_action_s");
  j["runtime"]["action_sample_s"] = 1e-5;
  j["runtime"]["schedule_action_sample_s"] = {{"gpipe", 1.5e-4}};
  const Cluster per_sample = cluster_from_json(j, "cluster.json");
  REQUIRE(per_sample.runtime.action_cost_s("gpipe", 16) == Approx(per_sample.runtime.action_s_for("gpipe") + 16 * 1.5e-4));
  REQUIRE(per_sample.runtime.action_cost_s("1f1b", 4) == Approx(per_sample.runtime.action_s + 4 * 1e-5));
  REQUIRE(cluster_to_json(cluster_from_json(cluster_to_json(per_sample), "again")) == cluster_to_json(per_sample));
  j["runtime"]["schedule_action_sample_s"] = {{"zbv", -1}};
  REQUIRE(load_error(j) == "cluster.json: runtime.schedule_action_sample_s.zbv must be finite and >= 0 (got -1)");
  j["runtime"].erase("action_sample_s");
  j["runtime"].erase("schedule_action_sample_s");
  REQUIRE(cluster_to_json(c)["measured"]["points"] == 3);

  j["collectives"]["library"] = "mpi";
  REQUIRE(load_error(j) == "cluster.json: collectives.library must be \"nccl\" or \"gloo\" (got \"mpi\")");
  j["collectives"]["library"] = "gloo";
  j["runtime"]["shared_host_slowdown"] = Json::parse("[[2, 1.3], [2, 1.4]]");
  REQUIRE(load_error(j) ==
          "cluster.json: runtime.shared_host_slowdown[1][0] must be greater than the previous "
          "entry's 2 (processes increasing) (got 2)");
  j["runtime"]["shared_host_slowdown"] = Json::parse("[[1, 0]]");
  REQUIRE(load_error(j) == "cluster.json: runtime.shared_host_slowdown[0][1] must be finite and > 0 (got 0)");
  j["runtime"].erase("shared_host_slowdown");
  j["runtime"]["action_s"] = -1;
  REQUIRE(load_error(j) == "cluster.json: runtime.action_s must be finite and >= 0 (got -1)");
  j["runtime"]["action_s"] = 0;
  j["runtime"]["optimizer_tensor_s"] = -1e-6;
  REQUIRE(load_error(j) == "cluster.json: runtime.optimizer_tensor_s must be finite and >= 0 (got -1e-06)");
  j.erase("runtime");
  j["device"]["type"] = "tpu";
  REQUIRE(load_error(j) == "cluster.json: device.type must be \"cuda\" or \"cpu\" (got \"tpu\")");
  j["device"]["type"] = "cpu";
  j["intra_node"]["allreduce"]["bandwidth_bytes_per_s"] = 0;
  REQUIRE(load_error(j) ==
          "cluster.json: intra_node.allreduce.bandwidth_bytes_per_s must be finite and > 0 (got 0)");
}

TEST_CASE("cluster: calibrated all-gather and reduce-scatter links, sharded optimizer cost",
          "[cluster][sharding]") {
  Json j = valid_cluster_json();
  j["intra_node"]["allreduce"] = {{"bandwidth_bytes_per_s", 3e8}, {"latency_s", 1e-3}};
  const Cluster plain = cluster_from_json(j, "cluster.json");
  // unset: the all-reduce link of the same level
  REQUIRE(plain.collective_link(Collective::kAllGather, 0, 1).bandwidth_bytes_per_s == 3e8);
  REQUIRE(plain.collective_link(Collective::kReduceScatter, 0, 5).bandwidth_bytes_per_s == 1.25e10);
  j["intra_node"]["allgather"] = {{"bandwidth_bytes_per_s", 7e8}, {"latency_s", 1e-3}};
  j["intra_node"]["reduce_scatter"] = {{"bandwidth_bytes_per_s", 2e8}, {"latency_s", 2e-3}};
  j["inter_node"]["reduce_scatter"] = {{"bandwidth_bytes_per_s", 1e8}, {"latency_s", 3e-3}};
  j["runtime"] = {{"optimizer_tensor_s", 1e-5}, {"sharded_optimizer_tensor_s", 5e-5},
                  {"sharded_compute_slowdown", 0.25}};
  const Cluster c = cluster_from_json(j, "cluster.json");
  REQUIRE(c.collective_link(Collective::kAllGather, 0, 1).bandwidth_bytes_per_s == 7e8);
  REQUIRE(c.collective_link(Collective::kReduceScatter, 0, 1).latency_s == 2e-3);
  REQUIRE(c.collective_link(Collective::kReduceScatter, 0, 5).latency_s == 3e-3);
  REQUIRE(c.collective_link(Collective::kAllGather, 0, 5).bandwidth_bytes_per_s == 1.25e10);
  REQUIRE(c.collective_link(Collective::kAllReduce, 0, 1).bandwidth_bytes_per_s == 3e8);
  REQUIRE(c.runtime.sharded_optimizer_tensor_s == 5e-5);
  REQUIRE(c.runtime.sharded_compute_slowdown == 0.25);
  REQUIRE(cluster_to_json(cluster_from_json(cluster_to_json(c), "again")) == cluster_to_json(c));
  j["intra_node"]["allgather"]["bandwidth_bytes_per_s"] = -1;
  REQUIRE(load_error(j) ==
          "cluster.json: intra_node.allgather.bandwidth_bytes_per_s must be finite and > 0 (got -1)");
  j["intra_node"]["allgather"]["bandwidth_bytes_per_s"] = 7e8;
  j["runtime"]["sharded_optimizer_tensor_s"] = -1;
  REQUIRE(load_error(j) ==
          "cluster.json: runtime.sharded_optimizer_tensor_s must be finite and >= 0 (got -1)");
  j["runtime"]["sharded_optimizer_tensor_s"] = 5e-5;
  j["runtime"]["optimizer_tensor_s_by_optimizer"] = {{"sgd", 4e-6}, {"adam", 4e-5}};
  j["runtime"]["sharded_optimizer_tensor_s_by_optimizer"] = {{"sgd", 1.4e-5}};
  const Cluster by = cluster_from_json(j, "cluster.json");
  REQUIRE(by.runtime.optimizer_tensor_s_for("sgd", false) == 4e-6);
  REQUIRE(by.runtime.optimizer_tensor_s_for("adam", false) == 4e-5);
  REQUIRE(by.runtime.optimizer_tensor_s_for("sgd_momentum", false) == 1e-5);  // the scalar
  REQUIRE(by.runtime.optimizer_tensor_s_for("sgd", true) == 1.4e-5);
  REQUIRE(by.runtime.optimizer_tensor_s_for("adam", true) == 5e-5);  // the sharded scalar
  REQUIRE(cluster_to_json(cluster_from_json(cluster_to_json(by), "again")) == cluster_to_json(by));
  j["runtime"]["sharded_optimizer_tensor_s_by_optimizer"] = {{"lamb", 1e-5}};
  REQUIRE(load_error(j) ==
          "cluster.json: runtime.sharded_optimizer_tensor_s_by_optimizer.lamb is not a Job optimizer "
          "(the keys are \"sgd\", \"sgd_momentum\" and \"adam\") (got 1e-05)");
  j["runtime"]["sharded_optimizer_tensor_s_by_optimizer"] = {{"sgd", -1}};
  REQUIRE(load_error(j) ==
          "cluster.json: runtime.sharded_optimizer_tensor_s_by_optimizer.sgd must be finite and >= 0 (got -1)");
  j["runtime"].erase("optimizer_tensor_s_by_optimizer");
  j["runtime"].erase("sharded_optimizer_tensor_s_by_optimizer");
  j["runtime"]["sharded_compute_slowdown"] = -0.5;
  REQUIRE(load_error(j) ==
          "cluster.json: runtime.sharded_compute_slowdown must be finite and >= 0 (got -0.5)");
}

TEST_CASE("Cluster::link picks intra-node, matrix or inter-node links", "[cluster]") {
  Json j = valid_cluster_json();
  const Cluster c = cluster_from_json(j, "cluster.json");
  REQUIRE(c.link(0, 3).bandwidth_bytes_per_s == 2.5e10);  // same node
  REQUIRE(c.link(0, 3).latency_s == 5e-06);
  REQUIRE(c.link(3, 4).bandwidth_bytes_per_s == 1.25e10);  // node 0 -> node 1
  REQUIRE(c.link(3, 4).latency_s == 1e-05);
  REQUIRE(std::isinf(c.link(2, 2).bandwidth_bytes_per_s));

  // A per-pair matrix (like a DGX-1 cube mesh) replaces the uniform intra-node bandwidth.
  j["intra_node"].erase("bandwidth_bytes_per_s");
  j["intra_node"]["bandwidth_matrix_bytes_per_s"] = {
      {0, 5e10, 2.5e10, 1e10}, {5e10, 0, 1e10, 2.5e10}, {2.5e10, 1e10, 0, 5e10}, {1e10, 2.5e10, 5e10, 0}};
  const Cluster m = cluster_from_json(j, "matrix.json");
  REQUIRE(m.link(0, 1).bandwidth_bytes_per_s == 5e10);
  REQUIRE(m.link(5, 7).bandwidth_bytes_per_s == 2.5e10);  // node 1, local 1 -> 3
  REQUIRE(m.link(6, 7).latency_s == 5e-06);
  REQUIRE(m.link(1, 6).bandwidth_bytes_per_s == 1.25e10);  // across nodes: inter_node
  REQUIRE(cluster_to_json(cluster_from_json(cluster_to_json(m), "again")) == cluster_to_json(m));
}

TEST_CASE("cluster validation messages", "[cluster]") {
  Json j = valid_cluster_json();
  SECTION("zero devices") {
    j["devices_per_node"] = 0;
    REQUIRE(load_error(j) == "cluster.json: devices_per_node must be >= 1 (got 0)");
  }
  SECTION("memory") {
    j["device"]["memory_bytes"] = 0;
    REQUIRE(load_error(j) == "cluster.json: device.memory_bytes must be > 0 (got 0)");
  }
  SECTION("bandwidth") {
    j["intra_node"]["bandwidth_bytes_per_s"] = -3;
    REQUIRE(load_error(j) == "cluster.json: intra_node.bandwidth_bytes_per_s must be finite and > 0 (got -3)");
  }
  SECTION("missing intra bandwidth without a matrix") {
    j["intra_node"].erase("bandwidth_bytes_per_s");
    REQUIRE(load_error(j) == "cluster.json: intra_node.bandwidth_bytes_per_s is required");
  }
  SECTION("inter_node required for several nodes") {
    j.erase("inter_node");
    REQUIRE(load_error(j) == "cluster.json: inter_node is required when num_nodes > 1 (got 2 nodes)");
  }
  SECTION("matrix rows") {
    j["intra_node"]["bandwidth_matrix_bytes_per_s"] = {{0, 1e9}, {1e9, 0}};
    REQUIRE(load_error(j) ==
            "cluster.json: intra_node.bandwidth_matrix_bytes_per_s must have devices_per_node = 4 "
            "rows (got 2 rows)");
  }
  SECTION("matrix columns") {
    j["intra_node"]["bandwidth_matrix_bytes_per_s"] = {{0, 1, 1, 1}, {1, 0, 1}, {1, 1, 0, 1}, {1, 1, 1, 0}};
    REQUIRE(load_error(j) ==
            "cluster.json: intra_node.bandwidth_matrix_bytes_per_s[1] must have devices_per_node = "
            "4 entries (got 3 entries)");
  }
  SECTION("matrix off-diagonal zero") {
    j["intra_node"]["bandwidth_matrix_bytes_per_s"] = {{0, 1, 1, 1}, {1, 0, 1, 1}, {1, 0, 0, 1}, {1, 1, 1, 0}};
    REQUIRE(load_error(j) ==
            "cluster.json: intra_node.bandwidth_matrix_bytes_per_s[2][1] must be finite and > 0 (got 0)");
  }
  SECTION("wrong kind") {
    j["kind"] = "hybridplan.graph";
    REQUIRE(load_error(j) == "cluster.json: kind must be \"hybridplan.cluster\" (got \"hybridplan.graph\")");
  }
  SECTION("latency type") {
    j["inter_node"]["latency_s"] = "fast";
    REQUIRE(load_error(j) == "cluster.json: inter_node.latency_s must be a number (got \"fast\")");
  }
}

TEST_CASE("load_cluster takes a file, else a preset name, else lists the presets", "[cluster]") {
  const std::string path = test::write_file("two-boxes.cluster.json", valid_cluster_json().dump());
  REQUIRE(load_cluster(path).name == "two-boxes");

  const std::vector<std::string> names = preset_names();
  for (const std::string& name : names) {
    const Cluster preset = load_cluster(name);  // every shipped preset validates
    REQUIRE(preset.num_devices() >= 1);
  }
  std::string listed;
  for (const std::string& name : names) listed += (listed.empty() ? "" : ", ") + name;
  REQUIRE(input_error_of([] { load_cluster("no-such-cluster"); }) ==
          "no-such-cluster: no such file, and not a cluster preset (presets: " + listed + ")");
}
