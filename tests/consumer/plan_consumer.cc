// Plans a graph on a cluster preset with the installed torch-free planner.
//   plan_consumer GRAPH.json CLUSTER DEVICES
#include <hybridplan/planner/searches/search.h>

#include <cstdlib>
#include <iostream>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: plan_consumer GRAPH.json CLUSTER DEVICES\n";
    return 2;
  }
  hybridplan::Problem problem{hybridplan::load_graph(argv[1]), hybridplan::load_cluster(argv[2]),
                              hybridplan::default_job()};
  const hybridplan::SearchResult result =
      hybridplan::search(problem, {.devices = std::atoll(argv[3]), .top_k = 1});
  const hybridplan::Plan& best = result.plans.at(0);
  std::cout << "best plan: dp " << best.dp << " x mp " << best.mp << " "
            << hybridplan::mode_name(best.mode) << ", step " << best.predicted.step_s << " s\n";
  return 0;
}
