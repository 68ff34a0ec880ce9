#include "executor/dist_env.h"

#include <cstdlib>

#include "common/error.h"

namespace hybridplan {
namespace {

constexpr const char* kSource = "environment";

std::string required(const GetEnv& getenv, const std::string& name) {
  std::optional<std::string> value = getenv(name);
  if (!value || value->empty()) {
    throw_input_error(kSource, name,
                      "must be set (launch with torchrun, or set RANK, WORLD_SIZE, MASTER_ADDR and "
                      "MASTER_PORT)",
                      "unset");
  }
  return *value;
}

int64_t parse_int(const std::string& name, const std::string& text, int64_t lo, int64_t hi,
                  const std::string& range) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v < lo || v > hi) {
    throw_input_error(kSource, name, "must be an integer in " + range, "\"" + text + "\"");
  }
  return v;
}

}  // namespace

DistEnv dist_env_from_environment(const GetEnv& getenv) {
  DistEnv env;
  env.world_size = parse_int("WORLD_SIZE", required(getenv, "WORLD_SIZE"), 1, 1 << 20, "1..");
  env.rank = parse_int("RANK", required(getenv, "RANK"), 0, env.world_size - 1,
                       "0..WORLD_SIZE-1 = 0.." + std::to_string(env.world_size - 1));
  env.master_addr = required(getenv, "MASTER_ADDR");
  env.master_port = parse_int("MASTER_PORT", required(getenv, "MASTER_PORT"), 1, 65535, "1..65535");
  if (std::optional<std::string> local = getenv("LOCAL_RANK"); local && !local->empty()) {
    env.local_rank = parse_int("LOCAL_RANK", *local, 0, env.world_size - 1,
                               "0..WORLD_SIZE-1 = 0.." + std::to_string(env.world_size - 1));
  }
  return env;
}

DistEnv dist_env_from_environment() {
  return dist_env_from_environment([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace hybridplan
