// Shared helpers of the hybridplan._C bindings. The module speaks JSON text with Python (the
// Python layer owns dicts and files); every function here turns user input into C++ values at
// the boundary, so a malformed document becomes an InputError naming its source.
#pragma once
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>
#include <pybind11/pybind11.h>

#include "common/error.h"
#include "planner/documents/problem.h"

namespace hybridplan::python {

using Json = nlohmann::json;

// Parses `text`; a syntax error is an InputError "<source>: $ must be valid JSON (got ...)".
// With `document` ("graph", ...), empty text is "<document> file <source> is empty" (the rule
// of common/json_io.h's check_not_empty).
Json parse_json_text(const std::string& text, const std::string& source,
                     const std::string& document = "");

// Runs `fn`, re-throwing nlohmann's type/range errors (a field of the wrong JSON type) as
// InputError naming `source`, so Python sees ValueError rather than RuntimeError.
template <class Fn>
auto with_source(const std::string& source, Fn&& fn) -> decltype(fn()) {
  try {
    return std::forward<Fn>(fn)();
  } catch (const nlohmann::json::exception& e) {
    throw InputError(source + ": " + e.what());
  }
}

// The Problem of canonical graph/cluster/job texts; no job: default_job() (objective samples/s).
Problem make_problem(const std::string& graph_text, const std::string& cluster_text,
                     const std::optional<std::string>& job_text);

void bind_contracts(pybind11::module_& m);  // graphs, clusters, jobs, plans: load/dump/validate
void bind_planner(pybind11::module_& m);    // evaluate, search, explain
void bind_tools(pybind11::module_& m);      // presets, PipeDream import, sweep
void bind_defaults(pybind11::module_& m);   // bucket policy, profiler defaults

}  // namespace hybridplan::python
