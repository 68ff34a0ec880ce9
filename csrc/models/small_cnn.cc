#include "models/small_cnn.h"

#include "common/error.h"

namespace hybridplan::models {

torch::nn::Sequential small_cnn(const SmallCnnOptions& options) {
  namespace nn = torch::nn;
  if (options.in_channels <= 0) {
    throw_input_error("models::small_cnn", "options.in_channels", "must be > 0",
                      std::to_string(options.in_channels));
  }
  if (options.num_classes <= 0) {
    throw_input_error("models::small_cnn", "options.num_classes", "must be > 0",
                      std::to_string(options.num_classes));
  }
  if (options.image_size <= 0 || options.image_size % 4 != 0) {
    throw_input_error("models::small_cnn", "options.image_size", "must be a positive multiple of 4",
                      std::to_string(options.image_size));
  }
  const int64_t pooled = options.image_size / 4;
  return nn::Sequential(
      nn::Conv2d(nn::Conv2dOptions(options.in_channels, 16, 3).padding(1)), nn::ReLU(),
      nn::MaxPool2d(nn::MaxPool2dOptions(2)),
      nn::Conv2d(nn::Conv2dOptions(16, 32, 3).padding(1)), nn::ReLU(),
      nn::MaxPool2d(nn::MaxPool2dOptions(2)), nn::Flatten(),
      nn::Linear(32 * pooled * pooled, options.num_classes));
}

}  // namespace hybridplan::models
