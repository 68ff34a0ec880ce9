#include "executor/grad_buckets.h"

#include <map>

#include "common/error.h"

namespace hybridplan {

std::vector<std::vector<int32_t>> assign_grad_buckets(const std::vector<int64_t>& param_bytes,
                                                      int64_t bucket_cap_bytes,
                                                      const std::vector<std::string>& keys) {
  if (bucket_cap_bytes < 1) {
    throw InputError("bucket_cap_bytes must be >= 1 (got " + std::to_string(bucket_cap_bytes) + ")");
  }
  if (!keys.empty() && keys.size() != param_bytes.size()) {
    throw InputError("bucket keys must be empty or one per parameter (got " +
                     std::to_string(keys.size()) + " keys for " +
                     std::to_string(param_bytes.size()) + " parameters)");
  }
  struct OpenBucket {
    size_t index = 0;  // into `buckets`
    int64_t filled_bytes = 0;
  };
  std::vector<std::vector<int32_t>> buckets;
  std::map<std::string, OpenBucket> open;  // key -> the bucket that key is filling
  for (int32_t i = static_cast<int32_t>(param_bytes.size()) - 1; i >= 0; --i) {
    if (param_bytes[i] < 0) {
      throw InputError("param_bytes[" + std::to_string(i) + "] must be >= 0 (got " +
                       std::to_string(param_bytes[i]) + ")");
    }
    const std::string key = keys.empty() ? std::string() : keys[i];
    auto it = open.find(key);
    if (it == open.end() || it->second.filled_bytes + param_bytes[i] > bucket_cap_bytes) {
      buckets.emplace_back();
      it = open.insert_or_assign(key, OpenBucket{buckets.size() - 1, 0}).first;
    }
    buckets[it->second.index].push_back(i);
    it->second.filled_bytes += param_bytes[i];
  }
  return buckets;
}

}  // namespace hybridplan
