#include "common/limits.h"

#include "common/error.h"

namespace hybridplan {
namespace {

void check_range(const std::string& source, const std::string& path, int64_t value, int64_t max,
                 const char* what) {
  if (value < 1) throw_input_error(source, path, "must be >= 1", std::to_string(value));
  if (value > max) {
    throw_input_error(source, path, "must be at most " + std::to_string(max) + " (" + what + ")",
                      std::to_string(value));
  }
}

}  // namespace

void check_batch_size(const std::string& source, const std::string& path, int64_t value) {
  check_range(source, path, value, kMaxBatchSize, "2^24 samples");
}

void check_device_count(const std::string& source, const std::string& path, int64_t value) {
  check_range(source, path, value, kMaxDevices, "2^20 devices");
}

}  // namespace hybridplan
