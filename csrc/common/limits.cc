#include "common/limits.h"

#include "common/error.h"
#include "common/json_fields.h"

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

void check_accumulation_steps(const std::string& source, const std::string& path, int64_t value) {
  check_range(source, path, value, kMaxAccumulationSteps, "2^16 steps");
}

void check_device_count(const std::string& source, const std::string& path, int64_t value) {
  check_range(source, path, value, kMaxDevices, "2^20 devices");
}

void check_bytes_at_most(const std::string& source, const std::string& path, int64_t value) {
  if (value > kMaxBytes) {
    throw_input_error(source, path, "must be at most " + std::to_string(kMaxBytes) + " (2^50 bytes)",
                      std::to_string(value));
  }
}

void check_seconds_at_most(const std::string& source, const std::string& path, double value) {
  if (value > kMaxSeconds) {
    throw_input_error(source, path, "must be at most 1e9 s", json_number_text(value));
  }
}

}  // namespace hybridplan
