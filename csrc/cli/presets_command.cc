// hybridplan presets: the cluster presets compiled into the binary.
#include <algorithm>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "common/json_io.h"
#include "planner/documents/presets.h"

namespace hybridplan::cli {
namespace {

void run_presets(bool json) {
  Json rows = Json::array();
  for (const std::string& name : preset_names()) {
    const Json preset = parse_json_text(*preset_json_text(name), "preset " + name);
    const int64_t devices =
        preset.value("num_nodes", int64_t{1}) * preset.value("devices_per_node", int64_t{1});
    rows.push_back({{"name", name},
                    {"description", preset.value("description", std::string())},
                    {"devices", devices}});
  }
  if (json) {
    std::cout << rows.dump(2) << "\n";
    return;
  }
  size_t width = 0;
  for (const Json& row : rows) width = std::max(width, row["name"].get<std::string>().size());
  for (const Json& row : rows) {
    const std::string name = row["name"];
    std::cout << name << std::string(width - name.size() + 2, ' ')
              << row["description"].get<std::string>() << "\n";
  }
}

}  // namespace

void add_presets_command(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand("presets", "List the cluster presets usable as --cluster NAME");
  cmd->add_flag("--json", *json, "Print name, description and device count as JSON");
  cmd->callback([json] { run_presets(*json); });
}

}  // namespace hybridplan::cli
