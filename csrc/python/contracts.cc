// Loading, validating and dumping the JSON contracts (graph, cluster, job, plan). Each loader
// returns canonical JSON text: what the C++ side would write, so a dict that round-trips
// through Python keeps the graph's sha256.
#include <string>

#include <pybind11/stl.h>

#include "common/json_io.h"
#include "planner/documents/cluster.h"
#include "planner/documents/graph.h"
#include "planner/documents/job.h"
#include "planner/documents/plan.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace hybridplan::python {

Json parse_json_text(const std::string& text, const std::string& source, const std::string& document) {
  if (!document.empty()) check_not_empty(text, document, source);
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    throw_input_error(source, "$", "must be valid JSON", e.what());
  }
}

namespace {

std::string canonical_graph(const std::string& text, const std::string& source) {
  return with_source(source, [&] {
    return graph_to_json(graph_from_json(parse_json_text(text, source, "graph"), source)).dump();
  });
}

std::string sha256_of_graph(const std::string& text, const std::string& source) {
  return with_source(source, [&] {
    return graph_sha256(graph_from_json(parse_json_text(text, source, "graph"), source));
  });
}

std::string canonical_cluster(const std::string& text, const std::string& source) {
  return with_source(source, [&] {
    return cluster_to_json(cluster_from_json(parse_json_text(text, source, "cluster"), source)).dump();
  });
}

std::string canonical_job(const std::string& text, const std::string& source) {
  return with_source(source, [&] {
    return job_to_json(job_from_json(parse_json_text(text, source, "job"), source)).dump();
  });
}

// Structural checks only (a plan is checked against a graph and cluster by validate_plan).
void check_plan(const std::string& text, const std::string& source) {
  with_source(source, [&] { plan_from_json(parse_json_text(text, source, "plan"), source); });
}

// Checks the plan against the graph and cluster it is applied to (graph hash, world size, mesh,
// assignment) and returns its canonical JSON.
std::string validate_plan(const std::string& plan_text, const std::string& plan_source,
                          const std::string& graph_text, const std::string& cluster_text) {
  const Graph graph = graph_from_json(parse_json_text(graph_text, "graph"), "graph");
  const Cluster cluster = cluster_from_json(parse_json_text(cluster_text, "cluster"), "cluster");
  return with_source(plan_source, [&] {
    Plan plan = plan_from_json(parse_json_text(plan_text, plan_source, "plan"), plan_source);
    align_assignment_to_graph(plan, graph, plan_source);
    plan.validate(plan_source, graph, cluster);
    return plan_to_json(plan, graph, cluster).dump();
  });
}

}  // namespace

void bind_contracts(py::module_& m) {
  m.def("canonical_graph", &canonical_graph, py::arg("text"), py::arg("source"),
        "Validate a graph JSON text; return its canonical JSON text (what sha256 is taken over).");
  m.def("graph_sha256", &sha256_of_graph, py::arg("text"), py::arg("source"),
        "Hex sha256 of the graph's canonical JSON.");
  m.def("canonical_cluster", &canonical_cluster, py::arg("text"), py::arg("source"),
        "Validate a cluster JSON text; return its canonical JSON text.");
  m.def("canonical_job", &canonical_job, py::arg("text"), py::arg("source"),
        "Validate a job JSON text; return its canonical JSON text.");
  m.def("default_job", [] { return job_to_json(default_job()).dump(); },
        "The job used when none is given: no convergence model, objective samples/s.");
  m.def("check_plan", &check_plan, py::arg("text"), py::arg("source"),
        "Structural checks of a plan JSON text (without a graph or cluster).");
  m.def("validate_plan", &validate_plan, py::arg("plan_text"), py::arg("plan_source"),
        py::arg("graph_text"), py::arg("cluster_text"),
        "Check a plan against a graph and cluster; return the plan's canonical JSON text.");
}

}  // namespace hybridplan::python
