// The `hybridplan` subcommands. Each add_*_command registers one subcommand on the app; its
// callback does the work and reports failure by throwing InputError (exit 2) or
// InfeasibleError (exit 3), which main() turns into a message and an exit status.
#pragma once
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace hybridplan::cli {

void add_plan_command(CLI::App& app);
void add_evaluate_command(CLI::App& app);
void add_explain_command(CLI::App& app);
void add_sweep_command(CLI::App& app);
void add_presets_command(CLI::App& app);
void add_import_pipedream_command(CLI::App& app);
void add_probe_command(CLI::App& app);
void add_calibrate_command(CLI::App& app);
void add_validate_command(CLI::App& app);

// Replaces this process with `python3 -m hybridplan COMMAND REST...` (python_commands.cc).
[[noreturn]] void run_python(const std::string& command, const std::vector<std::string>& rest);

}  // namespace hybridplan::cli
