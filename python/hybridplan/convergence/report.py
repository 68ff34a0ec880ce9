"""The `convergence` command's report of a measured trade-off (measure_tradeoff's record): a
Markdown table and the log-log figure of steps to target against global batch."""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

__all__ = ["markdown", "plot"]


def _fmt(x: Optional[float], spec: str = ".0f") -> str:
    return "—" if x is None or not math.isfinite(x) else format(x, spec)


def markdown(result: Dict[str, Any]) -> str:
    fit, sweep = result["fit"], result["sweep"]
    crit = fit["critical_batch"]
    lines = [f"# Steps to target against global batch ({sweep['mode']})", "",
             f"target: {sweep['target']}; {sweep['lr_rule']}; seeds "
             f"{sorted({r['seed'] for r in sweep['runs']})}", ""]
    if sweep.get("branch"):
        lines += [f"branched from: {sweep['branch']}", ""]
    lines += ["| global batch | steps (median) | stdev | seeds | epochs | fitted steps | "
              "fit error |", "|---:|---:|---:|---:|---:|---:|---:|"]
    n = result["samples_per_epoch"]
    for (b, s, sd, k), r in zip(fit["points"], fit["residuals"]):
        lines.append(f"| {b} | {s:.0f} | {sd:.1f} | {k} | {b * s / n:.2f} | "
                     f"{fit['s_min'] + fit['e_min'] / b:.0f} | {100 * r:+.1f} % |")
    if fit["unreached"]:
        lines += ["", f"not reached within max_epochs: {fit['unreached']}"]
    lo, hi = fit["critical_batch_68"]
    lines += ["", f"fit S(B) = S_min + E_min / B: S_min = {fit['s_min']:.1f} steps, E_min = "
              f"{fit['e_min']:.0f} samples ({fit['e_min'] / n:.2f} epochs), **B_crit = "
              f"{_fmt(crit)}** (68 %: {_fmt(lo)}–{_fmt(hi)}; 90 %: "
              f"{_fmt(fit['critical_batch_90'][0])}–{_fmt(fit['critical_batch_90'][1])}; "
              f"{fit['resamples']} bootstrap resamples of whole seeds)", "",
              "gradient noise scale B_simple along one run at the smallest batch (McCandlish et "
              "al.: B_crit ~ B_noise, and B_simple = B_noise when the Hessian is a multiple of "
              "the identity):", "", "| progress | B_simple | stderr | B_simple / B_crit |",
              "|---:|---:|---:|---:|"]
    for e in result["noise_scale"]:
        ratio = e["b_simple"] / crit if crit and math.isfinite(e["b_simple"]) else None
        lines.append(f"| {e['progress']:.2f} | {_fmt(e['b_simple'])} | {_fmt(e['stderr'])} | "
                     f"{_fmt(ratio, '.2f')} |")
    return "\n".join(lines) + "\n"


def plot(result: Dict[str, Any], path: str) -> None:
    """Steps to target against global batch, log-log: each seed's run, the median, the fitted
    curve, and B_crit beside the noise scale's B_simple."""
    import matplotlib  # optional (the plot extra): imported where a figure is drawn
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fit, runs = result["fit"], result["sweep"]["runs"]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    reached = [r for r in runs if r["reached"]]
    ax.scatter([r["global_batch"] for r in reached], [r["steps"] for r in reached], s=12,
               color="tab:blue", alpha=0.5, label="one seed")
    ax.plot([p[0] for p in fit["points"]], [p[1] for p in fit["points"]], "o", color="tab:blue",
            label="median over seeds")
    b0, b1 = fit["points"][0][0] / 1.5, fit["points"][-1][0] * 1.5
    xs = [b0 * (b1 / b0) ** (i / 100) for i in range(101)]
    ax.plot(xs, [fit["s_min"] + fit["e_min"] / x for x in xs], "-", color="tab:orange",
            label=f"fit S_min + E_min / B (S_min {fit['s_min']:.0f}, E_min {fit['e_min']:.0f})")
    crit = fit["critical_batch"]
    if crit:
        lo, hi = fit["critical_batch_68"]
        ax.axvline(crit, color="tab:orange", ls="--", label=f"B_crit {crit:.0f}")
        if lo and hi:
            ax.axvspan(lo, hi, color="tab:orange", alpha=0.12)
    for e, ls in zip(result["noise_scale"], (":", "-.", "--")):
        if math.isfinite(e["b_simple"]) and e["b_simple"] > 0:
            ax.axvline(e["b_simple"], color="tab:green", ls=ls,
                       label=f"B_simple at progress {e['progress']:.2f}: {e['b_simple']:.0f}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("global batch B")
    ax.set_ylabel("steps to target")
    ax.set_title(f"{result['sweep']['target']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
