// SHA-256 (FIPS 180-4), used to name the exact graph a plan was made for. A small standard
// implementation so the torch-free core needs no crypto library.
#pragma once
#include <string>

namespace hybridplan {

// Lower-case hex digest (64 characters) of the bytes of `data`.
std::string sha256_hex(const std::string& data);

}  // namespace hybridplan
