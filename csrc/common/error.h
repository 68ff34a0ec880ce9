// Errors that cross the library boundary. User errors (bad JSON, bad flags) are InputError: the
// CLI exits 2, Python sees ValueError. A request no plan can satisfy is InfeasibleError: exit 3.
// Broken invariants inside the library use HP_INTERNAL_ASSERT, never abort().
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace hybridplan {

class InputError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class InfeasibleError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

// "<source>: <json_path> <rule> (got <got>)", e.g.
// "graph.json: nodes[3].forward_s must be finite and >= 0 (got -1)".
std::string input_error_message(const std::string& source, const std::string& json_path,
                                const std::string& rule, const std::string& got);

[[noreturn]] void throw_input_error(const std::string& source, const std::string& json_path,
                                   const std::string& rule, const std::string& got);

}  // namespace hybridplan

#define HP_INTERNAL_ASSERT(cond, msg)                                                     \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::ostringstream hp_assert_os_;                                                   \
      hp_assert_os_ << __FILE__ << ":" << __LINE__ << ": internal error: " #cond ": " << msg; \
      throw ::hybridplan::InternalError(hp_assert_os_.str());                             \
    }                                                                                     \
  } while (0)
