// hybridplan: plan hybrid data-parallel x model-parallel training from the command line.
// Exit status: 0 ok, 2 bad input (message names the file, JSON path and rule), 3 infeasible
// (message says what does not fit and by how much), 1 internal error.
#include <iostream>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "common/error.h"

namespace {

constexpr int kExitInternal = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitInfeasible = 3;

int run(int argc, char** argv) {
  CLI::App app{"hybridplan: plan hybrid data-parallel x model-parallel training "
               "(Pal et al., IEEE Micro 2019)"};
  app.require_subcommand(1);
  hybridplan::cli::add_plan_command(app);
  hybridplan::cli::add_evaluate_command(app);
  hybridplan::cli::add_explain_command(app);
  hybridplan::cli::add_sweep_command(app);
  hybridplan::cli::add_presets_command(app);
  hybridplan::cli::add_import_pipedream_command(app);
  hybridplan::cli::add_probe_command(app);
  hybridplan::cli::add_calibrate_command(app);
  hybridplan::cli::add_validate_command(app);
  try {
    app.parse(argc, argv);  // runs the chosen subcommand's callback
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0; everything else is bad usage.
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitBadInput;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const hybridplan::InputError& e) {
    std::cerr << "hybridplan: error: " << e.what() << "\n";
    return kExitBadInput;
  } catch (const hybridplan::InfeasibleError& e) {
    std::cerr << "hybridplan: infeasible: " << e.what() << "\n";
    return kExitInfeasible;
  } catch (const hybridplan::InternalError& e) {
    std::cerr << "hybridplan: internal error (please report): " << e.what() << "\n";
    return kExitInternal;
  } catch (const std::exception& e) {
    std::cerr << "hybridplan: unexpected error (please report): " << e.what() << "\n";
    return kExitInternal;
  }
}
