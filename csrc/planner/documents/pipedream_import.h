// Reads a PipeDream layer profile (msr-fiddle/pipedream, profiler/*/profiles/<model>/graph.txt)
// into a Graph, so the planner runs on published real-GPU measurements.
//
// Format, one line per node, then tab-indented edge lines:
//   nodeN -- <module repr> -- forward_compute_time=<ms>, backward_compute_time=<ms>,
//            activation_size=<bytes or [a; b; ...]>, parameter_size=<bytes>
//   \tnodeA -- nodeB
#pragma once
#include <cstdint>
#include <istream>
#include <string>

#include "planner/documents/graph.h"

namespace hybridplan {

// The batch size PipeDream's image profiles were measured at (its profiler README); the
// translation (GNMT) profiles do not state theirs, so callers should pass it explicitly.
inline constexpr int64_t kPipeDreamDefaultBatchSize = 64;

// Node N becomes {id: N, name: "nodeN", op: the repr's leading identifier lower-cased}; times
// go from ms to s; a bracketed activation list is summed into output_bytes; every edge carries
// its source's output_bytes. `InputN` nodes get op "input" and zero time (PipeDream records the
// data loader's time there, which is not a layer's compute). `name` empty: the file name up to
// its first '.'. Throws InputError naming the file and line number.
Graph import_pipedream(const std::string& path, int64_t batch_size,
                       const std::string& name = "");

// The same from a stream; `path` names the source in errors (and the default graph name).
Graph import_pipedream(std::istream& in, const std::string& path, int64_t batch_size,
                       const std::string& name = "");

}  // namespace hybridplan
