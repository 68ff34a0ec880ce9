#include "common/json_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
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
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw InputError(path + ": " + what + " (" + reason + ")");
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot write file");
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fail("cannot write file");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("cannot write file (fsync)");
  }
  if (::close(fd) != 0) fail("cannot write file");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("cannot replace file");
  // The rename is durable once the directory is synced; a directory that cannot be opened for
  // that (some filesystems) leaves a renamed, complete file all the same.
  const std::string dir = std::filesystem::absolute(path).parent_path().string();
  if (const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
}

void write_json_file(const std::string& path, const Json& j) {
  write_file_atomic(path, j.dump() + "\n");
}

}  // namespace hybridplan
