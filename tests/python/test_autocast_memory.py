"""What a bf16 job's plans keep for backward (docs/training_step.md "Precision", "What the
planner prices"): the profile records what a forward saves under torch.autocast in each 16-bit
dtype, and the planner prices the plans the executor autocasts from it, FSDP2's plans at half
the float32 bytes (csrc/planner/costs/precision_cost.h)."""

import importlib.util
import os

import pytest
import torch

from hybridplan import models
from hybridplan.executor import precision
from hybridplan.planner import Cluster, Job, Plan, evaluate, search, with_sharding
from hybridplan.profiler.profile import profile_dict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BATCH = 8


def _bench():
    spec = importlib.util.spec_from_file_location(
        "bench_autocast_saved", os.path.join(ROOT, "bench", "bench_autocast_saved.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def transformer_graph():
    torch.manual_seed(0)
    m = models.transformer_lm()
    loss_fn, target = models.loss_and_target(m, BATCH)
    return profile_dict(m, m.example_inputs(BATCH), warmup=0, repeats=1, verbose=False,
                        batch_sizes=[], loss_fn=loss_fn, target=target, tensor_parallel=False)


def test_profile_records_what_autocast_keeps(transformer_graph):
    g = transformer_graph
    nodes = {n["name"]: n for n in g["nodes"]}
    fp32 = sum(n["saved_bytes"] for n in g["nodes"])
    for dtype in ("bf16", "fp16"):
        kept = sum(n["autocast_saved_bytes"][dtype] + n.get("autocast_weight_copy_bytes", {})
                   .get(dtype, 0) for n in g["nodes"])
        # the residual stream stays fp32 (layer norm keeps its fp32 input): above half
        assert kept > 0.6 * fp32, (dtype, kept, fp32)
        assert kept < fp32, (dtype, kept, fp32)
        for name, n in nodes.items():
            if name.endswith(("norm1", "norm2")) or name == "norm":
                assert n["autocast_saved_bytes"][dtype] == n["saved_bytes"], name
        # cross-entropy runs in fp32 under autocast: its backward's peak as in float32
        assert g["profiled"]["autocast_loss_backward_bytes"][dtype] == pytest.approx(
            g["profiled"]["loss_backward_bytes"], rel=0.05)
    # the weight copies: 2 bytes for each weight of a matrix product, whatever the batch
    copies = sum(n.get("autocast_weight_copy_bytes", {}).get("bf16", 0) for n in g["nodes"])
    assert 0 < copies <= sum(n["param_bytes"] for n in g["nodes"]) / 2

    # bench_autocast_saved's count (the op-by-op breakdown), node by node
    bench = _bench()
    rows, loss_bytes = bench.run("autocast", BATCH, list(nodes))
    counted = {}
    for (node, _, _), b in rows.items():
        counted[node] = counted.get(node, 0) + b
    for name, n in nodes.items():
        recorded = n["autocast_saved_bytes"]["bf16"] + n.get(
            "autocast_weight_copy_bytes", {}).get("bf16", 0)
        assert recorded == pytest.approx(counted.get(name, 0), rel=0.03, abs=64), name
    assert loss_bytes == pytest.approx(
        g["profiled"]["autocast_loss_backward_bytes"]["bf16"], rel=0.03)


def _chain_graph():
    """Three nodes profiled in float32 with a loss, the first a layer norm whose autocast bf16
    bytes are its fp32 ones."""
    nodes = []
    for i, (name, params) in enumerate((("norm", 0), ("fc1", 4096), ("fc2", 4096))):
        nodes.append({"id": i, "name": name, "op": "test", "forward_s": 0.01,
                      "backward_s": 0.02, "param_bytes": params, "output_bytes": 1 << 16,
                      "saved_bytes": 1 << 16,
                      "autocast_saved_bytes": {"bf16": 1 << 16 if name == "norm" else 1 << 15}})
        if params:
            nodes[-1]["autocast_weight_copy_bytes"] = {"bf16": params // 2}
    return {"schema_version": 1, "kind": "hybridplan.graph", "name": "chain",
            "profiled": {"device": "cpu", "batch_size": 8, "dtype": "float32",
                         "loss_backward_bytes": 1 << 17,
                         "autocast_loss_backward_bytes": {"bf16": 1 << 17}},
            "nodes": nodes,
            "edges": [{"src": 0, "dst": 1, "bytes": 1 << 16},
                      {"src": 1, "dst": 2, "bytes": 1 << 16}]}


def test_planner_and_executor_agree_on_which_plans_autocast():
    """The C++ rule (precision_cost.h precision_policy) against executor/precision.py's of_plan,
    over the plan kinds a search makes on 4 devices: a plan priced from the autocast recording
    is one the executor autocasts."""
    graph = _chain_graph()
    cluster = Cluster.preset("localhost-cpu").to_dict()
    cluster["devices_per_node"] = 4
    cluster["device"]["compute_speedup"] = {"bf16": 0.5}
    job = Job.from_dict({"schema_version": 1, "kind": "hybridplan.job", "precision": "bf16"})
    plans = search(graph, cluster, job, devices=4, top_k=400).plans
    for plan in list(plans):  # the sharded kinds of the data-parallel plans
        if plan.dp >= 2 and plan.tp == 1:
            for sharding in ("zero2",) if plan.mode == "pipeline" else ("zero2", "zero3"):
                plans.append(Plan.from_dict(with_sharding(plan, sharding, graph, cluster, job)))
    kinds = set()
    for plan in plans:
        model = evaluate(graph, cluster, plan, job)["memory_model"]
        autocasts = precision.of_plan(plan).autocasts
        assert model.startswith("kept activations as profiled under torch.autocast") == autocasts, (
            plan.mode, plan.sharding, model)
        assert model.startswith("kept activations at half") == (not autocasts)
        kinds.add((plan.mode, plan.sharding))
    # the kinds that tell the rules apart: sharded placement (FSDP2) and a pipeline's zero2
    assert {("placement", "none"), ("placement", "zero2"), ("placement", "zero3"),
            ("pipeline", "none"), ("pipeline", "zero2")} <= kinds, kinds
