// Cluster presets shipped with hybridplan (presets/*.json, embedded at build time so the
// CLI and the Python module work from any directory).
#pragma once
#include <string>
#include <vector>

namespace hybridplan {

std::vector<std::string> preset_names();                      // sorted
const std::string* preset_json_text(const std::string& name);  // nullptr: no such preset

}  // namespace hybridplan
