"""The C++ profiler (examples/cpp/profile_model) and the Python profiler agree on the same model:
identical structure (node names, ops, edges, parameter and output bytes, profiled batch/dtype),
both time every node, and per-node times agree within a loose bound that catches the two
profilers measuring different things (the 20 % figure is profile_checks.py's rule, which
bench/bench_profile_agreement.py applies on a quiet machine; see test_node_times_agree).

The binary is found in $HYBRIDPLAN_BIN_DIR, else build/bin (`make build`). Both sides run with
one intra-op thread and the "thread" clock (CPU time of the profiling thread), so the other
processes of a busy 2-core machine do not enter the times; see bench/bench_profile_agreement.py
for the per-node table.
"""

import pytest

import profile_checks as agreement
from twins import TWINS, bin_dir

BATCH = 32
REPEATS = 7
ROUNDS = 3

pytestmark = pytest.mark.skipif(
    not (bin_dir() / "profile_model").exists(),
    reason=f"{bin_dir() / 'profile_model'} is not built (make build, or set "
           "HYBRIDPLAN_BIN_DIR to the folder holding profile_model)")


@pytest.fixture(scope="module")
def profiles():
    """model -> (C++ graph, Python graph), measured once per model for all the tests here."""
    cache = {}

    def get(model):
        if model not in cache:
            cache[model] = agreement.profile_both(model, BATCH, REPEATS, ROUNDS, "thread")
        return cache[model]

    return get


@pytest.mark.parametrize("model", sorted(TWINS))
def test_structure_is_identical(profiles, model):
    cpps, pythons = profiles(model)
    cpp = cpps[0]
    assert all(agreement.structure(g) == agreement.structure(cpp) for g in cpps + pythons)
    inputs = TWINS[model](BATCH)[1]  # the same inputs, built by the Python twin
    assert cpp["profiled"] == {"device": "cpu", "batch_size": BATCH, "dtype": "float32",
                               "input_bytes": sum(t.numel() * t.element_size() for t in inputs)}


def test_biglstm_nodes_are_the_python_modules(profiles):
    cpp = profiles("biglstm")[0][0]
    assert [n["name"] for n in cpp["nodes"]] == ["embed", "lstm0", "lstm1", "softmax"]
    assert [n["op"] for n in cpp["nodes"]] == ["embedding", "lstm", "lstm", "linear"]
    # lstm0 -> lstm1 carries the output sequence only, (32, 16, 64) floats; the node's output
    # also counts the final h (1, 32, 64) and c (1, 32, 128).
    lstm0 = cpp["nodes"][1]
    assert lstm0["output_bytes"] == (32 * 16 * 64 + 32 * 64 + 32 * 128) * 4
    assert {(e["src"], e["dst"], e["bytes"]) for e in cpp["edges"]} >= {(1, 2, 32 * 16 * 64 * 4)}


@pytest.mark.parametrize("model", sorted(TWINS))
def test_every_node_is_timed_on_both_sides(profiles, model):
    for graph in profiles(model)[0] + profiles(model)[1]:
        assert all(n["forward_s"] > 0 for n in graph["nodes"])
        with_params = [n for n in graph["nodes"] if n["param_bytes"] > 0]
        assert with_params and all(n["backward_s"] > 0 for n in with_params)


def _disagreeing(graphs) -> list:
    """Judged nodes whose python / cpp ratio is outside [0.6, 1/0.6]; the rest off by > 1 ms."""
    rows = agreement.compare(*graphs, tolerance=1.0, absolute_s=1e-3)
    return [r for r in rows
            if (r["judged"] and not 0.6 <= r["ratio"] <= 1 / 0.6) or not r["ok"]]


@pytest.mark.parametrize("model", sorted(TWINS))
def test_node_times_agree(profiles, model):
    """Nodes of >= 5 % of the step within a factor 1/0.6 either way, the rest within 1 ms (medians
    over 3 alternating rounds). The benchmark holds the judged nodes to 20 % on a quiet machine
    and measures 0.98-1.14 there; under `make test` the other core runs other tests, whose cache
    and memory-bandwidth pressure moves single nodes by 20-60 %, so this bound is looser, and a
    disagreement is measured once more (fresh rounds) before it fails: the faults this test
    exists for are systematic and repeat (timing blocks alone instead of in a step, or glibc's
    page faults charged to one side, put nodes at 0.4-0.5x every time)."""
    bad = _disagreeing(profiles(model))
    if bad:
        bad = _disagreeing(agreement.profile_both(model, BATCH, REPEATS, ROUNDS, "thread"))
    assert not bad, "\n".join(
        f"{r['name']}: cpp {r['cpp_s'] * 1e3:.3f} ms, python {r['python_s'] * 1e3:.3f} ms "
        f"({'judged' if r['judged'] else 'absolute'})" for r in bad)
