"""Reproduces the scaling study of Pal et al., "Optimizing Multi-GPU Parallelization Strategies for
Deep Learning Training", IEEE Micro 2019 (https://arxiv.org/abs/1907.13257), with our planner.

For Inception-V3, GNMT and BigLSTM on N = 8, 16, ..., 1024 V100s (DGX-1 nodes: the dgx1-v100
preset with num_nodes = N / 8) it searches three plans per N, each choosing its per-replica batch
from the job's candidates (so DP alone is compared at its own best batch, not at a fixed one):
  dp         the best pure data-parallel plan (dp = N, mp = 1);
  placement  the best hybrid whose MP is the paper's (each node on one device of the replica);
  hybrid     the best plan overall (placement or pipeline MP, any dp x mp);
and writes to out/paper/:
  results.csv, results.md    one row per (model, N): both plans, epochs, step and time-to-train
  sensitivity.md             the gains again under other modelling choices (VARIANTS below): the
                             ring, the small-batch efficiency, the convergence inputs, the batch
  speedup.png                end-to-end speedup over one device vs N, DP alone and best hybrid
                             (one device at its best batch among the job's: see baseline())
  <model>.best_plan.json     the best hybrid plan found at any N
and prints, per model, the gain of the best hybrid over the best that DP alone reaches at any N
next to the paper's projection. See reproductions/pal2019/README.md for inputs, sources and caveats.

    python3 reproductions/pal2019/reproduce.py [--max-devices 1024] [--models inception_v3 gnmt biglstm]
                                     [--no-sensitivity]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
import time
from pathlib import Path
from typing import Callable, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "python"))  # run from a checkout without PYTHONPATH too
sys.path.insert(0, str(HERE))

from tqdm import tqdm  # noqa: E402

import biglstm_graph  # noqa: E402
from hybridplan import pipedream  # noqa: E402
from hybridplan.planner import (SCHEDULES, SHARDINGS, Cluster, Graph, InfeasibleError,  # noqa: E402
                                Job, search)

NODE_SIZE = 8  # V100s per DGX-1
# kind -> (search modes, dp_only)
KINDS = {"dp": (("placement",), True), "placement": (("placement",), False),
         "hybrid": (("placement", "pipeline"), False)}


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    title: str
    graph: Callable[[], Graph]
    paper_gain: float                        # the paper's projected end-to-end gain (lower bound)
    reference_batch: int                     # the per-replica batch the old fixed-batch runs used
    device_memory_bytes: Optional[int] = None  # override of the preset's 16 GB (see README)


def _pipedream(model: str, batch_size: int) -> Callable[[], Graph]:
    return lambda: pipedream.load(model, batch_size=batch_size)


MODELS = [
    Model("inception_v3", "Inception-V3", _pipedream("inception_v3", 64), 0.265, 64),
    Model("gnmt", "GNMT-8", _pipedream("gnmt", 64), 0.08, 64),
    # Dense gradients + AdaGrad state put BigLSTM at ~21 GB per replica (README): the 32 GB
    # V100 (sold in DGX-1 from 2018) is used so that DP alone has a baseline at all.
    Model("biglstm", "BigLSTM", lambda: Graph.from_dict(biglstm_graph.build_graph(), "biglstm"),
          0.22, 128, device_memory_bytes=32 * 2**30),
]


@dataclasses.dataclass(frozen=True)
class Variant:
    """One modelling choice changed from the defaults: edits of the cluster and job dicts, and
    the data-parallel shardings and pipeline schedules every plan (DP alone and hybrids alike)
    may take."""
    name: str
    what: str
    edit: Callable[[dict, dict, Model], None] = lambda cluster, job, model: None
    shardings: tuple = SHARDINGS
    schedules: tuple = SCHEDULES


# What the planner searched when this reproduction was first run: DP replicas held their whole
# state (no ZeRO or hybrid sharding) and pipelines ran GPipe or 1F1B only.
UNSHARDED = ("none",)
FIRST_SCHEDULES = ("gpipe", "1f1b")


def _scale_convergence(factor: float) -> Callable[[dict, dict, Model], None]:
    """Critical batch (or the table's batch axis) times `factor`: how sensitive the gains are to
    the statistical-efficiency inputs, which are estimates for GNMT and BigLSTM."""
    def edit(cluster: dict, job: dict, model: Model) -> None:
        conv = job["convergence"]
        if conv["model"] == "critical_batch":
            conv["critical_batch"] *= factor
        else:
            conv["points"] = [[b * factor, e] for b, e in conv["points"]]
    return edit


def _fixed_batch(cluster: dict, job: dict, model: Model) -> None:
    job["per_replica_batch"] = model.reference_batch


def _old_model(cluster: dict, job: dict, model: Model) -> None:
    """What the first round assumed: rings in device order, node times linear in the batch, a
    fixed per-replica batch, and at most 8 micro-batches (to hold linear scaling in check)."""
    cluster["collectives"] = {"library": "gloo"}
    cluster["device"]["call_floor_s"] = 0
    _fixed_batch(cluster, job, model)
    job["num_microbatches"] = [1, 2, 4, 8]


VARIANTS = [
    Variant("as modelled", "NCCL best rings; per-call floor 20 us; batch chosen per plan; "
            "convergence as in the jobs"),
    Variant("rings in device order", "each DP group's ring in device-index order (what the first "
            "round assumed; Gloo's rank order)",
            lambda c, j, m: c.update(collectives={"library": "gloo"})),
    Variant("linear micro-batches", "no per-call floor: a node's time linear in the batch",
            lambda c, j, m: c["device"].update(call_floor_s=0)),
    Variant("call floor 50 us", "a per-call floor of 50 us instead of 20 us",
            lambda c, j, m: c["device"].update(call_floor_s=5e-5)),
    Variant("call floor 100 us", "a per-call floor of 100 us (a V100 reaching half its FP32 rate "
            "only at 1.6 GFLOP per call)", lambda c, j, m: c["device"].update(call_floor_s=1e-4)),
    Variant("critical batch / 2", "convergence: critical batch (table: batch axis) halved",
            _scale_convergence(0.5)),
    Variant("critical batch x 2", "convergence: critical batch (table: batch axis) doubled",
            _scale_convergence(2.0)),
    Variant("batch fixed", "per-replica batch fixed at the profiled one (64; BigLSTM 128) for DP "
            "and hybrids alike", _fixed_batch),
    Variant("no sharding", "every replica holds its whole state (DDP's all-reduce, the paper's "
            "DP): no ZeRO-2/3 or hybrid sharding, for DP alone and hybrids alike",
            shardings=UNSHARDED),
    Variant("GPipe and 1F1B only", "pipelines without the interleaved and zero-bubble schedules",
            schedules=FIRST_SCHEDULES),
    Variant("no sharding, GPipe and 1F1B only", "the two rows above together: the search space "
            "this reproduction first ran in", shardings=UNSHARDED, schedules=FIRST_SCHEDULES),
    Variant("first-round model", "device-order rings, linear times, fixed batch, <= 8 "
            "micro-batches, no sharding, GPipe and 1F1B only, together", _old_model,
            shardings=UNSHARDED, schedules=FIRST_SCHEDULES),
]


@dataclasses.dataclass
class Row:
    model: str
    devices: int
    kind: str          # one of KINDS
    plan: Optional[object]
    infeasible: str = ""

    def field(self, key: str):
        if self.plan is None:
            return None
        if key in ("dp", "mp", "mode", "global_batch", "num_microbatches", "schedule",
                   "sharding", "dp_shard", "per_replica_batch"):
            return getattr(self.plan, key)
        return self.plan.predicted[key]


def cluster_for(base: Cluster, devices: int) -> Cluster:
    return base.with_num_nodes(max(1, devices // NODE_SIZE))


def best_plan(graph: Graph, cluster: Cluster, job: Job, devices: int, kind: str,
              variant: Variant):
    modes, dp_only = KINDS[kind]
    try:
        return search(graph, cluster, job, devices=devices, top_k=1, modes=modes,
                      dp_only=dp_only, shardings=variant.shardings,
                      schedules=variant.schedules).plans[0], ""
    except InfeasibleError as e:
        return None, str(e)


def cluster_and_job(model: Model, variant: Variant, batch_candidates: bool = False) -> tuple:
    """The dgx1-v100 preset (32 GB V100s where the model says so) and the model's job, with the
    variant's edits; with `batch_candidates` the job keeps its own per-replica batch candidates
    whatever the variant fixes (the one-device baseline's job: see baseline())."""
    d = Cluster.preset("dgx1-v100").to_dict()
    if model.device_memory_bytes is not None:
        d["device"]["memory_bytes"] = model.device_memory_bytes
        d["device"]["name"] = "V100-SXM2-32GB"
        d["name"] = "dgx1-v100-32gb"
    job = Job.load(HERE / f"{model.name}.job.json").to_dict()
    candidates = job["per_replica_batch"]
    variant.edit(d, job, model)
    if batch_candidates:
        job["per_replica_batch"] = candidates
    return (Cluster.from_dict(d, f"dgx1-v100 ({variant.name})"),
            Job.from_dict(job, f"{model.name}.job.json ({variant.name})"))


def baseline(model: Model, graph: Graph, variant: Variant):
    """The one-device plan every speedup is over: one V100 of the same cluster training at the
    per-replica batch, among the job's candidates, that gives it the shortest time to train
    (in all three models the largest candidate that fits its memory), under the variant's cost
    and convergence model.

    Why not the paper's own baseline: Pal et al. report speedups over one GPU running the
    per-GPU batch their plans use (64 for Inception-V3); in our memory model, which counts the
    backward workspace (a node's output and input gradients alive together), Inception-V3 at
    batch 64 needs 17.2 GiB and does not fit a 16 GB V100, so that baseline does not exist
    here. The batch stays chosen from the job's candidates even where a variant fixes the
    batch of the compared plans ("batch fixed"): the baseline is a normaliser, one per model
    and cost model, and the gains this script reports (hybrid over DP alone) are ratios of
    two plans' times to train that do not depend on it."""
    cluster, job = cluster_and_job(model, variant, batch_candidates=True)
    single, why = best_plan(graph, cluster_for(cluster, 1), job, 1, "dp", variant)
    if single is None:
        raise SystemExit(f"{model.name}: no one-device plan at any of the job's batches, so no "
                         f"speedup baseline: {why}")
    return single


def run_model(model: Model, graph: Graph, variant: Variant, device_counts: list, kinds,
              progress) -> tuple:
    """(the one-device baseline plan, rows) for one model under one variant."""
    base, job = cluster_and_job(model, variant)
    single = baseline(model, graph, variant)
    rows = []
    for n in device_counts:
        cluster = cluster_for(base, n)
        for kind in kinds:
            progress.set_postfix_str(f"{model.name} N={n} {kind}")
            plan, why = best_plan(graph, cluster, job, n, kind, variant)
            rows.append(Row(model.name, n, kind, plan, why))
            progress.update(1)
    return single, rows


def speedup(t1_s: float, row: Row) -> Optional[float]:
    return None if row.plan is None else t1_s / row.field("time_to_train_s")


def _fmt(value, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def _layout(r: Row) -> str:
    """"dp x mp mode", then the pipeline schedule and the data-parallel sharding where any."""
    if r.plan is None:
        return "-"
    text = f"{r.field('dp')} x {r.field('mp')} {r.field('mode')}"
    if r.field("mode") == "pipeline":
        text += f" {r.field('schedule')}"
    if r.field("sharding") != "none":
        text += f" {r.field('sharding')}"
        if r.field("dp_shard") != r.field("dp"):
            text += f" (shard groups of {r.field('dp_shard')})"
    return text


def _gain(t1: float, baseline: Row, r: Row) -> Optional[float]:
    s_base, s = speedup(t1, baseline), speedup(t1, r)
    return None if s_base is None or s is None else s / s_base - 1


def write_tables(out: Path, results: dict, baselines: dict) -> None:
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "devices", "kind", "dp", "mp", "mode", "schedule", "sharding",
                    "dp_shard", "num_microbatches", "per_replica_batch", "global_batch", "epochs",
                    "step_s", "time_to_train_s", "speedup_over_1_device", "infeasible"])
        for name, (t1, rows) in results.items():
            for r in rows:
                w.writerow([name, r.devices, r.kind, r.field("dp"), r.field("mp"), r.field("mode"),
                            r.field("schedule"), r.field("sharding"), r.field("dp_shard"),
                            r.field("num_microbatches"), r.field("per_replica_batch"),
                            r.field("global_batch"),
                            r.field("epochs"), r.field("step_s"), r.field("time_to_train_s"),
                            speedup(t1, r), r.infeasible])
    lines = ["# DP alone vs hybrid DP x MP (hybridplan's planner, dgx1-v100 nodes)", "",
             "B: global batch; step in ms; speedup: time-to-train over one device; gain: over DP "
             "alone at the same N. placement: the paper's kind of MP only; best: placement or "
             "pipeline.", ""]
    for name, (t1, rows) in results.items():
        lines += [f"## {name}", "", f"one device (the speedup baseline): {t1 / 3600:.1f} h to "
                  f"train at batch {baselines[name].per_replica_batch}", "",
                  "| N | DP: B | DP: epochs | DP: step | DP: speedup | placement: layout | "
                  "placement: speedup | placement: gain | best: layout | best: B | best: epochs | "
                  "best: step | best: speedup | best: gain |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        by_n = {}
        for r in rows:
            by_n.setdefault(r.devices, {})[r.kind] = r
        for n, k in sorted(by_n.items()):
            dp, pl, hy = k["dp"], k["placement"], k["hybrid"]
            step = lambda r: None if r.plan is None else r.field("step_s") * 1e3  # noqa: E731
            pct = lambda g: "-" if g is None else f"{100 * g:+.1f} %"  # noqa: E731
            lines.append(
                f"| {n} | {_fmt(dp.field('global_batch'))} | {_fmt(dp.field('epochs'), '.1f')} | "
                f"{_fmt(step(dp), '.1f')} | {_fmt(speedup(t1, dp), '.1f')} | {_layout(pl)} | "
                f"{_fmt(speedup(t1, pl), '.1f')} | {pct(_gain(t1, dp, pl))} | {_layout(hy)} | "
                f"{_fmt(hy.field('global_batch'))} | {_fmt(hy.field('epochs'), '.1f')} | "
                f"{_fmt(step(hy), '.1f')} | {_fmt(speedup(t1, hy), '.1f')} | "
                f"{pct(_gain(t1, dp, hy))} |")
        lines.append("")
    (out / "results.md").write_text("\n".join(lines))


def write_figure(out: Path, results: dict, titles: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, (name, (t1, rows)) in zip(axes[0], results.items()):
        for kind, label, style in (("dp", "DP alone", "o--"),
                                   ("placement", "hybrid, placement MP (paper's)", "^:"),
                                   ("hybrid", "best hybrid (placement or pipeline)", "s-")):
            pts = [(r.devices, speedup(t1, r)) for r in rows if r.kind == kind and r.plan]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
        ax.set_xscale("log", base=2)  # log-log, as scaling figures are read
        ax.set_yscale("log", base=2)
        ax.set_title(titles[name])
        ax.set_xlabel("V100 devices (N)")
        ax.set_ylabel("time-to-train speedup over 1 device")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=120)
    plt.close(fig)


def best_gain(rows: list, kind: str) -> tuple:
    """(gain of the best `kind` plan over the best DP alone, each at its own N, that row)."""
    def best(k):
        feasible = [r for r in rows if r.kind == k and r.plan is not None]
        return min(feasible, key=lambda r: r.field("time_to_train_s"), default=None)
    dp, other = best("dp"), best(kind)
    if dp is None or other is None:
        return None, other
    return dp.field("time_to_train_s") / other.field("time_to_train_s") - 1, other


def write_sensitivity(out: Path, table: dict, models: list, device_counts: list) -> str:
    """sensitivity.md: per variant, each model's gain of the best hybrid (and of placement MP)
    over the best DP alone; returns the markdown."""
    head = "| variant | what changes | " + " | ".join(
        f"{m.title} (paper >= {100 * m.paper_gain:.1f} %)" for m in models) + " |"
    lines = ["# Sensitivity of the hybrid-over-DP gains to the modelling choices", "",
             "Each cell: gain of the best hybrid (placement or pipeline) over the best DP alone, "
             f"each at its own N in {device_counts[0]}..{device_counts[-1]}, then the plan; "
             "`placement` is the paper's kind of MP alone; `no DP fits`: DP alone has no plan "
             "that fits memory at any N. `as modelled` is the default; every other row changes "
             "one input (the rows that say so several at once).", "", head,
             "|---|---|" + "---|" * len(models)]
    for variant in VARIANTS:
        if variant.name not in table:
            continue
        cells = []
        for m in models:
            entry = table[variant.name].get(m.name)
            if entry is None:
                cells.append("-")
                continue
            (gain, row), (pl_gain, pl_row) = entry

            def pct(g, r):
                if g is not None:
                    return f"{100 * g:+.1f} %"
                return "no hybrid fits" if r is None else "no DP fits"
            where = "" if row is None else (f" ({_layout(row)}, b={row.plan.per_replica_batch}, "
                                            f"N={row.devices})")
            cells.append(f"{pct(gain, row)}{where}; placement {pct(pl_gain, pl_row)}")
        lines.append(f"| {variant.name} | {variant.what} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    (out / "sensitivity.md").write_text(text)
    return text


def summarize(model: Model, t1: float, rows: list, out: Path) -> str:
    """Gains over the best DP alone reaches at any N: of the best placement-MP hybrid (the
    paper's kind of MP) and of the best hybrid overall, each at its own best N."""
    def best(kind):
        feasible = [r for r in rows if r.kind == kind and r.plan is not None]
        return min(feasible, key=lambda r: r.field("time_to_train_s"), default=None)

    dp, pl, hy = best("dp"), best("placement"), best("hybrid")
    if hy is not None:
        hy.plan.save(out / f"{model.name}.best_plan.json")
    if dp is None:
        return f"{model.title:13s} no feasible DP plan on any N"

    def part(label, r):
        if r is None:
            return f"{label}: none fits"
        gain = dp.field("time_to_train_s") / r.field("time_to_train_s") - 1
        return (f"{label} {speedup(t1, r):6.1f}x at N={r.devices:<4d} ({_layout(r)}) "
                f"gain {100 * gain:+6.1f} %")

    return (f"{model.title}: paper >= {100 * model.paper_gain:.1f} %\n"
            f"    DP alone  {speedup(t1, dp):6.1f}x at N={dp.devices:<4d} ({_layout(dp)})\n"
            f"    {part('placement', pl)}\n    {part('best     ', hy)}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-devices", type=int, default=1024)
    parser.add_argument("--models", nargs="+", choices=[m.name for m in MODELS],
                        default=[m.name for m in MODELS])
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "paper")
    parser.add_argument("--no-sensitivity", action="store_true",
                        help="only the default model (skip sensitivity.md)")
    args = parser.parse_args(argv)

    device_counts = [n for n in (2**k for k in range(3, 11)) if n <= args.max_devices]
    if not device_counts:
        parser.error("--max-devices must be >= 8 (one DGX-1)")
    models = [m for m in MODELS if m.name in args.models]
    missing = [m for m in models if m.name in ("inception_v3", "gnmt")
               and m.name not in pipedream.available()]
    for m in missing:
        print(f"skipping {m.name}: no PipeDream profile in {pipedream.profiles_dir()}. "
              f"{pipedream.WHERE_FROM}")
    models = [m for m in models if m not in missing]
    if not models:
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    variants = VARIANTS[:1] if args.no_sensitivity else VARIANTS
    graphs = {m.name: m.graph() for m in models}

    results, baselines, lines, sensitivity = {}, {}, [], {}
    start = time.monotonic()
    total = len(models) * len(device_counts) * len(KINDS) * len(variants)
    with tqdm(total=total, unit="search") as progress:
        for variant in variants:
            sensitivity[variant.name] = {}
            for model in models:
                single, rows = run_model(model, graphs[model.name], variant, device_counts,
                                         list(KINDS), progress)
                t1 = single.predicted["time_to_train_s"]
                sensitivity[variant.name][model.name] = (best_gain(rows, "hybrid"),
                                                         best_gain(rows, "placement"))
                if variant is VARIANTS[0]:
                    results[model.name] = (t1, rows)
                    baselines[model.name] = single
                    lines.append(summarize(model, t1, rows, args.out))
    write_tables(args.out, results, baselines)
    write_figure(args.out, results, {m.name: m.title for m in models})
    print(f"\nhybrid over the best DP alone reaches, N = {device_counts[0]} .. {device_counts[-1]} "
          f"({time.monotonic() - start:.0f} s):")
    print("\n".join(lines))
    if len(variants) > 1:
        print("\n" + write_sensitivity(args.out, sensitivity, models, device_counts))
    print(f"\nwrote {args.out}/results.md, results.csv, speedup.png, <model>.best_plan.json"
          + (", sensitivity.md" if len(variants) > 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
