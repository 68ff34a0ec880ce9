"""Planning time and choice, side by side: meta-pytorch/autoparallel's sharding search against
hybridplan's search, for HF GPT-2 (124M, sequence 1024) on 8 devices, 1-D mesh (8,) and 2-D
mesh (2, 4), as /work/shared/peers/autoparallel_plan.py sets the peer up (fake process group,
"cpu" mesh, an H100's device limits, batch 8 x mesh[0], bf16 parameters, fp32 reduction).

    python3 bench/compare_autoparallel.py [--peer-python /tmp/apvenv/bin/python] [--meshes 8 2,4]
                                          [--out out/compare_autoparallel]

Per mesh it runs the peer in its own process (its venv: /work/shared/peers/README.md), one
mesh at a time, and records its wall time (trace + set-up, solve) and what it chose: each
parameter's placements by parameter kind, and the output placements of the forward's matrix
products. Then, in this process, hybridplan's search on GPT-2 built by `from_config` (no
profiling; H100 GEMM model) on one dgx-h100 node of 8 GPUs, at the same global batch: the best
plan over everything the search may choose, the best with dp = 8 alone, and dp = 2 x tp = 4 (the
peer's 2-D mesh: searched with tp = 4 where the Python search takes `tensor_degrees`, else that
plan evaluated), each with its wall-clock planning time; and prices the peer's choice with our
cost model where it is one of our plans (every product split by batch or tokens, parameters
sharded: zero3 data parallelism over the devices; Megatron's column/row splits on mesh dim 1:
dp x tp), else the nearest two (dp = all devices with zero3; dp = mesh[1] x tp = mesh[0]).
Writes results.md and results.json (default out/compare_autoparallel/; docs/megatron_reproduction.md
"Planning time against autoparallel" discusses one run).

The peer runs as `--peer-driver MESH` under the peer's Python (this file's own second role)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.fspath(ROOT / "python"))  # run from a checkout without PYTHONPATH too
PEER_DIR = Path("/work/shared/peers")
SEQ = 1024
PER_MESH0_BATCH = 8   # the peer script's batch: 8 x mesh[0]


# ---- the peer (runs under the peer's venv) ---------------------------------------------------

def _peer_driver(mesh_arg: str) -> int:
    """What autoparallel_plan.py does, then a JSON summary of the chosen placements on the last
    line of stdout."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from torch.distributed.tensor.placement_types import Replicate, Shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    import autoparallel.cost_models.compute_estimation as ce
    h100 = [lim for lim in ce.DEVICE_LIMITS if lim.name == "H100"][0]
    ce._get_device_limit = lambda: h100
    from autoparallel.api import AutoParallel
    from autoparallel.export_json import _get_phase
    from torch._functorch._aot_autograd.fx_utils import get_param_nodes
    from transformers import GPT2Config, GPT2LMHeadModel
    import pulp

    mesh_shape = tuple(int(s) for s in mesh_arg.split(","))
    world = 1
    for s in mesh_shape:
        world *= s
    torch.distributed.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    mesh = torch.distributed.device_mesh.init_device_mesh(
        "cpu", mesh_shape, mesh_dim_names=tuple(f"d{i}" for i in range(len(mesh_shape))))
    cfg = GPT2Config(use_cache=False)
    with torch.device("meta"):
        model = GPT2LMHeadModel(cfg)
    bs = PER_MESH0_BATCH * mesh_shape[0]

    def input_fn():
        return torch.randint(0, cfg.vocab_size, (bs, SEQ), device="cpu")
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    t0 = time.time()
    with AutoParallel(model, input_fn, mesh, mp, repeated_subgraphs=True) as autop:
        autop.add_input_constraints([(Shard(0),) + (Replicate(),) * (len(mesh_shape) - 1)])
        autop.add_parameter_memory_constraint(low=None, high=None)
        t1 = time.time()
        placement = autop.optimize_placement(verbose=False)
        t2 = time.time()
        opt = autop.sharding_optimizer
        params = {}
        for node in get_param_nodes(opt.orig_gm.graph):   # the solution's keys
            desc = node.meta.get("desc")
            fqn = getattr(desc, "target", node.name)
            spec = placement[node].output_specs
            params[fqn] = [str(p) for p in spec.placements]
        objective = pulp.value(opt.prob.objective)
        # how the forward's matrix products are split: their output placements, by op
        ops: dict = {}
        for node, strategy in placement.items():
            target = str(getattr(node, "target", ""))
            if node.op != "call_function" or not any(
                    k in target for k in ("aten.mm", "aten.addmm", "aten.bmm",
                                          "scaled_dot_product")):
                continue
            if _get_phase(node) != "forward":
                continue
            specs = strategy.output_specs
            spec = specs[0] if isinstance(specs, (list, tuple)) else specs
            key = target.split(".")[1] if "." in target else target
            key = f"{key} ({', '.join(str(p) for p in spec.placements)})"
            ops[key] = ops.get(key, 0) + 1
    print(f"mesh {mesh_shape}: trace+setup {t1 - t0:.1f} s, solve {t2 - t1:.1f} s, "
          f"total {t2 - t0:.1f} s", flush=True)
    print(json.dumps({"mesh": list(mesh_shape), "batch": bs, "setup_s": t1 - t0,
                      "solve_s": t2 - t1, "total_s": t2 - t0, "objective": objective,
                      "params": params, "ops": ops}))
    return 0


def _kind(fqn: str) -> str:
    """A GPT-2 parameter's kind: 'h.N.attn.c_attn.weight' -> 'attn.c_attn.weight'."""
    parts = fqn.split(".")
    if "h" in parts:
        i = parts.index("h")
        return ".".join(parts[i + 2:])
    return ".".join(p for p in parts if p != "transformer")


def summarize_placements(params: dict) -> dict:
    """{kind: {placements: count}} over the parameters."""
    out: dict = {}
    for fqn, placements in params.items():
        key = "(" + ", ".join(placements) + ")"
        out.setdefault(_kind(fqn), {}).setdefault(key, 0)
        out[_kind(fqn)][key] += 1
    return out


def interpret(mesh: list, params: dict, ops: dict = None) -> dict:
    """What the peer's choice is in our terms, where it is one of ours: {'dp', 'tp', 'sharding',
    'what'}; 'dp' None when it maps onto nothing we plan. HF GPT-2's Conv1D weights are
    [in, out]: Shard(1) (printed "S(1)") splits output features (column-wise), Shard(0) input
    features (row-wise); "R" is Replicate."""
    weights = {f: p for f, p in params.items() if f.endswith(".weight") and ".h." in "." + f}
    dims = len(mesh)
    if dims == 1:
        shard0 = all(p[0].startswith("S(") for p in params.values())
        repl = all(p[0] == "R" for p in params.values())
        if shard0 or sum(p[0].startswith("S(") for p in params.values()) > len(params) / 2:
            return {"dp": mesh[0], "tp": 1, "sharding": "zero3",
                    "what": "parameters sharded over the batch dimension's devices (FSDP / "
                            "ZeRO-3)" + ("" if shard0 else "; some left replicated")}
        if repl:
            return {"dp": mesh[0], "tp": 1, "sharding": "none", "what": "replicated (DDP)"}
        return {"dp": None, "what": "mixed placements"}
    # 2-D: dim 0 carries the batch (the input constraint); dim 1
    col = {"attn.c_attn.weight", "mlp.c_fc.weight"}
    row = {"attn.c_proj.weight", "mlp.c_proj.weight"}
    megatron = all(p[1] == ("S(1)" if _kind(f) in col else "S(0)")
                   for f, p in weights.items() if _kind(f) in col | row)
    d0_shard = sum(p[0].startswith("S(") for p in params.values()) > len(params) / 2
    all_shard = all(all(x.startswith("S(") for x in p) for p in params.values())
    # every forward matrix product's output split along its first (token) dimension on every
    # mesh dimension: data parallelism over all the devices (batch on dim 0, tokens on dim 1)
    tokens_only = bool(ops) and all(
        all(x == "S(0)" for x in k[k.index("(") + 1:-1].split(", ")) for k in ops)
    if tokens_only and not megatron:
        return {"dp": mesh[0] * mesh[1], "tp": 1, "sharding": "zero3" if all_shard else "none",
                "what": "data parallelism over all the devices: every matrix product split "
                        "by tokens on both mesh dims (batch on dim 0, sequence on dim 1)"
                        + (", parameters sharded over both (FSDP / ZeRO-3)"
                           if all_shard else "")}
    if megatron:
        return {"dp": mesh[0], "tp": mesh[1], "sharding": "zero3" if d0_shard else "none",
                "what": "Megatron column/row splits on mesh dim 1, batch on dim 0"
                        + (", parameters also sharded on dim 0 (FSDP + TP)" if d0_shard else "")}
    # a mix: say per mesh dim which matrix products are split by features (S(1)) or left as
    # partial sums (P(sum): a row-wise split), and price the nearest plans of ours
    what = []
    for dim in range(dims):
        split = sum(v for k, v in (ops or {}).items()
                    if k[k.index("(") + 1:-1].split(", ")[dim] in ("S(1)", "P(sum)"))
        total = sum((ops or {}).values())
        what.append(f"mesh dim {dim} ({mesh[dim]}): {split} of {total} forward matrix products "
                    f"split by features (column-wise S(1) / row-wise P(sum)), the others by "
                    f"tokens")
    return {"dp": None, "what": "; ".join(what) + " (no plan of ours is the same)",
            "nearest": [{"dp": mesh[0] * mesh[1], "tp": 1, "sharding": "zero3"},
                        {"dp": mesh[1], "tp": mesh[0], "sharding": "none"}]}


def run_peer(python: str, mesh: str, timeout: int = 900) -> dict:
    start = time.monotonic()
    proc = subprocess.run([python, os.fspath(Path(__file__).resolve()), "--peer-driver", mesh],
                          capture_output=True, text=True, timeout=timeout,
                          cwd=os.fspath(PEER_DIR))
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"autoparallel on mesh {mesh} failed (exit {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = wall
    return result


# ---- ours ---------------------------------------------------------------------------------------

def gpt2_graph():
    from hybridplan.planner import Graph
    from hybridplan.profiler.from_config import TransformerConfig, graph_from_config
    cfg = TransformerConfig("gpt2-124m", layers=12, hidden=768, heads=12, seq_len=SEQ,
                            vocab=50257)
    t0 = time.monotonic()
    g = Graph.from_dict(graph_from_config(cfg, device="H100"), "gpt2 from_config")
    return g, time.monotonic() - t0


def _plan_row(label: str, plan, seconds: float) -> dict:
    d = plan.to_dict() if hasattr(plan, "to_dict") else plan
    pred = d["predicted"]
    return {"label": label, "plan_s": seconds, "dp": d["dp"], "mp": d["mp"],
            "tp": d.get("tp", 1), "mode": d["mode"], "schedule": d.get("schedule", "none"),
            "sharding": d.get("sharding", "none"),
            "microbatches": d.get("num_microbatches", 1),
            "recompute": sorted({str(a.get("recompute", False)) for a in d["assignment"]}),
            "step_s": pred["step_s"], "memory_gib": max(pred["memory_bytes"]) / 2**30,
            "feasible": pred.get("feasible", True)}


def ours(global_batch: int) -> list:
    """Our search at `global_batch` on one dgx-h100 node: the best plan over everything, the
    best with dp = 8 alone, and dp = 2 x tp = 4 (searched over tp = 4 where the Python search
    takes `tensor_degrees`, else that fixed plan evaluated), each with its wall time."""
    import inspect

    from hybridplan.planner import Cluster, InfeasibleError, search
    g, build_s = gpt2_graph()
    cluster = Cluster.preset("dgx-h100").with_num_nodes(1)
    job = _job(global_batch)
    rows = []
    t0 = time.monotonic()
    best = search(g, cluster, job, devices=8, top_k=1).plans[0]
    rows.append(_plan_row(f"search, anything (graph built in {build_s * 1e3:.0f} ms)", best,
                          time.monotonic() - t0))
    t0 = time.monotonic()
    dp8 = search(g, cluster, job, devices=8, top_k=1, dp_only=True).plans[0]
    rows.append(_plan_row("search, dp = 8 only", dp8, time.monotonic() - t0))
    if "tensor_degrees" in inspect.signature(search).parameters:
        t0 = time.monotonic()
        try:
            res = search(g, cluster, job, devices=8, top_k=10, modes=("placement",),
                         tensor_degrees=[4])
            cands = [p for p in res.plans if p.dp == 2]
            rows.append(_plan_row("search, tp = 4 (dp = 2)", cands[0], time.monotonic() - t0)
                        if cands else {"label": "search, tp = 4 (dp = 2)",
                                       "infeasible": "no dp = 2 plan among the top 10"})
        except InfeasibleError as e:
            rows.append({"label": "search, tp = 4 (dp = 2)", "infeasible": str(e)})
    else:
        fixed = price_layout({"dp": 2, "tp": 4, "sharding": "none"}, global_batch)
        if fixed is not None:
            fixed["label"] = "fixed dp = 2 x tp = 4, evaluated"
            rows.append(fixed)
    return rows


def _job(global_batch: int):
    from hybridplan.planner import Job
    return Job.from_dict({"schema_version": 1, "kind": "hybridplan.job",
                          "global_batch": global_batch, "optimizer": "adam"}, "gpt2 job")


def price_layout(interpretation: dict, global_batch: int):
    """A dp x tp placement plan (the peer's choice where it maps onto one), evaluated by our
    cost model; None if it maps onto none."""
    from hybridplan.planner import Cluster, evaluate
    if interpretation.get("dp") is None:
        return None
    g, _ = gpt2_graph()
    cluster = Cluster.preset("dgx-h100").with_num_nodes(1)
    dp, tp = interpretation["dp"], interpretation["tp"]
    nodes = g.nodes
    plan = {"schema_version": 1, "kind": "hybridplan.plan",
            "graph": {"name": g.name, "sha256": g.sha256},
            "cluster": {"name": cluster.name, "num_nodes": 1, "devices_per_node": 8},
            "world_size": dp * tp, "dp": dp, "mp": 1, "mode": "placement",
            "per_replica_batch": global_batch // dp, "global_batch": global_batch,
            "num_microbatches": 1, "schedule": "none",
            "mesh": [[r * tp] for r in range(dp)],
            "assignment": [{"node": n["id"], "name": n["name"], "device": 0} for n in nodes]}
    if tp > 1:
        plan["tp"] = tp
    if interpretation["sharding"] != "none":
        plan["sharding"] = interpretation["sharding"]
    job = _job(global_batch)
    t0 = time.monotonic()
    try:
        pred = evaluate(g, cluster, plan, job)
    except Exception as e:  # the core's refusal says why (e.g. no tp yet)
        return {"error": str(e)}
    plan["predicted"] = pred
    return _plan_row("autoparallel's choice, priced by our model", plan, time.monotonic() - t0)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-driver", metavar="MESH", help=argparse.SUPPRESS)
    ap.add_argument("--peer-python", default="/tmp/apvenv/bin/python")
    ap.add_argument("--meshes", nargs="+", default=["8", "2,4"])
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "compare_autoparallel")
    ap.add_argument("--peer-results", type=Path,
                    help="reuse a previous run's results.json for the peer (no peer runs)")
    args = ap.parse_args(argv)
    if args.peer_driver:
        return _peer_driver(args.peer_driver)
    args.out.mkdir(parents=True, exist_ok=True)
    previous = (json.loads(args.peer_results.read_text())["peer"] if args.peer_results
                else {})
    report = {"peer": {}, "ours": {}, "peer_priced": {}}
    for mesh in args.meshes:
        if mesh in previous:
            peer = previous[mesh]
        else:
            print(f"autoparallel, mesh ({mesh}) ...", flush=True)
            peer = run_peer(args.peer_python, mesh)
        peer["summary"] = summarize_placements(peer["params"])
        peer["ours"] = interpret(peer["mesh"], peer["params"], peer.get("ops"))
        report["peer"][mesh] = peer
        print(f"  {peer['total_s']:.1f} s (solve {peer['solve_s']:.1f} s): "
              f"{peer['ours']['what']}", flush=True)
    for mesh, peer in report["peer"].items():
        gb = peer["batch"]
        if str(gb) not in report["ours"]:
            report["ours"][str(gb)] = ours(gb)
        report["peer_priced"][mesh] = price_layout(peer["ours"], gb)
        for k, near in enumerate(peer["ours"].get("nearest", [])):
            row = price_layout(near, gb)
            if row is not None and "label" in row:
                row["label"] = "nearest of ours, priced by our model"
            report["peer_priced"][f"{mesh} nearest {k}"] = row
    (args.out / "results.json").write_text(json.dumps(report, indent=1, default=str))
    text = markdown(report)
    (args.out / "results.md").write_text(text)
    print(text)
    return 0


def _fmt_row(r: dict) -> str:
    if r is None:
        return "| - | - | - | - | - |"
    if "error" in r or "infeasible" in r:
        return f"| {r.get('label', '')} | - | {r.get('error') or r.get('infeasible')} | - | - |"
    layout = (f"dp {r['dp']} x mp {r['mp']} x tp {r['tp']} {r['mode']}"
              + (f" {r['schedule']} M={r['microbatches']}" if r["mode"] == "pipeline" else "")
              + ("" if r["sharding"] == "none" else f" {r['sharding']}")
              + ("" if r["recompute"] == ["False"] else f" recompute {'/'.join(r['recompute'])}"))
    return (f"| {r['label']} | {r['plan_s']:.3f} | {layout} | {r['step_s'] * 1e3:.1f} | "
            f"{r['memory_gib']:.1f} |")


def markdown(report: dict) -> str:
    lines = ["# Planning GPT-2 (124M, seq 1024) on 8 H100s: autoparallel against hybridplan", ""]
    for mesh, peer in report["peer"].items():
        lines += [f"## autoparallel, mesh ({mesh}), batch {peer['batch']}", "",
                  f"wall: {peer['total_s']:.1f} s in all (trace + set-up {peer['setup_s']:.1f} s, "
                  f"ILP solve {peer['solve_s']:.1f} s; process {peer['process_wall_s']:.1f} s "
                  f"with imports); objective {peer['objective']:.4g}", "",
                  f"as our plan: {peer['ours']['what']}", "",
                  "| parameter kind | placements (count) |", "|---|---|"]
        for kind, counts in sorted(peer["summary"].items()):
            lines.append(f"| {kind} | " + ", ".join(f"{k} x{v}" for k, v in counts.items())
                         + " |")
        if peer.get("ops"):
            lines += ["", "| forward matrix product (output placements) | count |", "|---|---|"]
            lines += [f"| {k} | {v} |" for k, v in sorted(peer["ops"].items())]
        lines.append("")
    for gb, rows in report["ours"].items():
        lines += [f"## hybridplan, global batch {gb}, one dgx-h100 node", "",
                  "| what | planning wall s | plan | predicted step ms | peak memory GiB |",
                  "|---|---|---|---|---|"]
        lines += [_fmt_row(r) for r in rows]
        for mesh, peer in report["peer"].items():
            if str(peer["batch"]) != gb:
                continue
            for key, row in report["peer_priced"].items():
                if key == mesh or key.startswith(f"{mesh} nearest"):
                    if row is not None:
                        lines.append(_fmt_row(row).replace("| ", f"| mesh ({mesh}): ", 1))
        lines.append("")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
