// The largest sizes a document may state. Far beyond any real batch or cluster, and
// small enough that the planner's integer arithmetic on them (dp * mp, dp * per-replica batch,
// a batch doubled until it passes another) cannot overflow int64. Loaders and validate() check
// them here, once; nothing else re-derives them.
#pragma once
#include <cstdint>
#include <string>

namespace hybridplan {

inline constexpr int64_t kMaxBatchSize = int64_t{1} << 24;  // samples in one batch: 16,777,216
inline constexpr int64_t kMaxDevices = int64_t{1} << 20;    // devices in a cluster or plan: 1,048,576
// Gradient accumulation steps per optimizer step (Plan and Job accumulation_steps): 65,536.
// dp * per-replica batch * accumulation steps stays below 2^61.
inline constexpr int64_t kMaxAccumulationSteps = int64_t{1} << 16;
// A size in bytes, and the graph's total parameter (and output) bytes: 1 PiB. Times the
// optimizer's state copies it stays far below 2^63.
inline constexpr int64_t kMaxBytes = int64_t{1} << 50;
// Samples in an epoch: 2^50.
inline constexpr int64_t kMaxSamples = int64_t{1} << 50;
// One node's measured time for one batch: 10^9 s (31 years). Sums and batch scaling of such
// times stay finite; an infinite cost made the placement search read an empty partition.
inline constexpr double kMaxSeconds = 1e9;

// Throws InputError "<source>: <path> must be >= 1 (got v)" or "... must be at most 16777216
// (2^24 samples) (got v)".
void check_batch_size(const std::string& source, const std::string& path, int64_t value);
// The same for accumulation steps: 1..2^16.
void check_accumulation_steps(const std::string& source, const std::string& path, int64_t value);
// The same for a count of devices (or of nodes, replicas, stages): 1..2^20.
void check_device_count(const std::string& source, const std::string& path, int64_t value);
// "<path> must be at most 1125899906842624 (2^50 bytes)" for 0 <= value (the caller checks >= 0,
// with its own rule).
void check_bytes_at_most(const std::string& source, const std::string& path, int64_t value);
// "<path> must be at most 1e9 s" for a time.
void check_seconds_at_most(const std::string& source, const std::string& path, double value);

}  // namespace hybridplan
