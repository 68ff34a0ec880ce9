"""A schedule of plans over the run as the critical batch grows (hybridplan.plan_over_run).

    python3 examples/plan_over_run.py [--model inception_v3] [--devices 256]
        [--critical-batch 512] [--growth 8] [--segments 16] [--out out/over_run]

PipeDream's Inception-V3 profile (hybridplan.pipedream; batch 64) on DGX-1 V100 nodes with the
paper reproduction's job (reproductions/pal2019/<model>.job.json: data set, per-replica batch range,
optimizer), whose convergence model is replaced by a critical batch that grows log-linearly
from --critical-batch to growth times it over the run, as McCandlish et al. observe the
gradient noise scale grow while the loss falls (https://arxiv.org/abs/1812.06162, section 3).
epochs_min (the epochs of an infinitely small batch) is the plan reproduction's scale: 30 for
Inception-V3, 3 for GNMT; it scales every time alike and moves no decision.

Writes <out>/over_run.png (the critical batch, the schedule's global batch per phase and the
best single plan's; the two times to accuracy), <out>/over_run.md (the phases as a table) and
<out>/schedule.json (what `hybridplan plan --over-run --json` prints).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))

import hybridplan  # noqa: E402
from hybridplan import pipedream, planner  # noqa: E402

EPOCHS_MIN = {"inception_v3": 30.0, "gnmt": 3.0}
NAMES = {"inception_v3": "Inception-V3", "gnmt": "GNMT-8"}


def job_for(model: str, critical_batch: float, growth: float) -> dict:
    """The paper reproduction's job for `model` with a critical batch growing `growth` times,
    log-linearly in progress (the planner's trajectory interpolation, convergence.h)."""
    job = planner.Job.load(REPO / "reproductions" / "pal2019" / f"{model}.job.json").to_dict()
    job["convergence"] = {"model": "critical_batch", "epochs_min": EPOCHS_MIN[model],
                          "critical_batch": [[0, critical_batch], [1, critical_batch * growth]]}
    job.pop("sources", None)
    return job


def build_case(model: str = "inception_v3", devices: int = 256, critical_batch: float = 512,
               growth: float = 8, segments: int = 16):
    """(graph, cluster, job, RunSchedule) of the case."""
    graph = pipedream.load(model, batch_size=pipedream.DEFAULT_BATCH_SIZE)
    per_node = planner.Cluster.preset("dgx1-v100").devices_per_node
    cluster = planner.Cluster.preset("dgx1-v100").with_num_nodes(-(-devices // per_node))
    job = job_for(model, critical_batch, growth)
    schedule = hybridplan.plan_over_run(graph, cluster, job, devices=devices, segments=segments)
    return graph, cluster, job, schedule


def _shape(plan) -> str:
    return f"{plan.dp} x {plan.mp} {plan.mode}"


def markdown(schedule, model: str, devices: int, critical_batch: float, growth: float) -> str:
    lines = [f"{NAMES.get(model, model)} (PipeDream profile) on {devices} V100s (DGX-1), critical "
             f"batch {critical_batch:g} -> {critical_batch * growth:g} over the run; a switch "
             f"costs {schedule.switch_s:.0f} s.", "",
             "| progress | plan (dp x mp) | global batch | epochs | time |",
             "|---|---|---|---|---|"]
    for p in schedule.phases:
        lines.append(f"| {100 * p.progress_start:.0f}-{100 * p.progress_end:.0f} % | "
                     f"{_shape(p.plan)} | {p.plan.global_batch} | {p.epochs:.1f} | "
                     f"{p.time_s / 3600:.2f} h |")
    single = schedule.best_single
    lines += ["", f"Schedule: {schedule.time_s / 3600:.2f} h with {schedule.switches} switch(es); "
                  f"best single plan {_shape(single)}, global batch {single.global_batch}: "
                  f"{schedule.best_single_time_s / 3600:.2f} h; the schedule is "
                  f"{100 * schedule.gain_over_best_single:.1f} % faster."]
    return "\n".join(lines) + "\n"


def figure(schedule, job: dict, out_path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trajectory = job["convergence"]["critical_batch"]
    fig, (ax, bars) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [2.2, 1]})
    (p0, b0), (p1, b1) = trajectory[0], trajectory[-1]
    xs = [p0 + (p1 - p0) * i / 100 for i in range(101)]
    ax.plot(xs, [b0 * (b1 / b0) ** ((x - p0) / (p1 - p0)) for x in xs], color="black",
            label="critical batch (log-linear in progress)")
    for i, p in enumerate(schedule.phases):
        ax.hlines(p.plan.global_batch, p.progress_start, p.progress_end, colors="tab:blue",
                  linewidth=3, label="schedule's global batch" if i == 0 else None)
        ax.annotate(_shape(p.plan), ((p.progress_start + p.progress_end) / 2, p.plan.global_batch),
                    textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8,
                    color="tab:blue")
    ax.hlines(schedule.best_single.global_batch, 0, 1, colors="tab:orange", linestyles="--",
              label=f"best single plan ({_shape(schedule.best_single)})")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("training progress")
    ax.set_ylabel("samples")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    hours = [schedule.time_s / 3600, schedule.best_single_time_s / 3600]
    bars.bar(["schedule", "best single\nplan"], hours, color=["tab:blue", "tab:orange"])
    for x, h in enumerate(hours):
        bars.annotate(f"{h:.2f} h", (x, h), textcoords="offset points", xytext=(0, 3),
                      ha="center", fontsize=8)
    bars.set_ylabel("predicted time to accuracy (h)")
    bars.set_title(f"{100 * schedule.gain_over_best_single:.1f} % faster", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="inception_v3", choices=sorted(EPOCHS_MIN))
    parser.add_argument("--devices", type=int, default=256)
    parser.add_argument("--critical-batch", type=float, default=512)
    parser.add_argument("--growth", type=float, default=8)
    parser.add_argument("--segments", type=int, default=16)
    parser.add_argument("--out", type=Path, default=REPO / "out" / "over_run")
    args = parser.parse_args(argv)
    try:
        _, _, job, schedule = build_case(args.model, args.devices, args.critical_batch,
                                         args.growth, args.segments)
    except FileNotFoundError as e:
        print(f"plan_over_run: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    table = markdown(schedule, args.model, args.devices, args.critical_batch, args.growth)
    (args.out / "over_run.md").write_text(table)
    (args.out / "schedule.json").write_text(json.dumps(schedule.to_dict(), indent=1) + "\n")
    title = (f"{NAMES.get(args.model, args.model)} on {args.devices} V100s: plans as the "
             f"critical batch grows {args.growth:g}x")
    figure(schedule, job, args.out / "over_run.png", title)
    print(table, end="")
    print(f"wrote {args.out / 'over_run.png'}, over_run.md, schedule.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
