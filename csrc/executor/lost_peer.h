// Which rank was lost: the C++ twin of python/hybridplan/executor/lost_peer.py, with the same
// store key protocol, grace period and message (tests/data/rank_messages.json holds the two
// together). When a collective or send/recv of a step fails (a peer was killed, its host died,
// or it stopped answering within the timeout), Gloo's error names a socket address or just a
// timeout, not a rank. Every rank whose step fails sets `hybridplan/alive/<incident>/<rank>` in
// the job's TCPStore and waits kLostPeerGraceS for the others' keys; the ranks that did not
// report are named as lost or timed out. If the store itself cannot be reached, its host (rank 0)
// is the one lost. No heartbeat thread: the store is only used once a step has already failed.
#pragma once
#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace hybridplan {

inline constexpr double kLostPeerGraceS = 3.0;  // lost_peer.py's kGraceS

// "hybridplan/alive/<incident>/<rank>"
std::string alive_key(const std::string& incident, int64_t rank);

// A failure of the transport (c10d/Gloo/NCCL/store), not of the user's model code: a c10::DistError,
// or an error whose text has one of the markers lost_peer.py's is_communication_error looks for.
bool is_communication_error(const std::exception& error);
bool is_communication_error_text(const std::string& text);

// The ranks that did not report alive within `grace` of this rank's report, or nullopt if the
// store cannot be reached.
std::optional<std::vector<int64_t>> lost_ranks(c10d::Store& store, const std::string& incident,
                                               int64_t rank, int64_t world_size,
                                               std::chrono::milliseconds grace);

// Pure: "hybridplan: <what> failed on rank <rank>: rank K lost or timed out (<type>: <first line
// of error_text>)"; `missing` nullopt: the store's host, rank 0, is named.
std::string lost_peer_message(const std::string& what, int64_t rank,
                              const std::optional<std::vector<int64_t>>& missing,
                              const std::string& error_type, const std::string& error_text);

// The error's class name without namespaces ("DistBackendError", "runtime_error") and its
// message without a C++ backtrace.
std::string error_type_name(const std::exception& error);
std::string error_text(const std::exception& error);

}  // namespace hybridplan
