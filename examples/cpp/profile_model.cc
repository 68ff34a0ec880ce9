// profile_model: profiles a C++ built-in model (csrc/models) and writes its Graph JSON.
//
//   build/bin/profile_model --model mlp --batch 32 --out mlp.json [--threads 1] [--repeats 11]
//                           [--clock wall|thread] [--device cpu]
//
// Bad input exits 2 with the message, like the hybridplan CLI. --threads defaults to 1 so that
// profiles on a shared machine are repeatable and comparable with a Python profile taken under
// torch.set_num_threads(1).
#include <iostream>

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include "common/error.h"
#include "models/builtin_models.h"
#include "profiler/profile.h"

int main(int argc, char** argv) {
  CLI::App app{"Profile a C++ built-in model into a hybridplan Graph JSON"};
  std::string model_name, out_path;
  int64_t batch_size = 32;
  int threads = 1;
  hybridplan::ProfileOptions options;
  app.add_option("--model", model_name, "built-in model: " + [] {
    std::string names;
    for (const auto& n : hybridplan::models::builtin_model_names()) names += n + " ";
    return names;
  }())->required();
  app.add_option("--batch", batch_size, "samples per profiled step")->capture_default_str();
  app.add_option("--out", out_path, "Graph JSON to write")->required();
  app.add_option("--device", options.device, "torch device")->capture_default_str();
  app.add_option("--threads", threads, "torch intra-op threads")->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", options.warmup, "unrecorded runs per block")->capture_default_str();
  app.add_option("--repeats", options.repeats, "recorded runs per block (median)")
      ->capture_default_str();
  app.add_option("--clock", options.clock, "wall, or thread: this thread's CPU time (--threads 1)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    torch::set_num_threads(threads);
    auto model = hybridplan::models::make_builtin_model(model_name, batch_size);
    options.name = model.name;
    options.batch_size = batch_size;
    const hybridplan::Graph graph =
        hybridplan::profile(*model.module, model.example_inputs, options);
    hybridplan::save_graph(graph, out_path);
    double step_s = 0;
    for (const auto& node : graph.nodes) step_s += node.forward_s + node.backward_s;
    std::cout << model.name << ": " << graph.nodes.size() << " nodes, forward+backward "
              << step_s * 1e3 << " ms at batch " << batch_size << " -> " << out_path << "\n";
  } catch (const hybridplan::InputError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
