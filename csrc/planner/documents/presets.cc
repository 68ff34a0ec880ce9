// Cluster presets: presets/<name>.json, compiled in (see planner/documents/embedded_presets.h).
#include "planner/documents/presets.h"

#include <map>

#include "planner/documents/embedded_presets.h"

namespace hybridplan {
namespace {

const std::map<std::string, std::string>& preset_table() {
  static const std::map<std::string, std::string> table = [] {
    std::map<std::string, std::string> t;
    for (const detail::EmbeddedPreset* p = detail::kEmbeddedPresets; p->name != nullptr; ++p) {
      t.emplace(p->name, p->json_text);
    }
    return t;
  }();
  return table;
}

}  // namespace

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, text] : preset_table()) names.push_back(name);
  return names;  // std::map iterates in sorted order
}

const std::string* preset_json_text(const std::string& name) {
  const auto& table = preset_table();
  auto it = table.find(name);
  return it == table.end() ? nullptr : &it->second;
}

}  // namespace hybridplan
