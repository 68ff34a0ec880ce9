// Running the helper programs the CLI delegates to: python3 (for plots) and torchrun (probe).
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace hybridplan::cli {

// The full path of `program` on $PATH (or `program` itself if it contains '/' and is
// executable); empty when not found.
std::optional<std::string> find_program(const std::string& program);

// The repository's python/ directory: $HYBRIDPLAN_SOURCE_DIR/python, else the source dir this
// binary was built from (compile definition HYBRIDPLAN_SOURCE_DIR).
std::string python_package_dir();

// Prepends python_package_dir() to $PYTHONPATH of this process (children inherit it).
void export_python_path();

// Runs argv (argv[0] found on $PATH) as a child process, waits, returns its exit status
// (128 + signal when it was killed). Throws InputError when argv[0] is not found.
int run_program(const std::vector<std::string>& argv);

// Replaces this process with argv (argv[0] found on $PATH); returns only by throwing
// InputError when it cannot be started.
[[noreturn]] void exec_program(const std::vector<std::string>& argv);

}  // namespace hybridplan::cli
