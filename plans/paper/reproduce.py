"""Reproduces the scaling study of Pal et al., "Optimizing Multi-GPU Parallelization Strategies for
Deep Learning Training", IEEE Micro 2019 (https://arxiv.org/abs/1907.13257), with our planner.

For Inception-V3, GNMT and BigLSTM on N = 8, 16, ..., 1024 V100s (DGX-1 nodes: the dgx1-v100
preset with num_nodes = N / 8) it searches three plans per N:
  dp         the best pure data-parallel plan (dp = N, mp = 1);
  placement  the best hybrid whose MP is the paper's (each node on one device of the replica);
  hybrid     the best plan overall (placement or pipeline MP, any dp x mp);
and writes to out/paper/:
  results.csv, results.md    one row per (model, N): both plans, epochs, step and time-to-train
  speedup.png                end-to-end speedup over one device vs N, DP alone and best hybrid
  <model>.best_plan.json     the best hybrid plan found at any N
and prints, per model, the gain of the best hybrid over the best that DP alone reaches at any N
next to the paper's projection. See plans/paper/README.md for inputs, sources and caveats.

    python3 plans/paper/reproduce.py [--max-devices 1024] [--models inception_v3 gnmt biglstm]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
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
from hybridplan.planner import Cluster, Graph, InfeasibleError, Job, search  # noqa: E402

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
    device_memory_bytes: Optional[int] = None  # override of the preset's 16 GB (see README)


def _pipedream(model: str, batch_size: int) -> Callable[[], Graph]:
    return lambda: pipedream.load(model, batch_size=batch_size)


MODELS = [
    Model("inception_v3", "Inception-V3", _pipedream("inception_v3", 64), 0.265),
    Model("gnmt", "GNMT-8", _pipedream("gnmt", 64), 0.08),
    # Dense gradients + AdaGrad state put BigLSTM at ~21 GB per replica (README): the 32 GB
    # V100 (sold in DGX-1 from 2018) is used so that DP alone has a baseline at all.
    Model("biglstm", "BigLSTM", lambda: Graph.from_dict(biglstm_graph.build_graph(), "biglstm"),
          0.22, device_memory_bytes=32 * 2**30),
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
        if key in ("dp", "mp", "mode", "global_batch", "num_microbatches", "schedule"):
            return getattr(self.plan, key)
        return self.plan.predicted[key]


def cluster_for(base: Cluster, devices: int) -> Cluster:
    return base.with_num_nodes(max(1, devices // NODE_SIZE))


def best_plan(graph: Graph, cluster: Cluster, job: Job, devices: int, kind: str):
    modes, dp_only = KINDS[kind]
    try:
        return search(graph, cluster, job, devices=devices, top_k=1, modes=modes,
                      dp_only=dp_only).plans[0], ""
    except InfeasibleError as e:
        return None, str(e)


def base_cluster(model: Model) -> Cluster:
    base = Cluster.preset("dgx1-v100")
    if model.device_memory_bytes is None:
        return base
    d = base.to_dict()
    d["device"]["memory_bytes"] = model.device_memory_bytes
    d["device"]["name"] = "V100-SXM2-32GB"
    d["name"] = "dgx1-v100-32gb"
    return Cluster.from_dict(d, "dgx1-v100 with 32 GB V100s")


def run_model(model: Model, device_counts: list, progress) -> tuple:
    """(one-device time-to-train, rows) for one model."""
    graph = model.graph()
    job = Job.load(HERE / f"{model.name}.job.json")
    base = base_cluster(model)
    single, why = best_plan(graph, cluster_for(base, 1), job, 1, "dp")
    if single is None:
        raise SystemExit(f"{model.name}: no one-device plan, so no speedup baseline: {why}")
    rows = []
    for n in device_counts:
        cluster = cluster_for(base, n)
        for kind in KINDS:
            progress.set_postfix_str(f"{model.name} N={n} {kind}")
            plan, why = best_plan(graph, cluster, job, n, kind)
            rows.append(Row(model.name, n, kind, plan, why))
            progress.update(1)
    return single.predicted["time_to_train_s"], rows


def speedup(t1_s: float, row: Row) -> Optional[float]:
    return None if row.plan is None else t1_s / row.field("time_to_train_s")


def _fmt(value, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def _layout(r: Row) -> str:
    return "-" if r.plan is None else f"{r.field('dp')} x {r.field('mp')} {r.field('mode')}"


def _gain(t1: float, baseline: Row, r: Row) -> Optional[float]:
    s_base, s = speedup(t1, baseline), speedup(t1, r)
    return None if s_base is None or s is None else s / s_base - 1


def write_tables(out: Path, results: dict) -> None:
    with open(out / "results.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["model", "devices", "kind", "dp", "mp", "mode", "num_microbatches",
                    "global_batch", "epochs", "step_s", "time_to_train_s",
                    "speedup_over_1_device", "infeasible"])
        for name, (t1, rows) in results.items():
            for r in rows:
                w.writerow([name, r.devices, r.kind, r.field("dp"), r.field("mp"), r.field("mode"),
                            r.field("num_microbatches"), r.field("global_batch"),
                            r.field("epochs"), r.field("step_s"), r.field("time_to_train_s"),
                            speedup(t1, r), r.infeasible])
    lines = ["# DP alone vs hybrid DP x MP (hybridplan's planner, dgx1-v100 nodes)", "",
             "B: global batch; step in ms; speedup: time-to-train over one device; gain: over DP "
             "alone at the same N. placement: the paper's kind of MP only; best: placement or "
             "pipeline.", ""]
    for name, (t1, rows) in results.items():
        lines += [f"## {name}", "", f"one device: {t1 / 3600:.1f} h to train", "",
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
    args.out.mkdir(parents=True, exist_ok=True)

    results, lines = {}, []
    start = time.monotonic()
    with tqdm(total=len(KINDS) * len(device_counts) * len(models), unit="search") as progress:
        for model in models:
            t1, rows = run_model(model, device_counts, progress)
            results[model.name] = (t1, rows)
            lines.append(summarize(model, t1, rows, args.out))
    if not results:
        return 1
    write_tables(args.out, results)
    write_figure(args.out, results, {m.name: m.title for m in models})
    print(f"\nhybrid over the best DP alone reaches, N = {device_counts[0]} .. {device_counts[-1]} "
          f"({time.monotonic() - start:.0f} s):")
    print("\n".join(lines))
    print(f"\nwrote {args.out}/results.md, results.csv, speedup.png, <model>.best_plan.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
