"""torch.compile per graph block (executor/compiling.py, measure/compile_speedup.py;
docs/training_step.md "Compiled blocks").

In this process, with torch.compile's "aot_eager" backend (AOTAutograd's forward and backward
graphs run by eager kernels: the compile path without inductor's C++ build, seconds instead
of a minute): each block compiled as one graph, a block with a graph break running eager with
one warning naming it, the forward and gradients equal to eager (bit-equal here: the same
kernels), the compile undone, the per-node speed-up measured into a graph the core accepts,
apply(compile=...) against the plan kind (the zero-bubble schedules eager, saying why) and a
compiled block under a split backward. In a subprocess: one process applies a placement plan
with compile and trains 2 steps equal to eager. On 2 ranks: every plan kind with compiled
blocks against one process (the section below says which and the tolerance).

`full`: the same with inductor (the default backend: generated C++ kernels, fused and
reordered), within rtol 1e-4, atol 1e-5 of eager (float32 reassociation in the fused
kernels; measured differences are in benchmarks/accumulation-compile-2026-12-06.md), and the
slower plan kinds.
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
                                           compile_options, compiled_state, eager_reason,
                                           node_eager_reason, uncompile_blocks)
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
    assert compile_of(pipeline, True) == {}  # every plan kind compiles its blocks
    asked = Plan.from_dict(dict(base, compile=True), "p.json")
    assert asked.compile
    assert compile_of(asked, None) == {}  # the plan's own flag
    assert compile_of(asked, False) is None  # an explicit False overrides it
    assert eager_reason(asked) is None
    for schedule in ("interleaved-zb", "zbv"):
        zero_bubble = Plan.from_dict(dict(
            base, schedule=schedule, virtual_stages=2, compile=True,
            assignment=[{"node": i, "name": n, "device": i % 2 if schedule != "zbv"
                         else [0, 1, 1, 0][i]} for i, n in enumerate("abcd")]), "z.json")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert compile_of(zero_bubble, None, rank=0) is None  # eager, said once
            assert compile_of(zero_bubble, True, rank=1) is None  # (by rank 0 only)
        said = [str(w.message) for w in caught]
        assert len(said) == 1, said
        assert f"every block runs eager: schedule {schedule!r} splits each backward " \
               f"into input and weight passes" in said[0]
        assert "weight pass would run every compiled block's whole backward a second " \
               "time" in said[0]


def test_a_compiled_block_under_a_split_backward_runs_its_whole_backward_twice():
    """Why zero-bubble schedules run eager (eager_reason): split_backward's W reaches a
    compiled block's parameters only through the block's one backward node
    (CompiledFunctionBackward), which it runs again: the gradients stay right, every compiled
    block's backward is run twice."""
    import copy

    from hybridplan.autograd import split_backward

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    compile_blocks(model, ["0", "1", "2"], FAST)
    runs = []
    x = torch.randn(5, 8, requires_grad=True)
    out = model(x)
    for node in {out.grad_fn, out.grad_fn.next_functions[0][0]}:
        if type(node).__name__ == "CompiledFunctionBackward":
            node.register_prehook(lambda grads, node=node: runs.append(node) and None)
    g = torch.randn_like(out)
    (gx,), state = split_backward.backward_input([out], [g], [x], list(model.parameters()))
    assert len(runs) == 1 and all(p.grad is None for p in model.parameters())  # I
    split_backward.backward_weight(state)
    assert len(runs) == 2 and runs[0] is runs[1]  # W: the same whole node once more
    xr = x.detach().clone().requires_grad_()
    reference(xr).backward(g)
    assert torch.equal(gx, xr.grad)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad)


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


# ---- every plan kind on 2 ranks against one process -------------------------------------------
#
# One tiny model (7 graph nodes: three Linear + Tanh pairs and a head), 2 SGD steps per case,
# one 2-rank launch (Gloo, CPU) for the cases a run selects. Each case applies the plan with
# compiled blocks and trains; the test compares the trained state with one process training
# eager on the same global batch, and checks that the blocks did run compiled (every node
# module of the rank compiled, none fallen back), or for the zero-bubble schedules that they
# ran eager with rank 0's warning naming the reason.
#
# Tolerance. With "aot_eager" the compiled blocks run the ATen kernels eager runs (AOTAutograd's
# forward and backward graphs, no code generation): compiled against eager is bit-equal in one
# process (test_blocks_compile_and_a_graph_break_runs_eager_with_its_name), so what is left is
# the executor's own float reassociation (replicas' averaged gradients, micro-batch losses
# summed, a row-wise all-reduce), held to the executor's equality tolerance, allclose(rtol 1e-4,
# atol 1e-6). With inductor (the `full` cases) the kernels are generated: bias adds fused into
# the matrix products' epilogues, the backward's bias-gradient sums and the loss's reductions
# reassociated and vectorised, tanh computed by a vectorised routine, each a rounding of a few
# float32 ulps; one process compiled against eager on this model after 2 steps differs by
# 1.5e-08 (global batch 8) and 3.0e-08 (16), the floor. Its tolerance is the compiled blocks'
# allclose(rtol 1e-4, atol 1e-5): the floor and the executor's reassociation, one float32 ulp
# (3e-08) of these parameters each, together over 150 times below it (the measured differences:
# benchmarks/accumulation-compile-2026-12-06.md).

KIND_STEPS, KIND_BATCH, KIND_LR = 2, 8, 0.5
AOT_TOLERANCE = {"rtol": 1e-4, "atol": 1e-6}
INDUCTOR_TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}
ZERO_BUBBLE_KINDS = ("pipeline-interleaved-zb", "pipeline-zbv")


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8), nn.Tanh(),
                         nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def _batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def _kind_plan(kind, model):
    """The cheapest 2-rank plan of each kind."""
    from plan_builders import pipeline_plan, placement_plan
    from test_tensor_parallel import with_tp

    example = _batch(KIND_BATCH, 0)[0]
    if kind.startswith("pipeline-"):
        schedule = kind[len("pipeline-"):]
        virtual = 2 if schedule in ("interleaved-1f1b", "interleaved-zb", "zbv") else 1
        return pipeline_plan(model, dp=1, mp=2, schedule=schedule, num_microbatches=2 * virtual,
                             per_replica_batch=KIND_BATCH, example_inputs=(example,),
                             virtual_stages=virtual)
    if kind == "tp":
        return with_tp(placement_plan(model, dp=1, mp=1, per_replica_batch=KIND_BATCH), 2)
    plan = placement_plan(model, dp=2, mp=1, per_replica_batch=KIND_BATCH)
    if kind in ("zero2", "zero3"):
        return dict(plan, sharding=kind)
    if kind in ("recompute", "selective"):
        how = True if kind == "recompute" else "selective"
        return dict(plan, assignment=[dict(a, recompute=how) for a in plan["assignment"]])
    assert kind == "dp", kind
    return plan


def kinds_rank(cases_file, out_dir):
    """Rank side: each case (kind, backend) applied with compiled blocks and trained; the
    state, the compiled blocks (name -> runs compiled) and this rank's compile warnings."""
    import time

    import torch.nn.functional as F

    import hybridplan
    from torch._dynamo.utils import counters

    from hybridplan.executor.compiling import compiled_blocks

    torch.set_num_threads(1)
    for case in torch.load(cases_file):
        model = _mlp()
        option = True if case["backend"] == "inductor" else {"backend": case["backend"]}
        started = time.perf_counter()
        graphs = counters["stats"]["unique_graphs"]  # Dynamo's count of graphs it compiled
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hp = hybridplan.apply(_kind_plan(case["kind"], model), model, loss_fn=F.cross_entropy,
                                  optimizer=lambda p: torch.optim.SGD(p, lr=KIND_LR),
                                  example_inputs=_batch(KIND_BATCH, 0)[0], timeout_s=600,
                                  compile=option)
            for step in range(KIND_STEPS):
                hp.step(*hp.shard(*_batch(hp.global_batch, 100 + step)))
        holder = hp.original if hp.plan.mode == "placement" else nn.ModuleList(hp._runner.modules)
        result = {"state": hp.state_dict(), "blocks": compiled_blocks(holder),
                  "warnings": [str(w.message) for w in caught
                               if "hybridplan compile" in str(w.message)],
                  "graphs": counters["stats"]["unique_graphs"] - graphs,
                  "global_batch": hp.global_batch, "seconds": time.perf_counter() - started}
        hp.close()
        torch.save(result, os.path.join(out_dir, f"{case['id']}.rank{os.environ['RANK']}.pt"))


def _one_process(global_batch):
    import torch.nn.functional as F

    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=KIND_LR)
    for step in range(KIND_STEPS):
        x, y = _batch(global_batch, 100 + step)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return model.state_dict()


def _hold_to(state, want, tolerance, label, note=""):
    """A rank's trained `state` against one process's `want`, within `tolerance` (allclose's
    keywords), each tensor; prints the largest difference."""
    diff = max((state[k] - v).abs().max().item() for k, v in want.items())
    print(f"compile {label}: largest difference from one process {diff:.3g}{note}")
    for key, value in want.items():
        assert torch.allclose(state[key], value, **tolerance), (
            f"{label}: {key} differs from one process by "
            f"{(state[key] - value).abs().max().item():.3g}")


KIND_CASES = [  # (kind, backend, in make test)
    ("pipeline-1f1b", "aot_eager", True), ("zero3", "aot_eager", True),
    ("tp", "aot_eager", True), ("recompute", "aot_eager", True),
    ("pipeline-zbv", "aot_eager", True),
    ("pipeline-gpipe", "aot_eager", False), ("pipeline-interleaved-1f1b", "aot_eager", False),
    ("pipeline-interleaved-zb", "aot_eager", False), ("zero2", "aot_eager", False),
    ("dp", "aot_eager", False), ("selective", "aot_eager", False),
    ("selective", "inductor", False),
    ("pipeline-1f1b", "inductor", False), ("zero3", "inductor", False),
    ("tp", "inductor", False), ("recompute", "inductor", False),
    ("pipeline-gpipe", "inductor", False), ("pipeline-interleaved-1f1b", "inductor", False),
    ("zero2", "inductor", False), ("dp", "inductor", False),
]


def _case_id(kind, backend):
    return f"{kind}-{backend}"


@pytest.fixture(scope="module")
def kinds_trained(tmp_path_factory, selected_cases):
    from dist_harness import run_cases

    chosen = selected_cases("test_kind_with_compiled_blocks_trains_as_one_process", "kind",
                            "backend")
    cases = [{"id": _case_id(k, b), "kind": k, "backend": b} for k, b in chosen]
    if not cases:
        return {}
    out_dir = tmp_path_factory.mktemp("compile_kinds")
    loaded, _ = run_cases("test_compile_blocks:kinds_rank", {2: cases}, out_dir,
                          timeout_s=300 + 300 * len(cases))
    return loaded


@pytest.mark.parametrize("kind,backend", [
    pytest.param(k, b, marks=() if quick else pytest.mark.full) for k, b, quick in KIND_CASES],
    ids=[_case_id(k, b) for k, b, _ in KIND_CASES])
def test_kind_with_compiled_blocks_trains_as_one_process(kinds_trained, kind, backend):
    from dist_harness import outputs_of

    outs = outputs_of(kinds_trained, _case_id(kind, backend))
    want = _one_process(outs[0]["global_batch"])
    tolerance = INDUCTOR_TOLERANCE if backend == "inductor" else AOT_TOLERANCE
    for rank, out in enumerate(outs):
        if kind in ZERO_BUBBLE_KINDS:  # eager, and rank 0 says why
            assert out["blocks"] == {} and out["graphs"] == 0, out["blocks"]
            said = [w for w in out["warnings"] if "every block runs eager" in w]
            assert len(said) == (1 if rank == 0 else 0), out["warnings"]
            if rank == 0:
                assert "splits each backward into input and weight passes" in said[0]
        elif kind == "selective":  # eager, and rank 0 names the blocks (compiled_names)
            assert out["blocks"] == {} and out["graphs"] == 0, out["blocks"]
            said = [w for w in out["warnings"] if "recomputed selectively run eager" in w]
            assert len(said) == (1 if rank == 0 else 0), out["warnings"]
            if rank == 0:
                assert "7 block(s)" in said[0] and "(0, 1, 2, 3, 4, ...)" in said[0], said[0]
        else:  # every node module this rank runs, compiled, none fallen back
            assert out["blocks"] and all(out["blocks"].values()), out["blocks"]
            assert out["warnings"] == []
            # each block's forward a graph of Dynamo's (its training calls: one graph each)
            assert out["graphs"] >= len(out["blocks"]), (out["graphs"], out["blocks"])
            if not kind.startswith("pipeline-"):
                assert len(out["blocks"]) == 7, out["blocks"]
        _hold_to(out["state"], want, tolerance, f"{kind} ({backend}) rank {rank}",
                 f" ({out['seconds']:.1f} s)")
    if kind.startswith("pipeline-") and kind not in ZERO_BUBBLE_KINDS:  # the stages hold all
        held = [name.split("part.module.", 1)[1] for out in outs for name in out["blocks"]]
        assert sorted(held) == [str(i) for i in range(7)], held
    elif kind not in ZERO_BUBBLE_KINDS:
        assert outs[0]["blocks"] == outs[1]["blocks"]


@pytest.mark.full
@pytest.mark.parametrize("global_batch", [8, 16])
def test_one_process_inductor_against_eager_is_the_floor(global_batch):
    """The floor of the kinds' tolerance: one process, every block compiled by inductor, against
    eager, 2 SGD steps of the kinds' model at the kinds' global batches (8: tp and the
    pipelines, 16: two replicas)."""
    import torch.nn.functional as F

    torch.set_num_threads(1)
    states = []
    for compiled in (False, True):
        model = _mlp()
        if compiled:
            compile_blocks(model, [str(i) for i in range(7)], {})
        opt = torch.optim.SGD(model.parameters(), lr=KIND_LR)
        for step in range(KIND_STEPS):
            x, y = _batch(global_batch, 100 + step)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        if compiled:
            assert all(compiled_state(model[i]) for i in range(7))
        states.append(model.state_dict())
    floor = max((states[1][k] - states[0][k]).abs().max().item() for k in states[0])
    print(f"inductor against eager, one process, global batch {global_batch}: {floor:.3g}")
    for key, value in states[0].items():
        assert torch.allclose(states[1][key], value, **INDUCTOR_TOLERANCE), key


def test_the_planner_prices_eager_what_the_executor_runs_eager():
    """One rule, two languages: a schedule whose blocks the executor runs eager under compile
    (eager_reason) is priced eager by the planner (C++ blocks_run_eager), and every other
    schedule at the nodes' measured compile speed-up."""
    from hybridplan.planner import evaluate
    graph = Graph.from_dict({
        "schema_version": 1, "kind": "hybridplan.graph", "name": "abcd",
        "profiled": {"device": "cpu", "batch_size": 2, "dtype": "float32"},
        "nodes": [{"id": i, "name": n, "op": "linear", "forward_s": 0.01, "backward_s": 0.02,
                   "param_bytes": 1000, "output_bytes": 4000,
                   "compile_speedup": {"forward": 2.0, "backward": 2.0}}
                  for i, n in enumerate("abcd")],
        "edges": [{"src": i, "dst": i + 1} for i in range(3)]})
    cluster = {"schema_version": 1, "kind": "hybridplan.cluster", "name": "box",
               "num_nodes": 1, "devices_per_node": 2,
               "device": {"name": "dev", "memory_bytes": 1 << 30, "peak_flops": 1e12},
               "intra_node": {"bandwidth_bytes_per_s": 1e10, "latency_s": 1e-5},
               "inter_node": {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-4}}
    devices = {"gpipe": [0, 0, 1, 1], "1f1b": [0, 0, 1, 1], "interleaved-1f1b": [0, 1, 0, 1],
               "interleaved-zb": [0, 1, 0, 1], "zbv": [0, 1, 1, 0]}
    for schedule, on in devices.items():
        virtual = 1 if schedule in ("gpipe", "1f1b") else 2
        computes = {}
        for compile_ in (False, True):
            plan = {"schema_version": 1, "kind": "hybridplan.plan",
                    "graph": {"name": graph.name, "sha256": graph.sha256},
                    "cluster": {"name": "box", "num_nodes": 1, "devices_per_node": 2},
                    "world_size": 2, "dp": 1, "mp": 2, "mode": "pipeline",
                    "per_replica_batch": 4, "global_batch": 4, "num_microbatches": 2,
                    "schedule": schedule, "virtual_stages": virtual, "mesh": [[0, 1]],
                    "assignment": [{"node": i, "name": n,
                                    "device": on[i] if virtual == 1 else i}
                                   for i, n in enumerate("abcd")]}
            if compile_:
                plan["compile"] = True
            job = {"schema_version": 1, "kind": "hybridplan.job", "compile": compile_}
            computes[compile_] = evaluate(graph, cluster, plan, job)["compute_s"]
        eager = eager_reason(Plan.from_dict(dict(plan, compile=True), "p.json")) is not None
        assert (computes[True] == pytest.approx(computes[False])) == eager, (schedule, computes)
        if not eager:
            assert computes[True] < 0.75 * computes[False], (schedule, computes)


# ---- compositions, 16 bits, sequence parallelism, meta-built models ---------------------------
#
# The settings the kinds above do not reach, each with compiled blocks ("aot_eager"; inductor in
# `full`) against one process under the same setting, on Hugging Face decoders (their blocks:
# attention, MLPs, norms, embeddings):
#   tp-dp, pp-dp, hsdp  the 4-rank compositions of test_precision (dp=2 x tp=2, dp=2 x a
#                       2-stage 1F1B pipeline, zero3 over shard groups of 2 of 4 replicas), on
#                       GPT-2 in bf16 (autocast; hsdp: FSDP2's bf16 parameters)
#   bf16-tp, zero2-bf16 16 bits on 2 ranks: tensor parallelism under autocast, and FSDP2's
#                       MixedPrecisionPolicy (bf16 parameters gathered into the compiled block)
#   sp                  tensor parallelism with sequence parallelism (the per-token nodes run
#                       on Shard(1) DTensors of the sequence: test_tensor_parallel's "tp+sp") on
#                       Llama, fp32
#   meta-tp, meta-pipe  GPT-2 built on the meta device, materialised by apply (init_seed),
#                       under tp=2 and a 2-stage 1F1B pipeline (the stage's InterpreterModules
#                       compiled after the stage is materialised)
# `make test` runs sp with aot_eager (one 2-rank launch); the rest is `full`.
# Tolerances: fp32 cases, the executor's equality allclose(rtol 1e-4, atol 1e-6) with
# aot_eager (the kernels eager runs) and the compiled blocks' (rtol 1e-4, atol 1e-5) with
# inductor, as above; 16-bit cases, test_precision's bound (4u = 2^-6 of the update each
# parameter took, u bf16's unit roundoff, and the loss per step within 4u), which compiled
# blocks must meet as eager ones do: with aot_eager the compiled region runs the same bf16
# kernels under the same autocast policy (autocast is traced into the graph).

SETTING_STEPS = 2


def _setting(case):
    """(model, batch, loss_fn, plan, apply's extra keywords) of a settings case."""
    import test_meta_init
    import test_precision
    import test_tensor_parallel

    kind = case["kind"]
    if kind == "sp":
        model, batch, loss_fn = test_tensor_parallel.llama()
        return model, batch, loss_fn, test_tensor_parallel.plan_for("llama", "tp+sp"), {}
    if kind.startswith("meta-"):
        model, batch, loss_fn = test_meta_init.meta_model("gpt2")
        plan = test_meta_init.plan_for("gpt2", kind[len("meta-"):])
        return model, batch, loss_fn, plan, {"init_seed": test_meta_init.SEED}
    model, batch, loss_fn = test_precision.gpt2()
    return model, batch, loss_fn, test_precision.plan_of(kind, case["precision"]), {}


def _setting_optimizer(case):
    import test_meta_init
    import test_precision
    import test_tensor_parallel

    if case["kind"] == "sp":
        return test_tensor_parallel.sgd
    return test_meta_init.sgd if case["kind"].startswith("meta-") else test_precision.sgd


def settings_rank(cases_file, out_dir):
    """Rank side of the settings cases: applied with compiled blocks, SETTING_STEPS steps
    (meta: one, test_meta_init's reference) on the global batch's share; the state, the losses,
    the compiled blocks and this rank's compile warnings."""
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    import hybridplan
    from hybridplan.executor import destroy_groups
    from hybridplan.executor.compiling import compiled_blocks
    from plan_builders import share

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    for case in torch.load(cases_file):
        model, batch, loss_fn, plan, extra = _setting(case)
        option = True if case["backend"] == "inductor" else {"backend": case["backend"]}
        global_batch = plan["dp"] * plan["per_replica_batch"]
        graphs = counters["stats"]["unique_graphs"]
        meta = case["kind"].startswith("meta-")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hp = hybridplan.apply(plan, model, loss_fn=loss_fn,
                                  optimizer=_setting_optimizer(case), timeout_s=300,
                                  example_inputs=share(batch(global_batch, 0)[0], plan["dp"], 0),
                                  compile=option, **extra)
            losses = []
            for step in ([1] if meta else range(100, 100 + SETTING_STEPS)):
                losses.append(hp.step(*hp.shard(*batch(global_batch, step))).item())
        holder = hp.original if hp.plan.mode == "placement" else nn.ModuleList(hp._runner.modules)
        result = {"state": hp.state_dict(), "losses": losses, "blocks": compiled_blocks(holder),
                  "warnings": [str(w.message) for w in caught
                               if "hybridplan compile" in str(w.message)],
                  "graphs": counters["stats"]["unique_graphs"] - graphs,
                  "global_batch": global_batch}
        hp.close()
        torch.save(result, os.path.join(out_dir, f"{case['id']}.rank{dist.get_rank()}.pt"))
    destroy_groups()


SETTING_CASES = [  # (kind, precision, backend, ranks, in make test)
    ("sp", "fp32", "aot_eager", 2, True), ("bf16-tp", "bf16", "aot_eager", 2, False),
    ("zero2-bf16", "bf16", "aot_eager", 2, False), ("meta-pipe", "fp32", "aot_eager", 2, False),
    ("meta-tp", "fp32", "aot_eager", 2, False),
    ("tp-dp", "bf16", "aot_eager", 4, False), ("pp-dp", "bf16", "aot_eager", 4, False),
    ("hsdp", "bf16", "aot_eager", 4, False),
    ("sp", "fp32", "inductor", 2, False), ("zero2-bf16", "bf16", "inductor", 2, False),
]
_SETTING_KIND = {"bf16-tp": "tp", "zero2-bf16": "zero2"}  # test_precision's kind
SETTING_VOCAB_SPLIT = {"sp": "model.embed_tokens", "bf16-tp": "transformer.wte",
                       "meta-tp": "transformer.wte", "tp-dp": "transformer.wte"}


def _setting_id(kind, backend):
    return f"setting-{kind}-{backend}"


@pytest.fixture(scope="module")
def settings_trained(tmp_path_factory, selected_cases):
    from dist_harness import run_cases

    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    chosen = selected_cases("test_setting_with_compiled_blocks_trains_as_one_process", "kind",
                            "backend")
    ranks = {(k, b): r for k, _, b, r, _ in SETTING_CASES}
    by_world = {}
    for kind, backend in chosen:
        precision = next(p for k, p, b, _, _ in SETTING_CASES if (k, b) == (kind, backend))
        by_world.setdefault(ranks[kind, backend], []).append(
            {"id": _setting_id(kind, backend), "kind": _SETTING_KIND.get(kind, kind),
             "precision": precision, "backend": backend})
    if not by_world:
        return {}
    out_dir = tmp_path_factory.mktemp("compile_settings")
    loaded, _ = run_cases("test_compile_blocks:settings_rank", by_world, out_dir,
                          timeout_s=300 + 200 * max(len(c) for c in by_world.values()))
    return loaded


def _setting_reference(kind, precision, global_batch):
    """One process under the case's setting: (state, losses or None) and the tolerance check."""
    import test_meta_init
    import test_precision
    import test_tensor_parallel

    if kind == "sp":
        return test_tensor_parallel.reference_steps("llama", global_batch, SETTING_STEPS)[-1]
    if kind.startswith("meta-"):
        return test_meta_init.reference("gpt2", global_batch)[1]
    return test_precision.reference(_SETTING_KIND.get(kind, kind), SETTING_STEPS, precision)


@pytest.mark.parametrize("kind,precision,backend,ranks", [
    pytest.param(k, p, b, r, marks=() if quick else pytest.mark.full)
    for k, p, b, r, quick in SETTING_CASES],
    ids=[_setting_id(k, b) for k, _, b, _, _ in SETTING_CASES])
def test_setting_with_compiled_blocks_trains_as_one_process(settings_trained, kind, precision,
                                                            backend, ranks):
    import test_precision
    from dist_harness import outputs_of

    outs = outputs_of(settings_trained, _setting_id(kind, backend))
    assert len(outs) == ranks
    # tensor parallelism splits the embedding by vocabulary (vocab_rowwise): that block runs
    # eager, rank 0 naming it and the reason (compiling.node_eager_reason), every other block
    # compiled, none fallen back
    embedding = SETTING_VOCAB_SPLIT.get(kind)
    for rank, out in enumerate(outs):
        assert out["blocks"] and all(out["blocks"].values()), out["blocks"]
        # Dynamo compiled graphs (not one per block: a node module the model never calls,
        # GPT-2's attn_dropout under SDPA attention, compiles nothing)
        assert out["graphs"] >= len(out["blocks"]) - 2, (out["graphs"], out["blocks"])
        if embedding is None or rank > 0:
            assert out["warnings"] == [], out["warnings"]
        else:
            assert len(out["warnings"]) == 1, out["warnings"]
            assert f"block {embedding!r} (vocab_rowwise under tp=2) runs eager: a vocabulary-" \
                   f"split embedding's masked partial lookup" in out["warnings"][0]
        if embedding is not None:
            assert not any(n.endswith(embedding) for n in out["blocks"]), out["blocks"]
    if precision == "bf16":
        want, losses = _setting_reference(kind, precision, outs[0]["global_batch"])
        diff = max(test_precision.max_difference(out["state"], want) for out in outs)
        bound = test_precision.TOLERANCE * test_precision.update_size(want)
        loss_diff = max(abs(a - b) / abs(b)
                        for a, b in zip(test_precision.global_losses(outs), losses))
        print(f"compile {kind} ({backend}): largest difference from one process {diff:.3g} "
              f"(bound {bound:.3g}, {diff / bound:.2f} of it), loss {loss_diff:.3g}")
        assert diff <= bound, f"{kind} ({backend}): differs by {diff:.3g} (bound {bound:.3g})"
        assert loss_diff <= test_precision.TOLERANCE, (kind, loss_diff)
        return
    want = _setting_reference(kind, precision, outs[0]["global_batch"])
    tolerance = INDUCTOR_TOLERANCE if backend == "inductor" else AOT_TOLERANCE
    for rank, out in enumerate(outs):
        _hold_to(out["state"], want, tolerance, f"{kind} ({backend}) rank {rank}")


def test_the_planner_prices_eager_the_split_nodes_the_executor_runs_eager():
    """One rule, two languages, per node: a node that tensor parallelism splits in a style the
    executor runs eager under compile (compiling.node_eager_reason: a vocabulary-split
    embedding) is priced at its eager time by the planner (C++ node_runs_eager) at a tp it
    splits at, and at its compile speed-up where it runs whole (tp = 1); every other style
    compiles."""
    from hybridplan.planner import evaluate
    from hybridplan.executor.tensor_parallel import STYLES

    def graph(style):
        split = {"style": style, "max_degree": 2, "split_param_bytes": 500,
                 "activation_split": False,
                 "split_times": [{"degree": 2, "forward_s": 0.01, "backward_s": 0.02}]}
        return Graph.from_dict({
            "schema_version": 1, "kind": "hybridplan.graph", "name": f"split-{style}",
            "profiled": {"device": "cpu", "batch_size": 2, "dtype": "float32"},
            "nodes": [dict({"id": i, "name": n, "op": "linear", "forward_s": 0.01,
                            "backward_s": 0.02, "param_bytes": 1000, "output_bytes": 4000,
                            "compile_speedup": {"forward": 2.0, "backward": 2.0}},
                           **({"tensor_parallel": split} if n == "a" else {}))
                      for i, n in enumerate("ab")],
            "edges": [{"src": 0, "dst": 1}]})
    cluster = {"schema_version": 1, "kind": "hybridplan.cluster", "name": "box",
               "num_nodes": 1, "devices_per_node": 2,
               "device": {"name": "dev", "memory_bytes": 1 << 30, "peak_flops": 1e12},
               "intra_node": {"bandwidth_bytes_per_s": 1e10, "latency_s": 1e-5},
               "inter_node": {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-4}}
    for style in [s for s in STYLES if s != "sharded"]:
        g = graph(style)
        for tp in (1, 2):
            plan = {"schema_version": 1, "kind": "hybridplan.plan",
                    "graph": {"name": g.name, "sha256": g.sha256},
                    "cluster": {"name": "box", "num_nodes": 1, "devices_per_node": 2},
                    "world_size": tp, "dp": 1, "mp": 1, "mode": "placement", "tp": tp,
                    "per_replica_batch": 2, "global_batch": 2, "num_microbatches": 1,
                    "schedule": "none", "mesh": [[0]],
                    "assignment": [{"node": i, "name": n, "device": 0}
                                   for i, n in enumerate("ab")]}
            computes = {}
            for compile_ in (False, True):
                job = {"schema_version": 1, "kind": "hybridplan.job", "compile": compile_}
                computes[compile_] = evaluate(g, cluster, dict(plan, compile=compile_) if compile_
                                              else plan, job)["compute_s"]
            # the executor's rule: check_layout names the node's style where it splits
            eager = node_eager_reason(style if tp > 1 else None)
            # node a eager: only b's time halves (0.75 of eager); both compiled: 0.5
            want = 0.75 if eager else 0.5
            assert computes[True] == pytest.approx(want * computes[False], rel=1e-6), (
                style, tp, computes)
        assert (node_eager_reason(style) is not None) == (style == "vocab_rowwise"), style
