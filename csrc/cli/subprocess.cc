#include "cli/subprocess.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>

#include <sys/wait.h>
#include <unistd.h>

#include "common/error.h"

namespace hybridplan::cli {
namespace {

bool is_executable(const std::string& path) {
  return std::filesystem::is_regular_file(path) && ::access(path.c_str(), X_OK) == 0;
}

std::vector<char*> c_argv(const std::vector<std::string>& argv) {
  std::vector<char*> out;
  for (const std::string& a : argv) out.push_back(const_cast<char*>(a.c_str()));
  out.push_back(nullptr);
  return out;
}

std::string resolve_or_throw(const std::string& program) {
  const std::optional<std::string> path = find_program(program);
  if (!path) throw InputError(program + ": not found on PATH");
  // The child writes to the same terminal: what this process printed must come first.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  return *path;
}

}  // namespace

std::optional<std::string> find_program(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    return is_executable(program) ? std::optional<std::string>(program) : std::nullopt;
  }
  const char* path_env = std::getenv("PATH");
  std::istringstream dirs(path_env ? path_env : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
    if (is_executable(candidate)) return candidate;
  }
  return std::nullopt;
}

std::string environment_program(const std::string& program) {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    const std::filesystem::path sibling = self.parent_path() / program;
    if (is_executable(sibling.string())) return sibling.string();
  }
  return program;
}

int run_program(const std::vector<std::string>& argv) {
  const std::string path = resolve_or_throw(argv.at(0));
  std::vector<char*> args = c_argv(argv);
  const pid_t pid = ::fork();
  if (pid < 0) throw InputError(argv[0] + ": cannot start (" + std::strerror(errno) + ")");
  if (pid == 0) {
    ::execv(path.c_str(), args.data());
    ::_exit(127);  // exec failed; the parent reports the status
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw InputError(argv[0] + ": waitpid failed (" + std::strerror(errno) + ")");
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

void exec_program(const std::vector<std::string>& argv) {
  const std::string path = resolve_or_throw(argv.at(0));
  std::vector<char*> args = c_argv(argv);
  ::execv(path.c_str(), args.data());
  throw InputError(argv[0] + ": cannot start (" + std::strerror(errno) + ")");
}

}  // namespace hybridplan::cli
