// Before the first step every rank checks that all ranks run the same torch and hybridplan
// versions and hold the same plan and the same model parameter shapes, as DDP verifies parameters
// across ranks at construction. The version rule and message are the Python executor's
// (rank_agreement.py describe_version_difference; tests/data/rank_messages.json holds both). A disagreement ends
// every rank with a message naming two ranks that differ; a rank that never reports ends the
// others after the timeout, naming it. Nothing here can hang: the exchange goes through the
// TCPStore with a bounded wait, before any collective is issued.
#pragma once
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace hybridplan {

// What one rank holds, summarised: sha256 of the plan's canonical JSON and of the parameter
// list ("name:shape" lines), plus short human-readable descriptions of both.
struct RankFingerprint {
  std::string plan_sha256;
  std::string plan_summary;  // "placement dp=2 mp=1 batch 8/16, graph mlp 3fa2c1d0"
  std::string params_sha256;
  std::string params_summary;  // "5 parameter tensors, 1224 values"
  std::string torch_version;       // the LibTorch this binary was built against (TORCH_VERSION)
  std::string hybridplan_version;  // the hybridplan project version (CMake PROJECT_VERSION)
};

// This process's torch and hybridplan versions.
std::string local_torch_version();
std::string local_hybridplan_version();

// Pure: the message when two ranks run different torch or hybridplan versions, else nullopt.
std::optional<std::string> describe_version_difference(int64_t rank_a, const std::string& torch_a,
                                                       const std::string& hybridplan_a, int64_t rank_b,
                                                       const std::string& torch_b,
                                                       const std::string& hybridplan_b);

std::string fingerprint_to_string(const RankFingerprint& f);
RankFingerprint fingerprint_from_string(const std::string& text);

// Pure: the first disagreement between rank 0 and another rank, as a message naming both, or
// nullopt when all agree. fingerprints[r] is rank r's. Versions are compared first (another
// torch can explain any other difference), then plans, then parameters.
std::optional<std::string> describe_disagreement(const std::vector<RankFingerprint>& fingerprints);

// Publishes `mine` under `key_prefix` in the store, waits at most `timeout` for every rank's,
// and throws InputError (disagreement) or std::runtime_error (a rank that did not report) on
// every rank alike. `key_prefix` must be the same on all ranks and new for every check.
void check_ranks_agree(c10d::Store& store, const std::string& key_prefix, int64_t rank,
                       int64_t world_size, const RankFingerprint& mine,
                       std::chrono::milliseconds timeout);

}  // namespace hybridplan
