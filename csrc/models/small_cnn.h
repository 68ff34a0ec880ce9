// A small image classifier as a torch::nn::Sequential, for the executor's tests and examples:
//   0 Conv2d(in_channels, 16, 3, padding 1)   1 ReLU   2 MaxPool2d(2)
//   3 Conv2d(16, 32, 3, padding 1)            4 ReLU   5 MaxPool2d(2)
//   6 Flatten   7 Linear(32 * (image_size / 4)^2, num_classes)
// Input: [batch, in_channels, image_size, image_size] floats.
#pragma once
#include <cstdint>

#include <torch/torch.h>

namespace hybridplan::models {

struct SmallCnnOptions {
  int64_t in_channels = 3;
  int64_t num_classes = 10;
  int64_t image_size = 32;  // a multiple of 4 (two 2x2 poolings)
};

torch::nn::Sequential small_cnn(const SmallCnnOptions& options = {});

}  // namespace hybridplan::models
