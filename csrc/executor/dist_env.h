// DistEnv: where this process sits in a torchrun job, read from the variables torchrun sets
// (https://pytorch.org/docs/stable/elastic/run.html#environment-variables). Torch-free.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace hybridplan {

struct DistEnv {
  int64_t rank = 0;        // RANK: global rank, 0..world_size-1
  int64_t world_size = 1;  // WORLD_SIZE: processes in the job
  int64_t local_rank = 0;  // LOCAL_RANK: rank on this node (selects the CUDA device); default 0
  std::string master_addr = "127.0.0.1";  // MASTER_ADDR: host of rank 0's TCPStore
  int64_t master_port = 29500;            // MASTER_PORT: its port, 1..65535
};

// Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (required) and LOCAL_RANK (optional) through
// `getenv` (std::getenv by default; tests pass a map). A missing or malformed variable is an
// InputError "environment: RANK must be an integer in 0..WORLD_SIZE-1 (got 7)".
using GetEnv = std::function<std::optional<std::string>(const std::string& name)>;
DistEnv dist_env_from_environment(const GetEnv& getenv);
DistEnv dist_env_from_environment();

}  // namespace hybridplan
