#include "planner/documents/precision.h"

namespace hybridplan {
namespace {

struct Row {
  Precision precision;
  const char* name;
  const char* dtype;
  int64_t bytes;
};
// The one table of the precisions: name, the compute dtype (as Graph profiled.dtype writes it)
// and its bytes.
constexpr Row kRows[] = {{Precision::kFp32, "fp32", "float32", 4},
                         {Precision::kBf16, "bf16", "bfloat16", 2},
                         {Precision::kFp16, "fp16", "float16", 2}};

const Row& row_of(Precision p) {
  for (const Row& r : kRows) {
    if (r.precision == p) return r;
  }
  return kRows[0];
}

}  // namespace

const char* precision_name(Precision p) { return row_of(p).name; }

std::optional<Precision> precision_from_name(const std::string& name) {
  for (const Row& r : kRows) {
    if (name == r.name) return r.precision;
  }
  return std::nullopt;
}

const char* precision_rule() { return "must be one of \"fp32\", \"bf16\", \"fp16\""; }

int64_t precision_bytes(Precision p) { return row_of(p).bytes; }

const char* precision_dtype(Precision p) { return row_of(p).dtype; }

}  // namespace hybridplan
