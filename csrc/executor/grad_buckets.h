// Gradient buckets: which parameters' gradients are all-reduced together, as PyTorch DDP does
// (https://pytorch.org/docs/stable/notes/ddp.html#internal-design). A pure function, tested
// without a process group.
//
// Backward produces gradients roughly in reverse registration order (the last layer first), so
// buckets are filled walking the parameters from last to first: a bucket is launched as soon as
// its last gradient is ready, and its all-reduce overlaps the backward of earlier layers.
// A bucket closes when adding the next parameter would take it past `bucket_cap_bytes`; a single
// parameter larger than the cap gets a bucket of its own. Parameters with different keys (DDP
// keys by device and dtype: one bucket is one flat tensor) never share a bucket; each key fills
// its own open bucket.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace hybridplan {

inline constexpr int64_t kDefaultBucketCapBytes = 25 * 1024 * 1024;  // DDP's bucket_cap_mb=25

// param_bytes[i]: gradient bytes of parameter i (registration order); keys: empty (one key) or
// one per parameter. Returns the buckets in launch order (the order they were opened); each
// lists parameter indices in the order their gradients are expected (descending index). Every
// parameter appears in exactly one bucket. Throws InputError for a cap < 1, a negative size or a
// keys vector of the wrong length.
std::vector<std::vector<int32_t>> assign_grad_buckets(const std::vector<int64_t>& param_bytes,
                                                      int64_t bucket_cap_bytes = kDefaultBucketCapBytes,
                                                      const std::vector<std::string>& keys = {});

}  // namespace hybridplan
