#include "common/json_fields.h"

#include <cmath>

#include "common/error.h"
#include "common/json_io.h"

namespace hybridplan {

std::string json_child_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

std::string json_index_path(const std::string& parent, size_t index) {
  return parent + "[" + std::to_string(index) + "]";
}

std::string json_value_text(const Json& v) {
  if (v.is_number_float()) return json_number_text(v.get<double>());
  std::string text = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  constexpr size_t kMaxChars = 60;
  if (text.size() > kMaxChars) text = text.substr(0, kMaxChars - 3) + "...";
  return text;
}

std::string json_number_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  return Json(v).dump();
}

static std::string shown_path(const std::string& path) {
  return path.empty() ? "top level" : path;
}

void JsonReader::fail(const std::string& path, const std::string& rule,
                      const std::string& got) const {
  throw_input_error(source_, shown_path(path), rule, got);
}

void JsonReader::fail(const std::string& path, const std::string& rule, const Json& got) const {
  fail(path, rule, json_value_text(got));
}

const Json& JsonReader::object(const Json& v, const std::string& path) const {
  if (!v.is_object()) fail(path, "must be a JSON object", v);
  return v;
}

const Json& JsonReader::array(const Json& v, const std::string& path) const {
  if (!v.is_array()) fail(path, "must be a JSON array", v);
  return v;
}

const Json& JsonReader::required(const Json& obj, const std::string& obj_path,
                                 const std::string& key) const {
  const auto it = obj.find(key);
  if (it == obj.end()) fail(json_child_path(obj_path, key), "is required", "");
  return *it;
}

const Json* JsonReader::optional(const Json& obj, const std::string& key) const {
  const auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

void JsonReader::header(const Json& doc, const std::string& kind) const {
  if (!doc.is_object()) {
    // "graph file x.json: expected a JSON object (got null)": says which document it is, since
    // `null`, `[]` or `3` tell nothing about what the file was meant to be.
    const std::string prefix = "hybridplan.";
    const std::string document = kind.rfind(prefix, 0) == 0 ? kind.substr(prefix.size()) : kind;
    throw InputError(document_label(document, source_) + ": expected a JSON object (got " +
                     json_value_text(doc) + ")");
  }
  const Json* version = optional(doc, "schema_version");
  if (version == nullptr) fail("schema_version", "is required and must be 1", "");
  if (!version->is_number_integer() || version->get<int64_t>() != 1) {
    fail("schema_version", "must be 1", *version);
  }
  const Json* got_kind = optional(doc, "kind");
  if (got_kind == nullptr) fail("kind", "is required and must be \"" + kind + "\"", "");
  if (!got_kind->is_string() || got_kind->get<std::string>() != kind) {
    fail("kind", "must be \"" + kind + "\"", *got_kind);
  }
}

int64_t JsonReader::integer(const Json& v, const std::string& path) const {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) fail(path, "must fit in a 64-bit integer", v);
    return static_cast<int64_t>(u);
  }
  if (v.is_number_float()) {
    // Writers such as Python's json emit 1e9 as a float; accept it when it is integral.
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) {
      return static_cast<int64_t>(d);
    }
  }
  fail(path, "must be an integer", v);
}

double JsonReader::number(const Json& v, const std::string& path) const {
  if (!v.is_number()) fail(path, "must be a number", v);
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail(path, "must be finite", v);
  return d;
}

std::string JsonReader::string(const Json& v, const std::string& path) const {
  if (!v.is_string()) fail(path, "must be a string", v);
  return v.get<std::string>();
}

bool JsonReader::boolean(const Json& v, const std::string& path) const {
  if (!v.is_boolean()) fail(path, "must be true or false", v);
  return v.get<bool>();
}

int64_t JsonReader::field_int(const Json& obj, const std::string& obj_path,
                              const std::string& key) const {
  return integer(required(obj, obj_path, key), json_child_path(obj_path, key));
}

double JsonReader::field_number(const Json& obj, const std::string& obj_path,
                                const std::string& key) const {
  return number(required(obj, obj_path, key), json_child_path(obj_path, key));
}

std::string JsonReader::field_string(const Json& obj, const std::string& obj_path,
                                     const std::string& key) const {
  return string(required(obj, obj_path, key), json_child_path(obj_path, key));
}

}  // namespace hybridplan
