#!/usr/bin/env bash
# Run HERE (the development machine) before sending bench/gpu/run.sh to a machine with one CUDA
# GPU: that machine reaches no package registry, so the header-only C++ dependencies the
# planner needs (nlohmann-json, CLI11, from Debian's packages) travel in .gpu-deps/, which git
# ignores (.git/info/exclude) and the device tool carries (`carry: [".gpu-deps"]`).
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .gpu-deps
mkdir -p .gpu-deps/include .gpu-deps/share/cmake
cp -r /usr/include/nlohmann .gpu-deps/include/
cp -r /usr/include/CLI .gpu-deps/include/
cp -r /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 .gpu-deps/share/cmake/
grep -qx '/.gpu-deps/' .git/info/exclude 2>/dev/null || echo '/.gpu-deps/' >> .git/info/exclude
du -sh .gpu-deps
