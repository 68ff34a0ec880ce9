// Cluster presets, PipeDream profile import and the DP-vs-hybrid device-count sweep.
#include <optional>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "planner/costs/compute_cost.h"
#include "planner/documents/pipedream_import.h"
#include "planner/documents/presets.h"
#include "planner/searches/sweep.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace hybridplan::python {

namespace {

std::string preset_text(const std::string& name) {
  const std::string* text = preset_json_text(name);
  if (text == nullptr) {
    std::string known;
    for (const std::string& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw_input_error("presets", "name", "must be one of " + known, "'" + name + "'");
  }
  return *text;
}

// The PipeDream profile at `path` as canonical graph JSON text.
std::string import_pipedream_text(const std::string& path, int64_t batch_size,
                                  const std::string& name) {
  return graph_to_json(import_pipedream(path, batch_size, name)).dump();
}

// JSON text {"points": sweep_to_json(...), "csv": sweep_to_csv(...)}.
std::string sweep_text(const std::string& graph_text, const std::string& cluster_text,
                       const std::optional<std::string>& job_text, int64_t max_devices,
                       bool placement, bool pipeline) {
  const Problem problem = make_problem(graph_text, cluster_text, job_text);
  SearchOptions base;
  base.placement = placement;
  base.pipeline = pipeline;
  std::vector<SweepPoint> points;
  {
    py::gil_scoped_release release;
    points = sweep(problem, max_devices, base);
  }
  return Json{{"points", sweep_to_json(points)}, {"csv", sweep_to_csv(points)}}.dump();
}

}  // namespace

void bind_tools(py::module_& m) {
  m.def("preset_names", &preset_names, "Names of the shipped cluster presets, sorted.");
  m.def("default_profile_batch_sizes", &default_profile_batch_sizes, py::arg("batch"),
        "The batch sizes a profile measures besides its example batch (compute_cost.h).");
  m.def("preset_text", &preset_text, py::arg("name"), "The JSON text of a cluster preset.");
  m.attr("PIPEDREAM_DEFAULT_BATCH_SIZE") = kPipeDreamDefaultBatchSize;
  m.def("import_pipedream", &import_pipedream_text, py::arg("path"), py::arg("batch_size"),
        py::arg("name") = "",
        "Read a PipeDream graph.txt profile; return the graph's canonical JSON text.");
  m.def("sweep", &sweep_text, py::arg("graph_text"), py::arg("cluster_text"),
        py::arg("job_text"), py::arg("max_devices"), py::arg("placement") = true,
        py::arg("pipeline") = true,
        "Best pure-DP and best hybrid plan for N = 1, 2, 4, ... max_devices devices: JSON text "
        "{points, csv}.");
}

}  // namespace hybridplan::python
