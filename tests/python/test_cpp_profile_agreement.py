"""The C++ profiler (examples/cpp/profile_model) and the Python profiler agree on the same model:
identical structure (node names, ops, edges, parameter and output bytes, profiled batch/dtype),
and both time every node. Per-node time ratios are a benchmark
(bench/bench_profile_agreement.py), not a test: they are too noisy on a busy 2-core machine.

The binary is found in $HYBRIDPLAN_BIN_DIR, else build/bin (`make build`). Both sides run with
one intra-op thread and the "thread" clock (CPU time of the profiling thread), so the other
processes of a busy 2-core machine do not enter the times; see bench/bench_profile_agreement.py
for the per-node table.
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_profile_agreement as agreement  # noqa: E402

BATCH = 32
REPEATS = 5

pytestmark = pytest.mark.skipif(
    not (agreement.bin_dir() / "profile_model").exists(),
    reason=f"{agreement.bin_dir() / 'profile_model'} is not built (make build, or set "
           "HYBRIDPLAN_BIN_DIR to the folder holding profile_model)")


@pytest.fixture(scope="module")
def profiles():
    """model -> (C++ graph, Python graph), measured once per model for all the tests here."""
    cache = {}

    def get(model):
        if model not in cache:
            cache[model] = (agreement.cpp_profile(model, BATCH, REPEATS, "thread"),
                            agreement.python_profile(model, BATCH, REPEATS, "thread"))
        return cache[model]

    return get


@pytest.mark.parametrize("model", sorted(agreement.TWINS))
def test_structure_is_identical(profiles, model):
    cpp, python = profiles(model)
    assert agreement.structure(cpp) == agreement.structure(python)
    assert cpp["profiled"] == {"device": "cpu", "batch_size": BATCH, "dtype": "float32"}


def test_biglstm_nodes_are_the_python_modules(profiles):
    cpp, _ = profiles("biglstm")
    assert [n["name"] for n in cpp["nodes"]] == ["embed", "lstm0", "lstm1", "softmax"]
    assert [n["op"] for n in cpp["nodes"]] == ["embedding", "lstm", "lstm", "linear"]
    # lstm0 -> lstm1 carries the output sequence only, (32, 16, 64) floats; the node's output
    # also counts the final h (1, 32, 64) and c (1, 32, 128).
    lstm0 = cpp["nodes"][1]
    assert lstm0["output_bytes"] == (32 * 16 * 64 + 32 * 64 + 32 * 128) * 4
    assert {(e["src"], e["dst"], e["bytes"]) for e in cpp["edges"]} >= {(1, 2, 32 * 16 * 64 * 4)}


@pytest.mark.parametrize("model", sorted(agreement.TWINS))
def test_every_node_is_timed_on_both_sides(profiles, model):
    # Per-node time agreement is reported by bench/bench_profile_agreement.py, not asserted here:
    # on a shared 2-core machine single nodes (the first conv, say) differ by up to 2x between
    # runs, so a 20 % bound would be a flaky test (see the report in that file's docstring).
    for graph in profiles(model):
        assert all(n["forward_s"] > 0 for n in graph["nodes"])
        with_params = [n for n in graph["nodes"] if n["param_bytes"] > 0]
        assert with_params and all(n["backward_s"] > 0 for n in with_params)
