// Running the helper programs the CLI delegates to: python3 (for plots) and torchrun (probe).
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace hybridplan::cli {

// The full path of `program` on $PATH (or `program` itself if it contains '/' and is
// executable); empty when not found.
std::optional<std::string> find_program(const std::string& program);

// The Python-side program `program` ("python3", "torchrun") of the environment this command
// belongs to: the one next to this executable when there is one (pip installs the command into
// the same bin/ as its environment's python3 and torchrun), else `program` itself, to be looked
// up on PATH. Nothing about the source tree is baked in: the child imports whatever hybridplan
// that Python finds (the installed package, or a checkout's python/ on PYTHONPATH).
std::string environment_program(const std::string& program);

// Runs argv (argv[0] found on $PATH) as a child process, waits, returns its exit status
// (128 + signal when it was killed). Throws InputError when argv[0] is not found.
int run_program(const std::vector<std::string>& argv);

// Replaces this process with argv (argv[0] found on $PATH); returns only by throwing
// InputError when it cannot be started.
[[noreturn]] void exec_program(const std::vector<std::string>& argv);

}  // namespace hybridplan::cli
