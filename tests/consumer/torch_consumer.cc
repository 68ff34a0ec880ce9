// Profiles a small LibTorch model with the installed hybridplan::torch.
#include <hybridplan/models/mlp.h>
#include <hybridplan/profiler/profile.h>

#include <iostream>

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential model = hybridplan::models::mlp({16, 32, 8});
  hybridplan::ProfileOptions options;
  options.name = "consumer_mlp";
  options.warmup = 1;
  options.repeats = 1;
  const hybridplan::Graph graph = hybridplan::profile(model, {torch::randn({4, 16})}, options);
  std::cout << "profiled " << graph.name << ": " << graph.nodes.size() << " nodes, sha256 "
            << hybridplan::graph_sha256(graph).substr(0, 12) << "\n";
  return graph.nodes.size() == 3 ? 0 : 1;
}
