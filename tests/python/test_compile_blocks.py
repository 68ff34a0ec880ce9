"""torch.compile per graph block (executor/compiling.py, measure/compile_speedup.py;
docs/training_step.md "Compiled blocks").

In this process, with torch.compile's "aot_eager" backend (AOTAutograd's forward and backward
graphs run by eager kernels: the compile path without inductor's C++ build, seconds instead
of a minute): each block compiled as one graph, a block with a graph break running eager with
one warning naming it, the forward and gradients equal to eager (bit-equal here: the same
kernels), the compile undone, the per-node speed-up measured into a graph the core accepts,
and apply(compile=...) checked against the plan kind. In a subprocess: one process applies a
placement plan with compile and trains 2 steps equal to eager.

`full`: the same with inductor (the default backend: generated C++ kernels, fused and
reordered), within rtol 1e-4, atol 1e-5 of eager (float32 reassociation in the fused
kernels; measured differences are in benchmarks/accumulation-compile-2026-12-06.md).
"""

import json
import os
import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("hybridplan.planner", reason="needs the compiled planner hybridplan._C "
                                                 "(make build)")

from hybridplan.executor.compiling import (compile_blocks, compile_of,  # noqa: E402
                                           compile_options, compiled_state, uncompile_blocks)
from hybridplan.planner import Graph, Plan  # noqa: E402

from dist_harness import format_results, run_ranks  # noqa: E402

FAST = {"backend": "aot_eager"}


class GraphBreak(nn.Module):
    """A block torch.compile cannot capture as one graph."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.full((6,), 0.5))

    def forward(self, x):
        torch._dynamo.graph_break()
        return x * self.scale


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 6), nn.Tanh(), GraphBreak(), nn.Linear(6, 3))


NAMES = ["0", "1", "2", "3"]


def test_blocks_compile_and_a_graph_break_runs_eager_with_its_name():
    model, reference = _model(), _model()
    compile_blocks(model, NAMES, FAST)
    x = torch.randn(5, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = model(x)
        out.sum().backward()
        model(x)  # the fallback is for good: no second warning
    messages = [str(w.message) for w in caught if "hybridplan compile" in str(w.message)]
    assert len(messages) == 1, messages
    assert "block '2' (GraphBreak) runs eager" in messages[0]
    assert "graph_break" in messages[0]
    assert [compiled_state(model[n]) for n in (0, 1, 2, 3)] == [True, True, False, True]
    ref = reference(x)
    ref.sum().backward()
    assert torch.equal(out, ref)
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad), name
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in reference.named_parameters()]
    uncompile_blocks(model, NAMES)
    assert all("forward" not in model[i].__dict__ for i in range(4))
    assert compiled_state(model[0]) is None


def test_an_error_of_the_block_itself_propagates():
    model = nn.Sequential(nn.Linear(8, 6))
    compile_blocks(model, ["0"], FAST)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        model(torch.randn(2, 5))  # wrong width: eager raises it too


def test_options_and_plan_kinds():
    assert compile_options(False) is None and compile_options(None) is None
    assert compile_options(True) == {} and compile_options(FAST) == FAST
    with pytest.raises(ValueError, match="compile must be True, False or a dict"):
        compile_options("yes")
    with pytest.raises(ValueError, match="compile must not set fullgraph"):
        compile_options({"fullgraph": False})
    base = {"schema_version": 1, "kind": "hybridplan.plan",
            "graph": {"name": "g", "sha256": "0" * 64}, "cluster": {"name": "c"},
            "world_size": 2, "dp": 1, "mp": 2, "mode": "pipeline", "per_replica_batch": 4,
            "global_batch": 4, "num_microbatches": 2, "schedule": "gpipe", "mesh": [[0, 1]],
            "assignment": [{"node": 0, "name": "a", "device": 0},
                           {"node": 1, "name": "b", "device": 1}]}
    pipeline = Plan.from_dict(base, "p.json")
    assert compile_of(pipeline, None) is None  # the plan does not ask
    with pytest.raises(ValueError, match=r"compile applies to placement plans without "
                                         r"sharding or tensor parallelism \(got mode 'pipeline'"):
        compile_of(pipeline, True)
    asked = Plan.from_dict(dict(base, compile=True), "p.json")
    assert asked.compile
    with pytest.raises(ValueError, match="compile applies to placement plans"):
        compile_of(asked, None)  # the plan's own flag, checked alike
    assert compile_of(asked, False) is None  # an explicit False overrides it


def test_speedups_are_measured_per_node_into_a_graph_the_core_reads():
    import hybridplan
    from hybridplan.measure.compile_speedup import compile_speedups, with_compile_speedups

    model = _model()
    x = torch.randn(16, 8)
    graph = hybridplan.profile(model, (x,), warmup=1, repeats=3).to_dict()
    names = [n["name"] for n in graph["nodes"]]
    assert names == NAMES
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        measured = compile_speedups(model, (x,), names, torch.device("cpu"), 1, 3, FAST)
    assert set(measured) == set(NAMES)
    assert measured["2"]["compiled"] is False
    assert (measured["2"]["forward"], measured["2"]["backward"]) == (1.0, 1.0)
    for name in ("0", "1", "3"):
        assert measured[name]["compiled"] is True
        assert measured[name]["forward"] > 0 and measured[name]["backward"] > 0
    assert all("forward" not in m.__dict__ for m in model)  # the model itself stays eager
    written = with_compile_speedups(graph, measured)
    loaded = Graph.from_dict(written, "g.json").to_dict()  # the C++ loader's validation
    for node in loaded["nodes"]:
        m = measured[node["name"]]
        assert node["compile_speedup"] == pytest.approx({"forward": m["forward"],
                                                         "backward": m["backward"]})


def apply_rank(out_dir, option):
    """One rank (dist_harness): a placement plan applied eager and with `option`, 2 SGD steps
    each from the same model; the largest parameter difference."""
    import copy

    import torch.nn.functional as F

    import hybridplan
    from hybridplan.hand_plans import hand_plan

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    x = torch.randn(8, 8)
    y = torch.randint(0, 4, (8,))
    plan = hand_plan(model, mode="placement", dp=1, mp=1, per_replica_batch=8,
                     example_inputs=(x,))
    results = {}
    for compiled in (False, True):
        m = copy.deepcopy(model)
        hp = hybridplan.apply(plan, m, loss_fn=F.cross_entropy,
                              optimizer=lambda p: torch.optim.SGD(p, lr=0.5),
                              compile=option if compiled else None)
        for step in range(2):
            hp.step(x + step, y)
        results[compiled] = {n: p.detach().clone() for n, p in m.named_parameters()}
        hp.close()
    names = list(results[False])
    diff = max((results[True][n] - results[False][n]).abs().max().item() for n in names)
    close = all(torch.allclose(results[True][n], results[False][n], rtol=1e-4, atol=1e-5)
                for n in names)
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump({"diff": diff, "close": close}, f)


def _apply_with(option, tmp_path, timeout):
    results = run_ranks("test_compile_blocks:apply_rank", 1,
                        {"out_dir": str(tmp_path), "option": option}, timeout_s=timeout)
    assert all(r.returncode == 0 for r in results), format_results(results)
    return json.loads((tmp_path / "result.json").read_text())


def test_apply_with_compiled_blocks_trains_as_eager(tmp_path):
    r = _apply_with(FAST, tmp_path, 180)
    assert r["close"], f"largest difference from eager: {r['diff']:.3g}"


@pytest.mark.full
def test_apply_with_inductor_trains_as_eager_within_tolerance(tmp_path):
    r = _apply_with(True, tmp_path, 600)
    print(f"inductor vs eager, largest parameter difference after 2 steps: {r['diff']:.3g}")
    assert r["close"], f"largest difference from eager: {r['diff']:.3g}"


def test_calibrate_writes_the_graph_with_each_nodes_speedup():
    """calibrate --compile-graph's measurement (measure.calibration.measured_compile_graph) on a
    built-in model, with the fast backend: every node of its profile gets a speed-up."""
    import hybridplan
    from hybridplan import models
    from hybridplan.factories import load_factory
    from hybridplan.measure.calibration import measured_compile_graph

    spec = "hybridplan.models:digits_cnn"
    module = load_factory(spec)()
    loss_fn, target = models.loss_and_target(module, 8)
    graph = hybridplan.profile(module, tuple(module.example_inputs(8)), loss_fn=loss_fn,
                               target=target, warmup=1, repeats=3, verbose=False).to_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        written = measured_compile_graph(graph, spec, 8, 1, 3, options=FAST)
    loaded = Graph.from_dict(written, "g.json").to_dict()
    assert [n["name"] for n in loaded["nodes"]] == [n["name"] for n in graph["nodes"]]
    for node in loaded["nodes"]:
        assert node["compile_speedup"]["forward"] > 0, node["name"]
        assert node["compile_speedup"]["backward"] > 0, node["name"]
    assert "compile_speedup" not in graph["nodes"][0]  # the profile itself is left as it was
