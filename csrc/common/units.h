// Human formatting of quantities for messages and `explain`. Bytes use binary units
// (1 GiB = 2^30 bytes) because device memory is sold in them; times pick the unit that keeps
// two to four significant digits readable.
#pragma once
#include <cstdint>
#include <string>

namespace hybridplan {

// 0 B, 512 B, 1.5 KiB, 23.4 MiB, 16.0 GiB, 1.2 TiB.
std::string format_bytes(double bytes);
// 850 ns, 12.3 us, 4.56 ms, 1.23 s, 12.5 min, 3.40 h, 2.10 days.
std::string format_seconds(double seconds);
// 1234.5 -> "1.23k", 2.5e6 -> "2.50M" (samples/s, FLOP/s).
std::string format_count(double count);
// Bandwidth: "25.0 GB/s" (decimal: links are quoted in 10^9 bytes/s).
std::string format_bandwidth(double bytes_per_s);

}  // namespace hybridplan
