#include "planner/costs/bucket_policy.h"

#include <string>

#include "common/error.h"

namespace hybridplan {

std::vector<int64_t> bucket_bytes(const std::vector<int64_t>& grad_bytes, BucketCaps caps) {
  if (caps.first_bytes < 1 || caps.bytes < 1) {
    throw InputError("bucket caps must be >= 1 byte (got " + std::to_string(caps.first_bytes) +
                     ", " + std::to_string(caps.bytes) + ")");
  }
  std::vector<int64_t> buckets;
  int64_t open_bytes = 0;
  bool open = false;
  for (size_t i = 0; i < grad_bytes.size(); ++i) {
    if (grad_bytes[i] < 0) {
      throw InputError("grad_bytes[" + std::to_string(i) + "] must be >= 0 (got " +
                       std::to_string(grad_bytes[i]) + ")");
    }
    open_bytes += grad_bytes[i];
    open = true;
    if (open_bytes >= (buckets.empty() ? caps.first_bytes : caps.bytes)) {
      buckets.push_back(open_bytes);
      open_bytes = 0;
      open = false;
    }
  }
  if (open) buckets.push_back(open_bytes);
  return buckets;
}

}  // namespace hybridplan
