// hybridplan import-pipedream: a PipeDream graph.txt profile -> a hybridplan Graph JSON.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "planner/documents/pipedream_import.h"

namespace hybridplan::cli {
namespace {

struct ImportFlags {
  std::string profile_path;
  std::string out_path;
  int64_t batch_size = kPipeDreamDefaultBatchSize;
  std::string name;
};

void run_import(const ImportFlags& flags) {
  const Graph graph = import_pipedream(flags.profile_path, flags.batch_size, flags.name);
  save_graph(graph, flags.out_path);
  std::cout << "imported " << graph.name << ": " << graph.nodes.size() << " nodes, "
            << graph.edges.size() << " edges, profiled batch " << graph.profiled.batch_size
            << " -> " << flags.out_path << "\n";
}

}  // namespace

void add_import_pipedream_command(CLI::App& app) {
  auto flags = std::make_shared<ImportFlags>();
  CLI::App* cmd = app.add_subcommand(
      "import-pipedream",
      "Convert a PipeDream profile (profiler/*/profiles/<model>/graph.txt) into a graph JSON");
  cmd->add_option("profile", flags->profile_path, "PipeDream graph.txt")->required();
  cmd->add_option("--out,-o", flags->out_path, "Graph JSON to write")->required();
  cmd->add_option("--batch-size,-b", flags->batch_size,
                  "Batch size the profile was measured at: 64 for PipeDream's image models (its "
                  "profiler README); the translation (GNMT) profiles do not state theirs, so "
                  "pass it explicitly for those")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--name", flags->name, "Graph name (default: the file name up to its first '.')");
  cmd->callback([flags] { run_import(*flags); });
}

}  // namespace hybridplan::cli
