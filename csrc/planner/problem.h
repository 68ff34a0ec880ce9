// Problem: everything the planner reads. evaluate() and search() both take one.
#pragma once
#include "planner/cluster.h"
#include "planner/graph.h"
#include "planner/job.h"

namespace hybridplan {

struct Problem {
  Graph graph;
  Cluster cluster;
  Job job;
};

}  // namespace hybridplan
