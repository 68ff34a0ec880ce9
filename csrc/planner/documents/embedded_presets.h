// The preset files compiled into the binary: the table is generated at build time by
// cmake/embed_presets.cmake from presets/*.json. Use planner/documents/presets.h instead.
#pragma once

namespace hybridplan::detail {

struct EmbeddedPreset {
  const char* name;       // file name without ".json"
  const char* json_text;  // the file's bytes
};

// Sorted by name, terminated by {nullptr, nullptr}.
extern const EmbeddedPreset kEmbeddedPresets[];

}  // namespace hybridplan::detail
