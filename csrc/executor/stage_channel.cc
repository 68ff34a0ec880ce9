#include "executor/stage_channel.h"

#include <string>

#include "common/error.h"

namespace hybridplan {

StageChannel::StageChannel(c10::intrusive_ptr<c10d::Backend> group, torch::Device device,
                           std::chrono::milliseconds timeout)
    : group_(std::move(group)), device_(device), timeout_(timeout) {}

// Header layout (int64): [scalar type, ndim, size_0 .. size_{kMaxDims-1}]. Header tag 2*tag,
// data tag 2*tag+1, so a header is never matched with another message's data.
void StageChannel::send(const torch::Tensor& tensor, int peer, int tag) {
  HP_INTERNAL_ASSERT(tensor.dim() <= kMaxDims, "cannot send a " << tensor.dim() << "-d tensor");
  torch::Tensor header = torch::zeros({kMaxDims + 2}, torch::kLong);
  auto h = header.accessor<int64_t, 1>();
  h[0] = static_cast<int64_t>(tensor.scalar_type());
  h[1] = tensor.dim();
  for (int64_t d = 0; d < tensor.dim(); ++d) h[2 + d] = tensor.size(d);
  torch::Tensor data = tensor.detach().to(device_).contiguous();
  if (device_.is_cuda()) header = header.to(device_);
  for (torch::Tensor* t : {&header, &data}) {
    std::vector<torch::Tensor> tensors{*t};
    pending_sends_.push_back(group_->send(tensors, peer, t == &header ? 2 * tag : 2 * tag + 1));
    in_flight_.push_back(*t);
  }
}

torch::Tensor StageChannel::recv(int peer, int tag) {
  auto wait = [&](const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
    if (!work->wait(timeout_)) {
      throw std::runtime_error(std::string("receiving ") + what + " from group rank " +
                               std::to_string(peer) + " timed out");
    }
  };
  std::vector<torch::Tensor> header{torch::zeros({kMaxDims + 2}, torch::TensorOptions(torch::kLong).device(device_))};
  wait(group_->recv(header, peer, 2 * tag), "a tensor header");
  torch::Tensor h = header[0].cpu();
  auto dtype = static_cast<torch::ScalarType>(h[0].item<int64_t>());
  std::vector<int64_t> sizes;
  for (int64_t d = 0; d < h[1].item<int64_t>(); ++d) sizes.push_back(h[2 + d].item<int64_t>());
  std::vector<torch::Tensor> data{torch::empty(sizes, torch::TensorOptions(dtype).device(device_))};
  wait(group_->recv(data, peer, 2 * tag + 1), "tensor data");
  return data[0];
}

void StageChannel::wait_sends() {
  for (const auto& work : pending_sends_) {
    if (!work->wait(timeout_)) throw std::runtime_error("a pipeline send timed out");
  }
  pending_sends_.clear();
  in_flight_.clear();
}

}  // namespace hybridplan
