// Typed access to the fields of a JSON document being loaded. Each accessor checks presence
// and type and throws InputError "<source>: <json.path> <rule> (got <value>)", so nlohmann's
// type_error never reaches a user. Paths read like the document: "nodes[3].forward_s";
// the empty path is the document itself and prints as "top level".
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace hybridplan {

using Json = nlohmann::json;

// "nodes" + "forward_s" -> "nodes.forward_s"; "" + "nodes" -> "nodes".
std::string json_child_path(const std::string& parent, const std::string& key);
// "nodes" + 3 -> "nodes[3]".
std::string json_index_path(const std::string& parent, size_t index);
// A value as shown after "got": compact JSON, cut to 60 characters.
std::string json_value_text(const Json& v);
// A number as shown after "got": -1 (not -1.0), 0.0021, 2.5e+10, nan, inf.
std::string json_number_text(double v);

class JsonReader {
 public:
  explicit JsonReader(std::string source) : source_(std::move(source)) {}
  const std::string& source() const { return source_; }

  [[noreturn]] void fail(const std::string& path, const std::string& rule,
                         const std::string& got) const;
  [[noreturn]] void fail(const std::string& path, const std::string& rule, const char* got) const {
    fail(path, rule, std::string(got));
  }
  [[noreturn]] void fail(const std::string& path, const std::string& rule, const Json& got) const;

  // The document (or a member) must be a JSON object / array.
  const Json& object(const Json& v, const std::string& path) const;
  const Json& array(const Json& v, const std::string& path) const;

  // Member `key` of object `obj` at `obj_path`; required() throws "is required" when absent.
  const Json& required(const Json& obj, const std::string& obj_path, const std::string& key) const;
  const Json* optional(const Json& obj, const std::string& key) const;

  // Checks "schema_version": 1 and "kind": <kind> of a top-level document.
  void header(const Json& doc, const std::string& kind) const;

  // Scalars: an integer (a float is accepted only when integral, e.g. 1e9), a finite number,
  // a string, true/false.
  int64_t integer(const Json& v, const std::string& path) const;
  double number(const Json& v, const std::string& path) const;
  std::string string(const Json& v, const std::string& path) const;
  bool boolean(const Json& v, const std::string& path) const;

  // Required member shortcuts: field_int(obj, "nodes[3]", "param_bytes").
  int64_t field_int(const Json& obj, const std::string& obj_path, const std::string& key) const;
  double field_number(const Json& obj, const std::string& obj_path, const std::string& key) const;
  std::string field_string(const Json& obj, const std::string& obj_path,
                           const std::string& key) const;

 private:
  std::string source_;
};

}  // namespace hybridplan
