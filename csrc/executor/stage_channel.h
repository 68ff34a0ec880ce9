// StageChannel: point-to-point tensors between neighbouring pipeline stages of one replica over
// c10d send/recv (activations forward, their gradients backward). A receiver cannot know an
// activation's shape in advance (the last micro-batch may be smaller), so every tensor travels
// as a fixed-size header (dtype and shape) followed by its data. Sends are asynchronous and
// complete in wait_sends(); receives block, bounded by the group's timeout.
#pragma once
#include <chrono>
#include <cstdint>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/torch.h>

namespace hybridplan {

class StageChannel {
 public:
  // `group`: a backend containing this rank and its neighbours, addressed by group rank.
  // `device`: where received tensors are placed (the stage's device; Gloo needs CPU buffers).
  StageChannel(c10::intrusive_ptr<c10d::Backend> group, torch::Device device,
               std::chrono::milliseconds timeout);

  // Tags keep concurrent streams apart: pass a different tag per (micro-batch, direction).
  void send(const torch::Tensor& tensor, int peer, int tag);
  torch::Tensor recv(int peer, int tag);
  void wait_sends();  // every send issued so far has completed (or throws after the timeout)

 private:
  static constexpr int64_t kMaxDims = 8;
  c10::intrusive_ptr<c10d::Backend> group_;
  torch::Device device_;
  std::chrono::milliseconds timeout_;
  std::vector<c10::intrusive_ptr<c10d::Work>> pending_sends_;
  std::vector<torch::Tensor> in_flight_;  // keeps sent buffers alive until their send completes
};

}  // namespace hybridplan
