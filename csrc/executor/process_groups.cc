#include "executor/process_groups.h"

#include <algorithm>
#include <cstdlib>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "common/error.h"

namespace hybridplan {
namespace {

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

// The Gloo transport device, chosen as torch.distributed does: GLOO_SOCKET_IFNAME if set;
// loopback when the whole job is on this host (MASTER_ADDR is a loopback address); otherwise the
// address this host's name resolves to.
std::shared_ptr<::gloo::transport::Device> gloo_device(const DistEnv& env) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname != 0) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  if (is_loopback(env.master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// A ProcessGroup whose only backend is `backend`, for `device_type` (what
// torch.distributed.new_group builds around a backend).
c10::intrusive_ptr<c10d::ProcessGroup> with_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size, c10::DeviceType device_type,
                                                    c10d::ProcessGroup::BackendType type,
                                                    c10::intrusive_ptr<c10d::Backend> backend) {
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  group->setBackend(device_type, type, backend);
  group->setDefaultBackend(type);
  return group;
}

}  // namespace

c10::intrusive_ptr<c10d::Store> connect_store(const DistEnv& env, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(env.master_port);
  options.isServer = env.rank == 0;
  options.numWorkers = static_cast<int>(env.world_size);
  options.waitWorkers = true;
  options.timeout = timeout;
  return c10::make_intrusive<c10d::TCPStore>(env.master_addr, options);
}

c10::intrusive_ptr<c10d::ProcessGroup> new_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 const std::string& name,
                                                 const std::vector<int64_t>& ranks,
                                                 const DistEnv& env, c10::DeviceType device_type,
                                                 std::chrono::milliseconds timeout) {
  auto me = std::find(ranks.begin(), ranks.end(), env.rank);
  HP_INTERNAL_ASSERT(me != ranks.end(), "rank " << env.rank << " is not a member of group " << name);
  const int group_rank = static_cast<int>(me - ranks.begin());
  const int group_size = static_cast<int>(ranks.size());
  auto group_store = c10::make_intrusive<c10d::PrefixStore>("hybridplan/" + name, store);
  if (device_type == c10::DeviceType::CUDA) {
#ifdef USE_C10D_NCCL
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    return with_backend(group_store, group_rank, group_size, device_type,
                        c10d::ProcessGroup::BackendType::NCCL,
                        c10::make_intrusive<c10d::ProcessGroupNCCL>(group_store, group_rank, group_size, options));
#else
    throw InputError("a CUDA plan needs the NCCL backend, which this LibTorch was built without");
#endif
  }
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(gloo_device(env));
  return with_backend(group_store, group_rank, group_size, device_type,
                      c10d::ProcessGroup::BackendType::GLOO,
                      c10::make_intrusive<c10d::ProcessGroupGloo>(group_store, group_rank, group_size, options));
}

}  // namespace hybridplan
