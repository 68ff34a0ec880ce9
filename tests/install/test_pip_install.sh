#!/usr/bin/env bash
# `pip install .` into a fresh venv (python3 -m venv: no system packages, no torch) installs the
# planner and the C++ `hybridplan` command, and both plan from another folder. The venv must not
# get a torch: the planner does not need one. Run by `make test-install`.
#   tests/install/test_pip_install.sh [PYTHON]
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${1:-python3}
venv=$(mktemp -d /tmp/hybridplan-venv-XXXXXX)
work=$(mktemp -d /tmp/hybridplan-elsewhere-XXXXXX)
trap 'rm -rf "$venv" "$work"' EXIT
fail() { echo "test_pip_install: FAILED: $*" >&2; exit 1; }

"$python" -m venv "$venv"
# A clean environment: nothing of the checkout or the build tree may leak in.
export -n PYTHONPATH HYBRIDPLAN_CLI 2>/dev/null || true
unset PYTHONPATH HYBRIDPLAN_CLI
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$repo" \
  || fail "pip install $repo"

cd "$work"
"$venv/bin/python" -c "import torch" 2>/dev/null && fail "the venv has torch; the planner must not pull it"
[ -x "$venv/bin/hybridplan" ] || fail "pip installed no hybridplan command in $venv/bin"
out=$(PATH="$venv/bin:/usr/bin:/bin" hybridplan plan --graph "$repo/examples/graph-tiny.json" \
        --cluster dgx1-v100 --devices 8) || fail "hybridplan plan from $work"
echo "$out" | head -5
out_py=$("$venv/bin/python" - "$repo/examples/graph-tiny.json" <<'PY'
import sys
import hybridplan
best = hybridplan.plan(sys.argv[1], "dgx1-v100", devices=8)
assert "site-packages" in hybridplan.__file__, hybridplan.__file__
print(f"python: best plan dp {best.dp} x mp {best.mp} {best.mode}")
PY
) || fail "hybridplan.plan from $work"
echo "$out_py"
echo "test_pip_install: passed (pip install into a fresh venv without torch; planned from $work)"
