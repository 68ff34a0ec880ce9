// hybridplan probe: measures this machine's links and devices. The measuring is Python
// (`python -m hybridplan probe`, one process per device under torchrun); this subcommand is
// the launcher, so `hybridplan probe ...` and the documented torchrun line are the same thing.
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/subprocess.h"
#include "common/error.h"

namespace hybridplan::cli {
namespace {

struct ProbeFlags {
  int64_t nproc_per_node = 2;
};

[[noreturn]] void run_probe(const ProbeFlags& flags, const std::vector<std::string>& rest) {
  const std::string torchrun = environment_program("torchrun");
  if (!find_program(torchrun)) {
    throw InputError("probe: torchrun not found on PATH; it comes with PyTorch "
                     "(pip install torch), and probe runs `torchrun --nproc-per-node N -m "
                     "hybridplan probe ...`");
  }
  std::vector<std::string> argv = {torchrun, "--nproc-per-node",
                                   std::to_string(flags.nproc_per_node), "-m", "hybridplan",
                                   "probe"};
  argv.insert(argv.end(), rest.begin(), rest.end());
  exec_program(argv);
}

}  // namespace

void add_probe_command(CLI::App& app) {
  auto flags = std::make_shared<ProbeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "probe",
      "Measure this machine (runs `torchrun --nproc-per-node N -m hybridplan probe ARGS...`; "
      "ARGS go to the Python probe)");
  cmd->add_option("--nproc-per-node", flags->nproc_per_node, "Processes (devices) to probe")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->allow_extras();
  cmd->callback([flags, cmd] { run_probe(*flags, cmd->remaining()); });
}

}  // namespace hybridplan::cli
