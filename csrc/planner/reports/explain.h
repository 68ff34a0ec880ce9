// explain(plan): a plan as text for people: the configuration, the device mesh, which nodes
// run on each device or stage (names compressed: "features.[0-7], classifier.6"), the
// predicted breakdown with units, and memory per device.
#pragma once
#include <string>

#include "planner/documents/graph.h"
#include "planner/documents/plan.h"
#include "planner/documents/problem.h"

namespace hybridplan {

// Uses the node names stored in the plan (plan_from_json keeps them); "node <i>" otherwise.
std::string explain(const Plan& plan);
// Names from `graph`.
std::string explain(const Plan& plan, const Graph& graph);
// Also shows device memory capacity and the cluster's links.
std::string explain(const Problem& problem, const Plan& plan);

// "features.0, features.1, features.2, fc" -> "features.[0-2], fc"; at most `max_groups`
// groups, then "... (+N more)".
std::string compress_names(const std::vector<std::string>& names, size_t max_groups = 12);

}  // namespace hybridplan
