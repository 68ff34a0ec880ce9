#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks for building and testing hybridplan, and nothing
# that is already there (a second run is a few dpkg/python checks). torch is pinned: an unpinned
# torch would pull a multi-GB CUDA build.
set -euo pipefail
PYTHON=${PYTHON:-python3}

# ccache: `make test` compiles the torch-free core three times (build-core/ without LibTorch to
# prove the boundary, build/ with it, and the wheel of the pip-install test) with the same flags;
# the Makefile makes CMake compile through it, so the second and third are cache hits.
apt_packages=(cmake ninja-build g++ nlohmann-json3-dev libcli11-dev catch2 libgloo-dev ccache)
# `make fuzz` only (libFuzzer is in Debian's clang); `make test` never needs clang.
[ "${HYBRIDPLAN_FUZZ_DEPS:-0}" = 1 ] && apt_packages+=(clang)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

pip_missing=()
"$PYTHON" - <<'PY' || pip_missing+=("torch==2.13.0")
import torch, sys
sys.exit(0 if torch.__version__.split("+")[0] == "2.13.0" else 1)
PY
for mod_pkg in pybind11:pybind11 tqdm:tqdm matplotlib:matplotlib pytest:pytest numpy:numpy; do
  mod=${mod_pkg%%:*}; pkg=${mod_pkg##*:}
  "$PYTHON" -c "import $mod" >/dev/null 2>&1 || pip_missing+=("$pkg")
done
if [ ${#pip_missing[@]} -gt 0 ]; then
  echo "install-deps: pip install ${pip_missing[*]}"
  "$PYTHON" -m pip install -q --disable-pip-version-check "${pip_missing[@]}"
fi

# transformers (a test dependency: Hugging Face GPT-2 and BERT built from small configs, no
# weights) requires no torch (its metadata lists huggingface-hub, numpy, packaging, pyyaml,
# regex, tokenizers, typer, safetensors, tqdm), so it cannot pull in another torch; pinned to
# the version the tests were written against.
"$PYTHON" -c "import transformers" >/dev/null 2>&1 || {
  echo "install-deps: pip install transformers==5.23.0"
  "$PYTHON" -m pip install -q --disable-pip-version-check "transformers==5.23.0"
}

# scikit-learn: its bundled handwritten digits are the real dataset time to accuracy is measured
# on (hybridplan.datasets, no download). It requires numpy, scipy, joblib and threadpoolctl,
# none of which requires torch; pinned to the version the measurements were taken with.
"$PYTHON" -c "import sklearn" >/dev/null 2>&1 || {
  echo "install-deps: pip install scikit-learn==1.9.1"
  "$PYTHON" -m pip install -q --disable-pip-version-check "scikit-learn==1.9.1"
}
