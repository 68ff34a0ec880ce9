#include "common/json_io.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/error.h"

namespace hybridplan {

Json parse_json_text(const std::string& text, const std::string& source) {
  try {
    return Json::parse(text);
  } catch (const Json::parse_error& e) {
    // nlohmann prefixes "[json.exception.parse_error.101] "; the user needs only the rest,
    // which already says "parse error at line L, column C: ...".
    std::string what = e.what();
    const auto bracket = what.find("] ");
    if (what.rfind("[json.exception", 0) == 0 && bracket != std::string::npos) {
      what = what.substr(bracket + 2);
    }
    throw InputError(source + ": invalid JSON: " + what);
  } catch (const Json::exception& e) {
    // e.g. out_of_range.406 for a number literal too large for a double ("1e999").
    std::string what = e.what();
    const auto bracket = what.find("] ");
    if (bracket != std::string::npos) what = what.substr(bracket + 2);
    throw InputError(source + ": invalid JSON: " + what);
  }
}

std::string document_label(const std::string& document, const std::string& source) {
  if (document.empty()) return source;
  if (source == document) return document;
  return document + " file " + source;
}

Json read_json_file(const std::string& path, const std::string& document) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(path + ": cannot open file (" + std::strerror(errno) + ")");
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InputError(path + ": cannot read file");
  const std::string& s = text.str();
  check_not_empty(s, document, path);
  return parse_json_text(s, path);
}

void check_not_empty(const std::string& text, const std::string& document, const std::string& source) {
  // JSON's whitespace (RFC 8259): an empty file would otherwise read "unexpected end of input".
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw InputError(document.empty() ? source + ": file is empty"
                                      : document_label(document, source) + " is empty");
  }
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw InputError(path + ": cannot write file (" + std::strerror(errno) + ")");
    out << text;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw InputError(path + ": cannot write file (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(tmp.c_str());
    throw InputError(path + ": cannot replace file (" + reason + ")");
  }
}

void write_json_file(const std::string& path, const Json& j) {
  write_file_atomic(path, j.dump() + "\n");
}

}  // namespace hybridplan
