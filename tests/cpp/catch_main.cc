// Catch2 entry point that works with v2 (Debian 12, header only) and v3 (Debian 13, which links
// Catch2::Catch2WithMain and needs nothing here).
#if !__has_include(<catch2/catch_all.hpp>)
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
#endif
