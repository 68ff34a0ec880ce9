// Include Catch2 whichever major version is installed (v2 on Debian 12, v3 on Debian 13).
#pragma once
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
