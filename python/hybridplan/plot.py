"""Plot a `hybridplan sweep`: end-to-end speedup over one device against the device count, for
data parallelism alone and for the best hybrid DP x MP plan (the scaling figure of Pal et al.,
"Optimizing Multi-GPU Parallelization Strategies for Deep Learning Training", IEEE Micro 2019,
https://arxiv.org/abs/1907.13257).

    python3 -m hybridplan.plot sweep.json --out speedup.png [--title TITLE]

sweep.json is what `hybridplan sweep --json` prints: [{"devices": N, "dp_only": S | null,
"best": S | null}, ...]. Speedup is measured in time to train when the sweep has a convergence
model (time_to_train_s > 0) and in samples/s otherwise, always relative to the 1-device plan
(or the smallest device count where a plan fits).
"""

import argparse
import json
import sys


def _cost(summary):
    """Seconds per unit of progress (lower is better): time to train, else seconds per sample."""
    if summary["time_to_train_s"] > 0:
        return summary["time_to_train_s"]
    return 1.0 / summary["samples_per_s"]


def speedups(points):
    """Returns (base_devices, [(devices, dp_only_speedup | None, best_speedup | None), ...])."""
    base = next((p for p in points if p.get("best")), None)
    if base is None:
        raise ValueError("sweep: no device count has a feasible plan; nothing to plot")
    base_cost = _cost(base["best"])
    rows = []
    for p in points:
        dp = base_cost / _cost(p["dp_only"]) if p.get("dp_only") else None
        best = base_cost / _cost(p["best"]) if p.get("best") else None
        rows.append((p["devices"], dp, best))
    return base["devices"], rows


def plot(points, out_path, title=""):
    """Draws the speedup lines to out_path (PNG)."""
    import matplotlib.pyplot as plt  # optional (the plot extra), as in figure

    fig = figure(points, title)
    fig.savefig(out_path, dpi=120)
    plt.close(fig)


def figure(points, title=""):
    """The speedup figure (a matplotlib Figure) of a sweep."""
    import matplotlib  # optional (the plot extra): imported where a figure is drawn

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    base_devices, rows = speedups(points)
    fig, ax = plt.subplots(figsize=(6, 4))
    for column, label, marker in ((1, "data parallel only", "o"), (2, "best hybrid DP x MP", "s")):
        xs = [r[0] for r in rows if r[column] is not None]
        ys = [r[column] for r in rows if r[column] is not None]
        ax.plot(xs, ys, marker=marker, label=label)
    ns = [r[0] for r in rows]
    ax.plot(ns, [n / base_devices for n in ns], linestyle="--", color="gray", label="linear")
    # Scaling figures are read on log-log axes: linear speedup is a straight diagonal there,
    # and it bends upward on a log x-axis with a linear y-axis.
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xticks([r[0] for r in rows])
    ax.set_xticklabels([str(r[0]) for r in rows])
    ax.set_xlabel("devices")
    ax.set_ylabel(f"end-to-end speedup over {base_devices} device{'s' if base_devices > 1 else ''}")
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m hybridplan.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep", help="JSON from `hybridplan sweep --json`")
    parser.add_argument("--out", required=True, help="PNG to write")
    parser.add_argument("--title", default="")
    args = parser.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        print(f"hybridplan.plot: matplotlib is not installed ({e}); pip install matplotlib", file=sys.stderr)
        return 2
    try:
        with open(args.sweep) as f:
            points = json.load(f)
        plot(points, args.out, args.title)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"hybridplan.plot: {args.sweep}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
