// Reading and writing JSON files at the library boundary. Every failure is an InputError that
// names the file (and, for syntax errors, the line and column), never a raw nlohmann exception.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace hybridplan {

using Json = nlohmann::json;

// Parses the file at `path`. Missing/unreadable file: "<path>: cannot open file (...)";
// empty or whitespace only: "<document> file <path> is empty" (document: "graph", "cluster",
// ...; "<path>: file is empty" without one); bad syntax: "<path>: invalid JSON: parse error at
// line L, column C: ...".
Json read_json_file(const std::string& path, const std::string& document = "");

// Throws "<document> file <source> is empty" (see read_json_file) when `text` is empty or JSON
// whitespace only; read_json_file and the Python bindings' loaders share this rule.
void check_not_empty(const std::string& text, const std::string& document, const std::string& source);

// What a document is called in messages: "graph file <path>", or just "graph" when the source
// is the bare word (Python passes text with source "graph").
std::string document_label(const std::string& document, const std::string& source);

// Parses `text`, naming `source` in the error like read_json_file does.
Json parse_json_text(const std::string& text, const std::string& source);

// Writes `text` to `path` atomically and durably: `<path>.tmp-<pid>` next to it, fsynced, renamed
// over `path`, then the directory fsynced, so a reader never sees a half-written plan or
// checkpoint. On failure the temporary file is removed, `path` keeps its previous content, and
// an InputError names `path` and the reason.
void write_file_atomic(const std::string& path, const std::string& text);

// Canonical form (sorted keys, no spaces) plus a trailing newline: what save_* writes.
void write_json_file(const std::string& path, const Json& j);

}  // namespace hybridplan
