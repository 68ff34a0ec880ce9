"""Reproduces the scaling study of Narayanan et al., "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", SC'21 (https://arxiv.org/abs/2104.04473), with our
planner and a GPT graph built from each configuration (hybridplan.profiler.from_config: no
profiling, a cited GEMM efficiency model).

For every model of the paper's Table 1 (1.7B .. 1T parameters, sequence 2048, vocabulary 51200,
on 32 .. 3072 A100-80GB in DGX A100 nodes: the dgx-a100 preset with num_nodes = GPUs / 8) at the
paper's global batch it reports
  - Megatron-LM's own (t, p, d), 1F1B, micro-batch 1, full activation recompute, priced by our
    cost model ("Megatron's plan, predicted"), beside the TFLOP/s per GPU they measured;
  - the planner's choice at the same global batch on the same GPUs (tp, mp, dp, mode,
    schedule, micro-batches, recompute, sharding) and its predicted TFLOP/s per GPU;
TFLOP/s per GPU is the paper's eq. (3) (model FLOPs of a step, recomputed forward included, as
they count it) over the predicted step time and the GPUs. Then
  - Figure 13: the 162.2B model (32 layers, hidden 20480, 128 heads) on 64 GPUs, pipeline x
    tensor = (2,32) .. (32,2), global batch 32 and 128, each fixed plan priced;
  - Figure 10 / Table 2: ZeRO-3 without model parallelism against PTD-P for the 175B and
    530B models on 384 .. 2240 GPUs, both priced, beside the paper's numbers;
  - a sensitivity table: Table 1 again with the GEMM efficiency x0.8 / x1.2 and every link's
    bandwidth x0.5 / x2.
and writes results/results.md, results.json and figures (table1.png, fig13.png, fig10.png).

    python3 reproductions/megatron2021/reproduce.py [--rows 1.7B 18.4B ...] [--no-sensitivity]
                                                   [--out reproductions/megatron2021/results]

The paper's numbers below were transcribed from arXiv 2104.04473 v5 (Table 1, Table 2); see
README.md for what is transcribed, what is read off a figure and what is not available."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "python"))  # run from a checkout without PYTHONPATH too

from hybridplan.planner import Cluster, Graph, InfeasibleError, Job, evaluate, search  # noqa: E402
from hybridplan.profiler.from_config import (TransformerConfig, graph_from_config,  # noqa: E402
                                             megatron_step_flops)

SEQ, VOCAB, NODE = 2048, 51200, 8


@dataclasses.dataclass(frozen=True)
class Table1Row:
    """One row of Table 1 (weak scaling): the model, their layout and measured throughput."""
    label: str          # parameters as the paper writes them
    heads: int
    hidden: int
    layers: int
    t: int              # tensor-parallel size
    p: int              # pipeline-parallel size
    gpus: int
    batch: int          # global batch (sequences)
    tflops: float       # achieved teraFLOP/s per GPU
    peak_pct: int       # percentage of theoretical peak
    pflops: float       # aggregate petaFLOP/s

    @property
    def d(self) -> int:
        return self.gpus // (self.t * self.p)

    def config(self) -> TransformerConfig:
        return TransformerConfig(f"gpt-{self.label}", self.layers, self.hidden, self.heads, SEQ,
                                 VOCAB)


# Narayanan et al. 2021, Table 1 ("Weak-scaling throughput for GPT models ranging from 1 billion
# to 1 trillion parameters"), transcribed.
TABLE1 = [
    Table1Row("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137, 44, 4.4),
    Table1Row("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138, 44, 8.8),
    Table1Row("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142, 46, 18.2),
    Table1Row("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135, 43, 34.6),
    Table1Row("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138, 44, 70.8),
    Table1Row("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140, 45, 143.8),
    Table1Row("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148, 47, 227.1),
    Table1Row("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155, 50, 297.4),
    Table1Row("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163, 52, 410.2),
    Table1Row("1008.0B", 160, 25600, 128, 8, 64, 3072, 3072, 163, 52, 502.0),
]

# Figure 13: "a 161-billion-parameter GPT model (32 transformer layers to support
# pipeline-parallel size of 32, 128 attention heads, hidden size of 20480)" on 64 GPUs; (pipeline,
# tensor) sizes on the x axis, global batch 32 and 128. The bars' values are not transcribed
# (a figure); the paper's finding: best at (8, 8), much worse once tensor parallelism leaves the
# node (t > 8).
FIG13_MODEL = Table1Row("162.2B", 128, 20480, 32, 8, 8, 64, 128, float("nan"), 0, float("nan"))
FIG13_LAYOUTS = [(2, 32), (4, 16), (8, 8), (16, 4), (32, 2)]
FIG13_BATCHES = [32, 128]

# Table 2 (the points of Figure 10): ZeRO-3 without model parallelism against PTD-P, 175B and
# 530B, global batch fixed per model (ZeRO-3 530B at 640 GPUs: 2560), transcribed:
# (scheme, model, model-parallel t x p, global batch, GPUs, micro-batch, TFLOP/s per GPU).
GPT175 = Table1Row("174.6B", 96, 12288, 96, 8, 12, 0, 1536, float("nan"), 0, float("nan"))
GPT530 = Table1Row("529.6B", 128, 20480, 105, 8, 35, 0, 2240, float("nan"), 0, float("nan"))
TABLE2 = [
    ("ZeRO-3", GPT175, (1, 1), 1536, 384, 4, 144), ("ZeRO-3", GPT175, (1, 1), 1536, 768, 2, 88),
    ("ZeRO-3", GPT175, (1, 1), 1536, 1536, 1, 44),
    ("ZeRO-3", GPT530, (1, 1), 2560, 640, 4, 138), ("ZeRO-3", GPT530, (1, 1), 2240, 1120, 2, 98),
    ("ZeRO-3", GPT530, (1, 1), 2240, 2240, 1, 48),
    ("PTD-P", GPT175, (8, 12), 1536, 384, 1, 153), ("PTD-P", GPT175, (8, 12), 1536, 768, 1, 149),
    ("PTD-P", GPT175, (8, 12), 1536, 1536, 1, 141),
    ("PTD-P", GPT530, (8, 35), 2240, 560, 1, 171), ("PTD-P", GPT530, (8, 35), 2240, 1120, 1, 167),
    ("PTD-P", GPT530, (8, 35), 2240, 2240, 1, 159),
]


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    gemm_scale: float = 1.0
    link_scale: float = 1.0


VARIANTS = [Variant("as modelled"), Variant("GEMM efficiency x0.8", gemm_scale=0.8),
            Variant("GEMM efficiency x1.2", gemm_scale=1.2),
            Variant("link bandwidth x0.5", link_scale=0.5),
            Variant("link bandwidth x2", link_scale=2.0)]


# ---- inputs -----------------------------------------------------------------------------------

_GRAPHS: dict = {}


def graph_for(row: Table1Row, gemm_scale: float = 1.0) -> Graph:
    """The model's graph: fp16 (parameters at 2 bytes each), micro-batch unit 1, Megatron's
    vocab-parallel cross-entropy. The fp32 master weights and optimizer state are the job's
    (job_for: mixed_precision)."""
    key = (row.layers, row.hidden, row.heads, gemm_scale)
    if key not in _GRAPHS:
        _GRAPHS[key] = Graph.from_dict(
            graph_from_config(row.config(), device="A100", efficiency_scale=gemm_scale,
                              parallel_cross_entropy=True), f"from_config {row.label}")
    return _GRAPHS[key]


def cluster_for(gpus: int, link_scale: float = 1.0) -> Cluster:
    d = Cluster.preset("dgx-a100").with_num_nodes(math.ceil(gpus / NODE)).to_dict()
    if link_scale != 1.0:
        for level in ("intra_node", "inter_node"):
            d[level]["bandwidth_bytes_per_s"] *= link_scale
        d["name"] = f"dgx-a100 (links x{link_scale:g})"
    return Cluster.from_dict(d, d["name"])


def job_for(global_batch: int) -> Job:
    """The paper's global batch, fixed; mixed-precision Adam as Megatron-LM runs it (fp16
    weights and gradients, fp32 master weights and moments: 16 bytes a parameter; docs/formats.md
    Job)."""
    return Job.from_dict({"schema_version": 1, "kind": "hybridplan.job",
                          "global_batch": global_batch, "optimizer": "adam",
                          "mixed_precision": True},
                         f"global batch {global_batch}, mixed-precision Adam")


# ---- plans ------------------------------------------------------------------------------------

def megatron_plan(graph: Graph, cluster: Cluster, t: int, p: int, d: int, global_batch: int,
                  micro: int = 1, schedule: str = "1f1b", recompute="full",
                  sharding: str = "none") -> dict:
    """Megatron-LM's layout as a hybridplan plan: p pipeline stages of whole layers (as even as
    the layers divide; the embedding on the first stage, the final norm and LM head on the
    last), t-way tensor parallelism, d replicas, micro-batches of `micro`, every node recomputed
    (their runs recompute activations). Ranks in Megatron-LM's order (tensor innermost, then
    data, then pipeline): stage s of replica r on devices (s d + r) t .. + t - 1. p = 1 is a
    placement plan (every node on the replica's one device group)."""
    nodes = graph.nodes
    layer_of = {}
    layers = 0
    for n in nodes:
        if n["name"].startswith("layers."):
            layer_of[n["id"]] = int(n["name"].split(".")[1])
            layers = max(layers, layer_of[n["id"]] + 1)
    if p > layers:
        raise ValueError(f"{p} pipeline stages for {layers} layers")

    def stage(node) -> int:
        if node["id"] in layer_of:
            return layer_of[node["id"]] * p // layers
        return 0 if node["name"] == "embedding" else p - 1

    per_replica = global_batch // d
    plan = {"schema_version": 1, "kind": "hybridplan.plan",
            "graph": {"name": graph.name, "sha256": graph.sha256},
            "cluster": {"name": cluster.name, "num_nodes": cluster.num_nodes,
                        "devices_per_node": cluster.devices_per_node},
            "world_size": d * p * t, "dp": d, "mp": p,
            "mode": "pipeline" if p > 1 else "placement",
            "per_replica_batch": per_replica, "global_batch": per_replica * d,
            "num_microbatches": per_replica // micro if p > 1 else 1,
            "schedule": schedule if p > 1 else "none",
            "mesh": [[(s * d + r) * t for s in range(p)] for r in range(d)],
            "assignment": [dict({"node": n["id"], "name": n["name"],
                                 "device": stage(n) if p > 1 else 0},
                                **({"recompute": recompute} if recompute else {}))
                           for n in nodes]}
    if t > 1:
        plan["tp"] = t
    if sharding != "none":
        plan["sharding"] = sharding
    return plan


def price(graph: Graph, cluster: Cluster, plan: dict, job: Job) -> dict:
    """Our cost model's prediction for a fixed plan, or {'error': why}."""
    try:
        return evaluate(graph, cluster, plan, job)
    except Exception as e:  # the core's refusal (its message names the rule)
        return {"error": str(e).splitlines()[0][:300]}


def tflops(row: Table1Row, global_batch: int, gpus: int, step_s: Optional[float]):
    if not step_s:
        return None
    return megatron_step_flops(row.config(), global_batch) / step_s / gpus / 1e12


def best_plan(graph: Graph, cluster: Cluster, job: Job, gpus: int):
    """(the planner's best plan as a dict, seconds it took) or (None, why)."""
    t0 = time.monotonic()
    try:
        plan = search(graph, cluster, job, devices=gpus, top_k=1).plans[0].to_dict()
        return plan, time.monotonic() - t0
    except InfeasibleError as e:
        return None, str(e).splitlines()[0][:300]


def describe(plan: Optional[dict]) -> dict:
    """The layout of a plan as the tables show it."""
    if plan is None:
        return {}
    recs = {str(a.get("recompute", False)) for a in plan["assignment"]}
    rec = ("none" if recs == {"False"} else "full" if recs <= {"True", "full"}
           else "selective" if recs == {"selective"} else "mixed")
    return {"tp": plan.get("tp", 1), "pp": plan["mp"] if plan["mode"] == "pipeline" else 1,
            "mp": plan["mp"], "dp": plan["dp"], "mode": plan["mode"],
            "schedule": plan.get("schedule", "none"), "microbatches": plan["num_microbatches"],
            "micro_batch": plan["per_replica_batch"] // max(1, plan["num_microbatches"]),
            "recompute": rec, "sharding": plan.get("sharding", "none")}


# ---- the studies --------------------------------------------------------------------------------

def table1(rows, variant: Variant) -> list:
    out = []
    for row in rows:
        g = graph_for(row, variant.gemm_scale)
        cluster = cluster_for(row.gpus, variant.link_scale)
        job = job_for(row.batch)
        mine = megatron_plan(g, cluster, row.t, row.p, row.d, row.batch)
        pred = price(g, cluster, mine, job)
        best, info = best_plan(g, cluster, job, row.gpus)
        entry = {"row": row.label, "gpus": row.gpus, "batch": row.batch,
                 "megatron": {"t": row.t, "p": row.p, "d": row.d, "tflops": row.tflops},
                 "megatron_predicted": {k: pred.get(k) for k in
                                        ("step_s", "compute_s", "allreduce_s", "bubble_s",
                                         "tp_comm_s", "memory_bytes", "feasible", "error")
                                        if k in pred},
                 "megatron_predicted_tflops": tflops(row, row.batch, row.gpus,
                                                     pred.get("step_s")),
                 "planner": describe(best)}
        if best is None:
            entry["planner"]["infeasible"] = info
        else:
            entry["planner"].update(step_s=best["predicted"]["step_s"], search_s=info,
                                    tflops=tflops(row, row.batch, row.gpus,
                                                  best["predicted"]["step_s"]),
                                    memory_gib=max(best["predicted"]["memory_bytes"]) / 2**30)
        out.append(entry)
        print(f"  {variant.name:22s} {row.label:>8s} on {row.gpus:4d}: Megatron {row.tflops:5.0f}"
              f" measured, {_num(entry['megatron_predicted_tflops'])} predicted; planner "
              f"{_layout(entry['planner'])} {_num(entry['planner'].get('tflops'))}", flush=True)
    return out


def figure13() -> list:
    row = FIG13_MODEL
    g = graph_for(row)
    cluster = cluster_for(row.gpus)
    out = []
    for batch in FIG13_BATCHES:
        job = job_for(batch)
        for p, t in FIG13_LAYOUTS:
            entry = {"batch": batch, "p": p, "t": t}
            if t > cluster.devices_per_node:
                entry["not_representable"] = (f"t = {t} spans {t // NODE} nodes; a plan's TP "
                                              f"group is on one node (docs/tensor_parallel.md)")
            else:
                pred = price(g, cluster, megatron_plan(g, cluster, t, p, 1, batch), job)
                entry["error"] = pred.get("error")
                entry["tflops"] = tflops(row, batch, row.gpus, pred.get("step_s"))
                entry["feasible"] = pred.get("feasible")
                entry["memory_gib"] = (max(pred["memory_bytes"]) / 2**30
                                       if "memory_bytes" in pred else None)
            out.append(entry)
        best, info = best_plan(g, cluster, job, row.gpus)
        out.append({"batch": batch, "planner": describe(best),
                    "tflops": None if best is None else
                    tflops(row, batch, row.gpus, best["predicted"]["step_s"]),
                    "infeasible": None if best is not None else info})
    return out


def figure10() -> list:
    out = []
    for scheme, row, (t, p), batch, gpus, micro, measured in TABLE2:
        g = graph_for(row)
        cluster = cluster_for(gpus)
        job = job_for(batch)
        if scheme == "ZeRO-3":
            plan = megatron_plan(g, cluster, 1, 1, gpus, batch, sharding="zero3")
        else:
            plan = megatron_plan(g, cluster, t, p, gpus // (t * p), batch, micro=micro)
        pred = price(g, cluster, plan, job)
        out.append({"scheme": scheme, "model": row.label, "gpus": gpus, "batch": batch,
                    "micro_batch": micro, "measured": measured, "error": pred.get("error"),
                    "feasible": pred.get("feasible"),
                    "tflops": tflops(row, batch, gpus, pred.get("step_s"))})
    return out


# ---- output -----------------------------------------------------------------------------------

def _num(x, spec: str = "5.0f") -> str:
    return "    -" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _layout(p: dict) -> str:
    if not p or "tp" not in p:
        return "none fits"
    text = f"t{p['tp']} p{p['pp']} d{p['dp']}"
    if p["mode"] == "pipeline":
        text += f" {p['schedule']} M={p['microbatches']} b={p['micro_batch']}"
    else:
        text += f" b={p['micro_batch']}"
    if p["recompute"] != "none":
        text += f" rc={p['recompute']}"
    if p["sharding"] != "none":
        text += f" {p['sharding']}"
    return text


def write_markdown(out: Path, results: dict) -> None:
    L = ["# Megatron-LM (Narayanan et al. 2021) reproduced by hybridplan's planner", "",
         "Generated by `make megatron` (reproductions/megatron2021/reproduce.py). TFLOP/s per "
         "GPU: the paper's eq. (3) over the (measured or predicted) step time. "
         "Megatron's plan: their (t, p, d), 1F1B, micro-batch 1, full recompute, priced by our "
         "cost model. Planner: its own choice at the same global batch on the same GPUs.", ""]
    L += ["## Table 1 (weak scaling)", "",
          "| model | GPUs | batch | Megatron (t, p, d) | measured | Megatron's plan predicted | "
          "planner's choice | planner predicted | planner search s |",
          "|---|---|---|---|---|---|---|---|---|"]
    for e in results["table1"]["as modelled"]:
        m, pl = e["megatron"], e["planner"]
        pred = _num(e["megatron_predicted_tflops"])
        if e["megatron_predicted"].get("error"):
            pred = "not priced: " + e["megatron_predicted"]["error"]
        elif e["megatron_predicted"].get("feasible") is False:
            gib = max(e["megatron_predicted"]["memory_bytes"]) / 2**30
            why = ("the per-replica batch at once: no gradient accumulation without a pipeline"
                   if m["p"] == 1 else f"{e['batch'] // m['d']} micro-batches, a receive "
                   "buffer each way per micro-batch (torch's PipelineStage)")
            pred += f" (over memory: {gib:.0f} GiB; {why})"
        L.append(f"| {e['row']} | {e['gpus']} | {e['batch']} | ({m['t']}, {m['p']}, {m['d']}) | "
                 f"{m['tflops']:.0f} | {pred} | {_layout(pl) if 'tp' in pl else pl.get('infeasible', '-')} | "
                 f"{_num(pl.get('tflops'))} | {_num(pl.get('search_s'), '.2f')} |")
    ratios = sorted(e["megatron_predicted_tflops"] / e["megatron"]["tflops"]
                    for e in results["table1"]["as modelled"] if e["megatron_predicted_tflops"])
    if ratios:
        L += ["", f"Megatron's plan, predicted over measured: {ratios[0]:.2f} .. "
                  f"{ratios[-1]:.2f}, median {ratios[len(ratios) // 2]:.2f} "
                  f"({len(ratios)} rows)."]
    L += ["", "## Figure 13: 162.2B on 64 GPUs, (pipeline, tensor) sweep, data-parallel 1", "",
          "| batch | (p, t) | predicted TFLOP/s per GPU | peak memory GiB | note |",
          "|---|---|---|---|---|"]
    for e in results["fig13"]:
        if "planner" in e:
            L.append(f"| {e['batch']} | planner: {_layout(e['planner'])} | {_num(e['tflops'])} | "
                     f"- | {e.get('infeasible') or ''} |")
        else:
            note = e.get("not_representable") or e.get("error") or (
                "over memory" if e.get("feasible") is False else "")
            L.append(f"| {e['batch']} | ({e['p']}, {e['t']}) | {_num(e.get('tflops'))} | "
                     f"{_num(e.get('memory_gib'), '.1f')} | {note} |")
    L += ["", "## Figure 10 / Table 2: ZeRO-3 without model parallelism vs PTD-P", "",
          "| scheme | model | GPUs | batch | micro-batch | measured | predicted | note |",
          "|---|---|---|---|---|---|---|---|"]
    for e in results["fig10"]:
        note = e.get("error") or ("over memory" if e.get("feasible") is False else "")
        L.append(f"| {e['scheme']} | {e['model']} | {e['gpus']} | {e['batch']} | "
                 f"{e['micro_batch']} | {e['measured']} | {_num(e['tflops'])} | {note} |")
    if len(results["table1"]) > 1:
        names = list(results["table1"])
        L += ["", "## Sensitivity (Table 1 rows): predicted TFLOP/s per GPU of Megatron's plan "
              "/ of the planner's choice", "",
              "| model | measured | " + " | ".join(names) + " |",
              "|---|---|" + "---|" * len(names)]
        for i, e in enumerate(results["table1"][names[0]]):
            cells = []
            for n in names:
                v = results["table1"][n][i]
                cells.append(f"{_num(v['megatron_predicted_tflops'], '.0f')} / "
                             f"{_num(v['planner'].get('tflops'), '.0f')} "
                             f"({_layout(v['planner'])})")
            L.append(f"| {e['row']} | {e['megatron']['tflops']:.0f} | " + " | ".join(cells) + " |")
    (out / "results.md").write_text("\n".join(L) + "\n")


def write_figures(out: Path, results: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["table1"]["as modelled"]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot(x, [e["megatron"]["tflops"] for e in rows], "ko-", label="Megatron-LM, measured")
    ax.plot(x, [e["megatron_predicted_tflops"] or math.nan for e in rows], "s--",
            label="Megatron's (t, p, d), predicted by hybridplan")
    ax.plot(x, [e["planner"].get("tflops") or math.nan for e in rows], "^:",
            label="planner's own choice, predicted")
    ax.set_xticks(list(x), [e["row"] for e in rows], rotation=30)
    ax.set_ylabel("TFLOP/s per GPU (eq. 3)")
    ax.set_ylim(bottom=0)
    ax.axhline(312, color="gray", lw=0.5)
    ax.set_title("Table 1: weak scaling, 32..3072 A100s")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "table1.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for k, batch in enumerate(FIG13_BATCHES):
        pts = [e for e in results["fig13"] if e["batch"] == batch and "p" in e]
        ax.bar([i + 0.4 * k for i in range(len(pts))],
               [e.get("tflops") or 0 for e in pts], width=0.4, label=f"batch {batch}")
    ax.set_xticks([i + 0.2 for i in range(len(FIG13_LAYOUTS))],
                  [f"({p}, {t})" for p, t in FIG13_LAYOUTS])
    ax.set_xlabel("(pipeline, tensor); t > 8 spans nodes: not representable (0)")
    ax.set_ylabel("predicted TFLOP/s per GPU")
    ax.set_title("Figure 13: 162.2B on 64 GPUs")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "fig13.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for scheme, model, style in (("ZeRO-3", "174.6B", "o:"), ("PTD-P", "174.6B", "s:"),
                                 ("ZeRO-3", "529.6B", "o-"), ("PTD-P", "529.6B", "s-")):
        pts = [e for e in results["fig10"] if e["scheme"] == scheme and e["model"] == model]
        g = [e["gpus"] for e in pts]
        line, = ax.plot(g, [e["measured"] for e in pts], style, label=f"{scheme} {model} measured")
        ax.plot(g, [e["tflops"] or math.nan for e in pts], linestyle=style[1:], alpha=0.5,
                color=line.get_color(), marker="x", label=f"{scheme} {model} predicted")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("TFLOP/s per GPU")
    ax.set_title("Figure 10: ZeRO-3 vs PTD-P")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "fig10.png", dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", choices=[r.label for r in TABLE1],
                        default=[r.label for r in TABLE1])
    parser.add_argument("--no-sensitivity", action="store_true")
    parser.add_argument("--no-figures", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in TABLE1 if r.label in args.rows]
    start = time.monotonic()
    variants = VARIANTS[:1] if args.no_sensitivity else VARIANTS
    results = {"table1": {}, "fig13": [], "fig10": []}
    for v in variants:
        print(f"Table 1, {v.name}:", flush=True)
        results["table1"][v.name] = table1(rows, v)
    print("Figure 13 ...", flush=True)
    results["fig13"] = figure13()
    print("Figure 10 ...", flush=True)
    results["fig10"] = figure10()
    results["seconds"] = time.monotonic() - start
    (args.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    write_markdown(args.out, results)
    if not args.no_figures:
        write_figures(args.out, results)
    print(f"wrote {args.out}/results.md, results.json"
          + ("" if args.no_figures else ", table1.png, fig13.png, fig10.png")
          + f" ({results['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
