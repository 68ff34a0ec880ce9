#include "executor/lost_peer.h"

#include <algorithm>
#include <thread>
#include <typeinfo>

#include <c10/util/Exception.h>
#include <c10/util/Type.h>

namespace hybridplan {
namespace {

// lost_peer.py's is_communication_error markers (tests/data/rank_messages.json checks both).
constexpr const char* kCommunicationMarkers[] = {
    "Connection closed by peer", "Connection reset by peer", "Connection refused",
    "Broken pipe", "Timed out waiting", "timed out", "Timeout", "gloo", "Gloo", "NCCL", "Socket"};

std::string ranks_text(const std::vector<int64_t>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

}  // namespace

std::string alive_key(const std::string& incident, int64_t rank) {
  return "hybridplan/alive/" + incident + "/" + std::to_string(rank);
}

bool is_communication_error_text(const std::string& text) {
  return std::any_of(std::begin(kCommunicationMarkers), std::end(kCommunicationMarkers),
                     [&](const char* marker) { return text.find(marker) != std::string::npos; });
}

bool is_communication_error(const std::exception& error) {
  return dynamic_cast<const c10::DistError*>(&error) != nullptr ||
         is_communication_error_text(error_text(error));
}

std::optional<std::vector<int64_t>> lost_ranks(c10d::Store& store, const std::string& incident,
                                               int64_t rank, int64_t world_size,
                                               std::chrono::milliseconds grace) {
  try {
    store.set(alive_key(incident, rank), std::vector<uint8_t>{'1'});
    const auto deadline = std::chrono::steady_clock::now() + grace;
    std::vector<int64_t> missing;
    for (int64_t r = 0; r < world_size; ++r) {
      if (r != rank) missing.push_back(r);
    }
    while (!missing.empty() && std::chrono::steady_clock::now() < deadline) {
      std::erase_if(missing, [&](int64_t r) { return store.check({alive_key(incident, r)}); });
      if (!missing.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return missing;
  } catch (const std::exception&) {  // the store is gone with its host
    return std::nullopt;
  }
}

std::string lost_peer_message(const std::string& what, int64_t rank,
                              const std::optional<std::vector<int64_t>>& missing,
                              const std::string& error_type, const std::string& error_text) {
  std::string who;
  if (!missing) {
    who = "rank 0 lost or timed out (it hosts the job's rendezvous store, which cannot be reached)";
  } else if (!missing->empty()) {
    who = ranks_text(*missing) + " lost or timed out";
  } else {
    who = "every rank reported alive, the transfer itself failed";
  }
  // Python: str(error).strip().splitlines()[0]
  const size_t begin = error_text.find_first_not_of(" \t\r\n\f\v");
  std::string first_line;
  if (begin != std::string::npos) {
    const std::string stripped =
        error_text.substr(begin, error_text.find_last_not_of(" \t\r\n\f\v") + 1 - begin);
    first_line = stripped.substr(0, stripped.find_first_of("\r\n"));
  }
  return "hybridplan: " + what + " failed on rank " + std::to_string(rank) + ": " + who + " (" +
         error_type + ": " + first_line + ")";
}

std::string error_type_name(const std::exception& error) {
  std::string name = c10::demangle(typeid(error).name());
  const size_t colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}

std::string error_text(const std::exception& error) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&error)) {
    return c10_error->what_without_backtrace();
  }
  return error.what();
}

}  // namespace hybridplan
