// Defaults and policies that the Python side shares with C++, defined once in the core and
// read from here (tests/python/test_bucket_policy.py holds them equal to torch's and to the
// Python profiler's defaults).
#include <pybind11/stl.h>

#include "common/profile_defaults.h"
#include "planner/costs/bucket_policy.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace hybridplan::python {

void bind_defaults(py::module_& m) {
  m.attr("kDefaultFirstBucketCapBytes") = kDefaultFirstBucketCapBytes;
  m.attr("kDefaultBucketCapBytes") = kDefaultBucketCapBytes;
  m.attr("kDefaultProfileWarmup") = kDefaultProfileWarmup;
  m.attr("kDefaultProfileRepeats") = kDefaultProfileRepeats;
  m.def(
      "bucket_bytes",
      [](const std::vector<int64_t>& grad_bytes, int64_t first_cap_bytes, int64_t cap_bytes) {
        return bucket_bytes(grad_bytes, BucketCaps{first_cap_bytes, cap_bytes});
      },
      py::arg("grad_bytes"), py::arg("first_cap_bytes") = kDefaultFirstBucketCapBytes,
      py::arg("cap_bytes") = kDefaultBucketCapBytes,
      "Bytes of each gradient bucket, in reduction order, for gradients given in the order they "
      "become ready (planner/costs/bucket_policy.h: DDP's policy).");
}

}  // namespace hybridplan::python
