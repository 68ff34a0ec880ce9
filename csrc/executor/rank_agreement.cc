#include "executor/rank_agreement.h"

#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/version.h>

#include "common/error.h"

namespace hybridplan {

std::string fingerprint_to_string(const RankFingerprint& f) {
  return nlohmann::json{{"plan_sha256", f.plan_sha256},
                        {"plan", f.plan_summary},
                        {"params_sha256", f.params_sha256},
                        {"params", f.params_summary},
                     {"torch_version", f.torch_version},
                     {"hybridplan_version", f.hybridplan_version}}
      .dump();
}

RankFingerprint fingerprint_from_string(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  HP_INTERNAL_ASSERT(j.is_object() && j.contains("plan_sha256") && j.contains("params_sha256"),
                     "malformed rank fingerprint " << text);
  return {j.at("plan_sha256").get<std::string>(), j.value("plan", ""),
          j.at("params_sha256").get<std::string>(), j.value("params", ""),
          j.value("torch_version", ""), j.value("hybridplan_version", "")};
}

std::string local_torch_version() { return TORCH_VERSION; }

std::string local_hybridplan_version() { return HYBRIDPLAN_VERSION; }  // cmake/torch.cmake

std::optional<std::string> describe_version_difference(int64_t rank_a, const std::string& torch_a,
                                                       const std::string& hybridplan_a, int64_t rank_b,
                                                       const std::string& torch_b,
                                                       const std::string& hybridplan_b) {
  if (torch_a == torch_b && hybridplan_a == hybridplan_b) return std::nullopt;
  const std::string a = std::to_string(rank_a), b = std::to_string(rank_b);
  return "rank " + a + " and rank " + b + " run different versions: rank " + a + " has torch " +
         torch_a + ", hybridplan " + hybridplan_a + "; rank " + b + " has torch " + torch_b +
         ", hybridplan " + hybridplan_b + "; every rank must run the same torch and hybridplan versions";
}

std::optional<std::string> describe_disagreement(const std::vector<RankFingerprint>& fingerprints) {
  for (size_t r = 1; r < fingerprints.size(); ++r) {
    const RankFingerprint& a = fingerprints[0];
    const RankFingerprint& b = fingerprints[r];
    if (auto message = describe_version_difference(0, a.torch_version, a.hybridplan_version,
                                                   static_cast<int64_t>(r), b.torch_version,
                                                   b.hybridplan_version)) {
      return message;
    }
  }
  for (size_t r = 1; r < fingerprints.size(); ++r) {
    const RankFingerprint& a = fingerprints[0];
    const RankFingerprint& b = fingerprints[r];
    const std::string ranks = "rank 0 and rank " + std::to_string(r);
    if (a.plan_sha256 != b.plan_sha256) {
      return ranks + " hold different plans: rank 0 has " + a.plan_summary + " (plan sha256 " +
             a.plan_sha256.substr(0, 12) + "), rank " + std::to_string(r) + " has " + b.plan_summary +
             " (plan sha256 " + b.plan_sha256.substr(0, 12) +
             "); every rank must load the same plan and graph";
    }
    if (a.params_sha256 != b.params_sha256) {
      return ranks + " hold different model parameters: rank 0 has " + a.params_summary +
             " (sha256 " + a.params_sha256.substr(0, 12) + "), rank " + std::to_string(r) + " has " +
             b.params_summary + " (sha256 " + b.params_sha256.substr(0, 12) +
             "); every rank must build the same model";
    }
  }
  return std::nullopt;
}

void check_ranks_agree(c10d::Store& store, const std::string& key_prefix, int64_t rank,
                       int64_t world_size, const RankFingerprint& mine,
                       std::chrono::milliseconds timeout) {
  auto key = [&](int64_t r) { return key_prefix + "/" + std::to_string(r); };
  const std::string text = fingerprint_to_string(mine);
  store.set(key(rank), std::vector<uint8_t>(text.begin(), text.end()));
  std::vector<std::string> keys;
  for (int64_t r = 0; r < world_size; ++r) keys.push_back(key(r));
  try {
    store.wait(keys, timeout);
  } catch (const c10::Error&) {
    std::string missing;
    for (int64_t r = 0; r < world_size; ++r) {
      if (!store.check({key(r)})) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    std::ostringstream message;
    message << "rank " << rank << ": rank(s) " << missing << " did not report their plan within "
            << timeout.count() / 1000.0
            << " s (did they fail before reaching the executor, or run with another WORLD_SIZE?)";
    throw std::runtime_error(message.str());
  }
  std::vector<RankFingerprint> all;
  for (int64_t r = 0; r < world_size; ++r) {
    std::vector<uint8_t> value = store.get(key(r));
    all.push_back(fingerprint_from_string(std::string(value.begin(), value.end())));
  }
  // Rank 0 hosts the store: it must not exit (on a disagreement) before every rank has read the
  // fingerprints, or they would see a dropped connection instead of the disagreement.
  store.set(key_prefix + "/read/" + std::to_string(rank), std::vector<uint8_t>{1});
  if (rank == 0) {
    std::vector<std::string> read_keys;
    for (int64_t r = 0; r < world_size; ++r) read_keys.push_back(key_prefix + "/read/" + std::to_string(r));
    try {
      store.wait(read_keys, timeout);
    } catch (const c10::Error&) {
      // A rank that read nothing has failed on its own; what rank 0 reports stays accurate.
    }
  }
  if (std::optional<std::string> message = describe_disagreement(all)) {
    throw InputError("rank " + std::to_string(rank) + ": " + *message);
  }
}

}  // namespace hybridplan
