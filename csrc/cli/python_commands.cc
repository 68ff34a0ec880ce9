// The subcommands whose work is Python (they measure or run torch): probe and calibrate run one
// process per device under torchrun, validate runs python3 (which launches torchrun per plan),
// and `plan --for TRAINER` runs python3 (what each trainer can run is defined once, in
// python/hybridplan/trainers).
// These subcommands are launchers, so `hybridplan calibrate ...` and the documented
// `torchrun --nproc-per-node N -m hybridplan calibrate ...` line are the same thing.
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/subprocess.h"
#include "common/error.h"

namespace hybridplan::cli {
namespace {

struct TorchrunFlags {
  int64_t nproc_per_node = 2;
};

[[noreturn]] void run_under_torchrun(const std::string& command, const TorchrunFlags& flags,
                                     const std::vector<std::string>& rest) {
  const std::string torchrun = environment_program("torchrun");
  if (!find_program(torchrun)) {
    throw InputError(command + ": torchrun not found on PATH; it comes with PyTorch (pip install "
                     "torch), and " + command + " runs `torchrun --nproc-per-node N -m hybridplan " +
                     command + " ...`");
  }
  std::vector<std::string> argv = {torchrun, "--standalone", "--nproc-per-node",
                                   std::to_string(flags.nproc_per_node), "-m", "hybridplan", command};
  argv.insert(argv.end(), rest.begin(), rest.end());
  exec_program(argv);
}

void add_torchrun_command(CLI::App& app, const std::string& name, const std::string& what) {
  auto flags = std::make_shared<TorchrunFlags>();
  CLI::App* cmd = app.add_subcommand(
      name, what + " (runs `torchrun --standalone --nproc-per-node N -m hybridplan " + name +
                " ARGS...`; ARGS go to the Python command, see python -m hybridplan " + name +
                " --help)");
  cmd->add_option("--nproc-per-node", flags->nproc_per_node, "Processes (devices) to measure")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->allow_extras();
  cmd->callback([flags, cmd, name] { run_under_torchrun(name, *flags, cmd->remaining()); });
}

}  // namespace

[[noreturn]] void run_python(const std::string& command, const std::vector<std::string>& rest) {
  const auto python = find_program(environment_program("python3"));
  if (!python) throw InputError(command + ": python3 not found on PATH");
  std::vector<std::string> argv = {*python, "-m", "hybridplan", command};
  argv.insert(argv.end(), rest.begin(), rest.end());
  exec_program(argv);
}

void add_probe_command(CLI::App& app) {
  add_torchrun_command(app, "probe", "Measure this machine's links and devices");
}

void add_calibrate_command(CLI::App& app) {
  add_torchrun_command(app, "calibrate",
                       "Measure what the executor pays on this machine (links, all-reduce, "
                       "runtime costs, shared cores) into a Cluster JSON");
}

void add_validate_command(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand(
      "validate",
      "Run plans of a model on this machine and show predicted beside measured (runs "
      "`python3 -m hybridplan validate ARGS...`)");
  cmd->allow_extras();
  cmd->callback([cmd] { run_python("validate", cmd->remaining()); });
}

}  // namespace hybridplan::cli
