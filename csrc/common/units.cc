#include "common/units.h"

#include <cmath>
#include <cstdio>

namespace hybridplan {
namespace {

std::string printf_string(const char* fmt, double value, const char* unit) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, value, unit);
  return buf;
}

// Three significant digits without exponent notation: 1.23, 12.3, 123, 1234.
std::string three_digits(double value, const char* unit) {
  const double a = std::fabs(value);
  const char* fmt = a < 10 ? "%.2f %s" : (a < 100 ? "%.1f %s" : "%.0f %s");
  return printf_string(fmt, value, unit);
}

}  // namespace

std::string format_bytes(double bytes) {
  if (!std::isfinite(bytes)) return "inf B";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = bytes;
  int unit = 0;
  while (std::fabs(value) >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  if (unit == 0) return printf_string("%.0f %s", value, units[0]);
  return printf_string(std::fabs(value) < 10 ? "%.2f %s" : "%.1f %s", value, units[unit]);
}

std::string format_seconds(double seconds) {
  if (!std::isfinite(seconds)) return "inf";
  const double a = std::fabs(seconds);
  if (a == 0) return "0 s";
  if (a < 1e-6) return printf_string("%.0f %s", seconds * 1e9, "ns");
  if (a < 1e-3) return three_digits(seconds * 1e6, "us");
  if (a < 1) return three_digits(seconds * 1e3, "ms");
  if (a < 120) return three_digits(seconds, "s");
  if (a < 7200) return three_digits(seconds / 60, "min");
  if (a < 2 * 86400) return three_digits(seconds / 3600, "h");
  return three_digits(seconds / 86400, "days");
}

std::string format_count(double count) {
  if (!std::isfinite(count)) return "inf";
  const double a = std::fabs(count);
  if (a < 1e3) return printf_string("%.4g%s", count, "");
  // "2.50 M" -> "2.50M": a count reads as one word.
  const auto joined = [](std::string text) { return text.erase(text.find(' '), 1); };
  if (a < 1e6) return joined(three_digits(count / 1e3, "k"));
  if (a < 1e9) return joined(three_digits(count / 1e6, "M"));
  return joined(three_digits(count / 1e9, "G"));
}

std::string format_bandwidth(double bytes_per_s) {
  if (!std::isfinite(bytes_per_s)) return "inf";
  if (bytes_per_s >= 1e9) return three_digits(bytes_per_s / 1e9, "GB/s");
  if (bytes_per_s >= 1e6) return three_digits(bytes_per_s / 1e6, "MB/s");
  return three_digits(bytes_per_s / 1e3, "kB/s");
}

}  // namespace hybridplan
