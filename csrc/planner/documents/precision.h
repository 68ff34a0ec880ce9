// The precision a job trains in (Job "precision", copied into each Plan it plans; docs/
// training_step.md "Precision"). One definition of the names, their compute dtype and its bytes.
//
//   fp32  no mixed precision: every tensor in the graph's profiled dtype (the default)
//   bf16  parameters and compute in bfloat16, gradients reduced in fp32, fp32 master weights
//         and optimizer state (the executor: FSDP2's MixedPrecisionPolicy(param_dtype=bf16,
//         reduce_dtype=fp32) for sharded placement plans, torch.autocast around the forward
//         elsewhere)
//   fp16  the same in float16, with a loss scaler
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace hybridplan {

enum class Precision { kFp32, kBf16, kFp16 };

const char* precision_name(Precision p);  // "fp32" | "bf16" | "fp16"
std::optional<Precision> precision_from_name(const std::string& name);
// The rule for a bad name, for messages: must be one of "fp32", "bf16", "fp16".
const char* precision_rule();
// Bytes of one element of the compute dtype: 4 for fp32, 2 for bf16 and fp16.
int64_t precision_bytes(Precision p);
// The graph dtype name (Graph profiled.dtype) of a 16-bit precision: "bfloat16", "float16".
const char* precision_dtype(Precision p);

}  // namespace hybridplan
