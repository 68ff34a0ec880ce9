#include "common/error.h"

namespace hybridplan {

std::string input_error_message(const std::string& source, const std::string& json_path,
                                const std::string& rule, const std::string& got) {
  std::string msg = source + ": " + json_path + " " + rule;
  if (!got.empty()) msg += " (got " + got + ")";
  return msg;
}

void throw_input_error(const std::string& source, const std::string& json_path,
                       const std::string& rule, const std::string& got) {
  throw InputError(input_error_message(source, json_path, rule, got));
}

}  // namespace hybridplan
