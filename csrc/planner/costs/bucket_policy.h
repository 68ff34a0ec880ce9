// Gradient bucket policy: which gradients are all-reduced together, shared by the cost model
// (allreduce_cost.h), the C++ executor (c10d::Reducer, executor/ddp_reducer.h) and the Python
// executor (DistributedDataParallel, given these caps through hybridplan._C). Torch-free.
//
// It is what DistributedDataParallel settles on (torch/nn/parallel/distributed.py, c10d's
// reducer.hpp kDefaultFirstBucketBytes / kDefaultBucketBytesCap, and Reducer::rebuild_buckets
// after the first iteration): gradients are packed in the order backward produces them (for a
// chain, the reverse of the parameters' registration order), the first bucket up to 1 MiB so its
// all-reduce starts early, every later bucket up to 25 MiB; a bucket closes once it holds at
// least its cap (c10d::compute_bucket_assignment_by_size), so it may exceed the cap by its last
// gradient. tests/python/test_bucket_policy.py holds this equal to the installed torch's DDP.
#pragma once
#include <cstdint>
#include <vector>

namespace hybridplan {

inline constexpr int64_t kBytesPerMiB = int64_t{1} << 20;
// DDP's first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES).
inline constexpr int64_t kDefaultFirstBucketCapBytes = 1 * kBytesPerMiB;
// DDP's bucket_cap_mb default: every bucket after the first.
inline constexpr int64_t kDefaultBucketCapBytes = 25 * kBytesPerMiB;

struct BucketCaps {
  int64_t first_bytes = kDefaultFirstBucketCapBytes;  // the bucket reduced first
  int64_t bytes = kDefaultBucketCapBytes;             // every later bucket

  // One cap for every bucket, as DDP does when bucket_cap_mb is given.
  static constexpr BucketCaps uniform(int64_t cap_bytes) { return {cap_bytes, cap_bytes}; }
};

// The bytes of each bucket, in reduction order, for gradients of `grad_bytes` bytes given in the
// order they become ready (one dtype and device: DDP never mixes those in a bucket). Throws
// InputError for a cap < 1 or a negative size.
std::vector<int64_t> bucket_bytes(const std::vector<int64_t>& grad_bytes, BucketCaps caps = {});

}  // namespace hybridplan
