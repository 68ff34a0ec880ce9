// How many steps a profiler runs by default, shared by the C++ profiler (profiler/profile.h) and
// the Python one (hybridplan.profile, which reads them from hybridplan._C). Torch-free, so the
// bindings expose them without LibTorch; tests/python/test_bucket_policy.py holds Python's
// defaults equal to these.
#pragma once

namespace hybridplan {

inline constexpr int kDefaultProfileWarmup = 3;    // unrecorded steps before timing
inline constexpr int kDefaultProfileRepeats = 11;  // timed steps; per-node times are their median

}  // namespace hybridplan
