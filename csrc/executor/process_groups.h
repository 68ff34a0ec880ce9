// Process groups built in C++ from the torchrun environment, with no Python interpreter: a
// c10d::TCPStore hosted by rank 0, and c10d backends over it (Gloo on CPU, NCCL on CUDA).
//
// Gloo from pure C++: the torch wheel ships ProcessGroupGloo.hpp and exports the Gloo symbols
// from libtorch_cpu.so, but not the gloo headers ProcessGroupGloo.hpp includes. process_groups.cc
// is the only file that includes it, compiled against Debian's libgloo-dev headers
// (0.0~git20220518, older than torch's vendored gloo). That is ABI-safe only because this file
// uses nothing whose layout comes from gloo: Options::devices holds shared_ptrs made inside
// libtorch, ProcessGroupGloo's own members are pointers, and none of the header's inline gloo
// code (GlooStore, setTimeout) is instantiated here. Callers see only c10d::ProcessGroup and
// c10d::Backend.
#pragma once
#include <chrono>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "executor/dist_env.h"

namespace hybridplan {

// Connects to the job's TCPStore at MASTER_ADDR:MASTER_PORT (rank 0 hosts it), waiting at most
// `timeout` for all world_size processes to arrive.
c10::intrusive_ptr<c10d::Store> connect_store(const DistEnv& env, std::chrono::milliseconds timeout);

// A process group over the global ranks `ranks` (sorted, containing env.rank), rendezvousing
// under the store prefix `name` (unique per group, the same on every member), with one backend:
// Gloo for a CPU device, NCCL for CUDA (only in a LibTorch built with it). A ProcessGroup rather
// than the bare backend because c10d::Reducer and broadcast_coalesced take one. Every member
// must call this; non-members must not. Collectives and send/recv on it fail after `timeout`.
c10::intrusive_ptr<c10d::ProcessGroup> new_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 const std::string& name,
                                                 const std::vector<int64_t>& ranks,
                                                 const DistEnv& env, c10::DeviceType device_type,
                                                 std::chrono::milliseconds timeout);

}  // namespace hybridplan
