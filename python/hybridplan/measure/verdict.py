"""validate's verdict: whether a validation met the cost model's targets, with the plans whose
step time this host could not pin down set apart.

On a shared host some plans' launches disagree: 1F1B at 32 one-sample micro-batches runs in two
clusters of step times whose shares drift, and its launch medians differed by up to 1.6x within
one validation (docs/calibration.md "A step time that is two clusters"). A plan's measured step
is therefore known only as well as its launches agree. For each plan validate takes a bootstrap
90 % interval of the median of its launches' step times; while that interval is wider than
+-5 % of the median it launches the plan again, up to `kMaxLaunches` launches in all. A plan
whose interval is still wider then is *unsteady on this host*.

The verdict holds:
    median |step error| <= 10 %     over every plan
    worst  |step error| <= 25 %     over the steady plans (and those of one launch: no interval)
    worst  |memory error| <= 15 %   over every plan that measured its peak
    an unsteady plan's prediction lies within its interval
    every plan's matrix products ran in its precision (the dtype most of them ran in, recorded
    by the worker: otherwise the measurement is not of the plan predicted)
A steady plan beyond 25 % is the cost model's miss and is named as such; being unsteady excuses
a plan from the worst target only, never from the median.

The comparison it is held on: at launch (launch_matched). Every launch of validate measures the
host's shared-core slowdown as calibrate does, in bursts right before and right after its
timed steps, and the plan is priced again for each launch with the table those bursts give.
Per plan the launches then give ratios measured / predicted at launch; the plan's step error
is 1 / (their median) - 1 (predicted over measured, as everywhere in validate), its interval
the bootstrap 90 % interval of the median ratio (launch_interval), steady when that interval
lies within +-5 % of the median ratio, and an unsteady plan's prediction lies within its
interval when ratio 1 does. decide() takes rows; launch_matched_rows() gives it the at-launch
ones (the calibrated-once comparison, every launch against the one prediction made with the
calibration's table, stays beside it in validate's report). Why: the calibration is measured
minutes before the launches, and this host's speed for two ranks together moves 10-40 %
within an hour, more than a plan's interval from 7 launches is wide.
"""

from __future__ import annotations

import statistics
from typing import List, Optional, Sequence

__all__ = ["launch_interval", "is_steady", "needs_launch", "launch_matched",
           "launch_matched_rows", "decide", "verdict_lines"]

kMaxLaunches = 7              # launches of one plan before it is called unsteady
kStepTolerance = 0.05         # the median step is known when its interval lies within +-5 %
kIntervalConfidence = 0.90
kBootstrapResamples = 9999
kBootstrapSeed = 0            # a fixed seed: the same launches give the same verdict
kMedianTarget = 0.10
kWorstTarget = 0.25
kMemoryTarget = 0.15


def launch_interval(launch_step_s: Sequence[float]) -> Optional[List[float]]:
    """[low, high]: the bootstrap 90 % interval of the median of the launches' step times
    (resampling the launches), or None for fewer than 2 launches (nothing to resample)."""
    if len(launch_step_s) < 2:
        return None
    # scipy is imported here, not at the top: only validate's verdict needs it, and the package
    # imports without it (scikit-learn, which install-deps installs, brings it).
    import numpy as np
    from scipy import stats

    # The percentile method: with 2-7 launches the resampled medians take a handful of values,
    # and the percentile interval stays within the launches; scipy's default BCa returns NaN when
    # every launch has the same step (its acceleration divides by zero) and the basic interval
    # reaches below the fastest launch (30-65 ms for launches of 60-97 ms).
    result = stats.bootstrap((np.asarray(launch_step_s, dtype=float),), np.median,
                             confidence_level=kIntervalConfidence,
                             n_resamples=kBootstrapResamples, method="percentile",
                             rng=np.random.default_rng(kBootstrapSeed))
    return [float(result.confidence_interval.low), float(result.confidence_interval.high)]


def is_steady(launch_step_s: Sequence[float]) -> Optional[bool]:
    """Whether the launches' median step is known within +-kStepTolerance: its bootstrap
    interval lies inside [0.95, 1.05] x the median. None for one launch (no interval)."""
    interval = launch_interval(launch_step_s)
    if interval is None:
        return None
    median = statistics.median(launch_step_s)
    return (interval[0] >= (1 - kStepTolerance) * median
            and interval[1] <= (1 + kStepTolerance) * median)


def needs_launch(launch_step_s: Sequence[float], max_launches: int = kMaxLaunches) -> bool:
    """Whether validate launches the plan again: fewer than `max_launches` so far and its median
    step not yet known within +-5 % (or unknown: one launch)."""
    return len(launch_step_s) < max_launches and not is_steady(launch_step_s)


def launch_matched(measured_s: Sequence[float], predicted_s: Sequence[float]) -> dict:
    """One plan's launches against their predictions at launch (each launch's measured step
    against the plan priced with the shared-core table that launch's bursts measured):
    {"ratios": measured / predicted per launch, "median_ratio", "ratio_interval": the bootstrap
    90 % interval of the median ratio (launch_interval; None for one launch), "steady": that
    interval within +-5 % of the median ratio (is_steady; None for one launch), "error":
    1 / median_ratio - 1 (predicted over measured, validate's sign), "step_s": the median of the
    launches' predictions}."""
    if len(measured_s) != len(predicted_s) or not measured_s:
        raise ValueError(f"launch_matched: {len(measured_s)} launches measured, "
                         f"{len(predicted_s)} predicted")
    ratios = [m / p for m, p in zip(measured_s, predicted_s)]
    median = statistics.median(ratios)
    return {"ratios": ratios, "median_ratio": median, "ratio_interval": launch_interval(ratios),
            "steady": is_steady(ratios), "error": 1 / median - 1,
            "step_s": statistics.median(predicted_s)}


def launch_matched_rows(rows: Sequence[dict]) -> List[dict]:
    """validate's rows as the at-launch comparison (each row's "at_launch", launch_matched's),
    in the form decide() reads: the prediction is the median of the launches' predictions P,
    each launch's step is P x its ratio (the launch's measurement at the host speed of that
    prediction), the interval P x the ratio interval, steadiness and the step error the ratios'.
    So decide's "prediction within the interval" is ratio 1 within the ratio interval."""
    out = []
    for row in rows:
        matched = row["at_launch"]
        p = matched["step_s"]
        interval = matched["ratio_interval"]
        out.append(dict(row, predicted=dict(row["predicted"], step_s=p),
                        launch_step_s=[p * r for r in matched["ratios"]],
                        launch_interval_s=None if interval is None else [p * x for x in interval],
                        steady=matched["steady"],
                        errors=dict(row["errors"], step_s=matched["error"])))
    return out


def _label(row: dict) -> str:
    return f"{row['dp']}x{row['mp']} {row['kind']}"


def decide(rows: Sequence[dict]) -> dict:
    """The verdict over validate's rows (validation.compare's, each with launch_step_s,
    launch_interval_s and steady): every target's value, which were missed, the steady plans
    beyond the worst target and the unsteady plans with their intervals."""
    errors = [(i, abs(r["errors"]["step_s"])) for i, r in enumerate(rows)
              if r["errors"]["step_s"] is not None]
    steady = [(i, e) for i, e in errors if rows[i].get("steady") is not False]
    memory = [abs(r["memory_error"]) for r in rows if r.get("memory_error") is not None]
    median = statistics.median(e for _, e in errors) if errors else None
    worst_row, worst = max(steady, key=lambda x: x[1]) if steady else (None, None)
    unsteady = []
    for i, r in enumerate(rows):
        if r.get("steady") is False:
            low, high = r["launch_interval_s"]
            predicted = r["predicted"]["step_s"]
            unsteady.append({"row": i, "plan": _label(r), "launches": len(r["launch_step_s"]),
                             "median_s": statistics.median(r["launch_step_s"]),
                             "interval_s": [low, high], "predicted_s": predicted,
                             "within": low <= predicted <= high})
    missed = []
    if median is not None and median > kMedianTarget:
        missed.append(f"median |step error| {100 * median:.1f} % > {100 * kMedianTarget:.0f} %")
    steady_misses = [{"row": i, "plan": _label(rows[i]), "error": rows[i]["errors"]["step_s"]}
                     for i, e in steady if e > kWorstTarget]
    for miss in steady_misses:
        missed.append(f"{miss['plan']} (steady) step error {100 * miss['error']:+.1f} % beyond "
                      f"{100 * kWorstTarget:.0f} %")
    if memory and max(memory) > kMemoryTarget:
        missed.append(f"worst |memory error| {100 * max(memory):.1f} % > "
                      f"{100 * kMemoryTarget:.0f} %")
    # a plan whose step's matrix products did not run in its precision was not the plan
    # predicted (validation.measured_precision; rows without the record are not judged)
    precision_misses = []
    for i, r in enumerate(rows):
        ran = r.get("measured_precision")
        if ran is not None and ran["dtype"] != r.get("precision", "fp32"):
            precision_misses.append({"row": i, "plan": _label(r),
                                     "precision": r.get("precision", "fp32"),
                                     "ran_in": ran["dtype"], "share": ran["share"]})
            missed.append(f"{_label(r)} planned in {r.get('precision', 'fp32')}, its matrix "
                          f"products ran in {ran['dtype']} ({100 * ran['share']:.0f} %)")
    for u in unsteady:
        if not u["within"]:
            missed.append(f"{u['plan']} (unsteady) predicted {1e3 * u['predicted_s']:.2f} ms, "
                          f"outside its interval {_interval_ms(u['interval_s'])} ms")
    return {"met": not missed, "missed": missed,
            "median_abs_error": median, "median_target": kMedianTarget,
            "worst_steady_abs_error": worst,
            "worst_steady_plan": None if worst_row is None else _label(rows[worst_row]),
            "worst_target": kWorstTarget,
            "memory_worst_abs_error": max(memory) if memory else None,
            "memory_target": kMemoryTarget,
            "steady_misses": steady_misses, "unsteady": unsteady,
            "precision_misses": precision_misses,
            "one_launch": [_label(r) for r in rows if r.get("steady") is None],
            "step_tolerance": kStepTolerance, "interval_confidence": kIntervalConfidence}


def _interval_ms(interval: Sequence[float]) -> str:
    return f"{1e3 * interval[0]:.2f}-{1e3 * interval[1]:.2f}"


def verdict_lines(verdict: dict) -> List[str]:
    """The verdict in a few lines of text (validate.md's last section, the demo's last word)."""
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f} %"

    head = "met" if verdict["met"] else "missed: " + "; ".join(verdict["missed"])
    on = {"at launch": " (on the comparison at launch: every launch against the plan priced with "
                       "the shared-core slowdown its own bursts measured)",
          "as calibrated": " (on the comparison as calibrated: every launch against the one "
                           "prediction the calibration's table gave)"}.get(
        verdict.get("comparison"), "")
    lines = [f"verdict: {head}{on}",
             f"- median |step error| {pct(verdict['median_abs_error'])} (target <= "
             f"{100 * verdict['median_target']:.0f} %, every plan); worst "
             f"{pct(verdict['worst_steady_abs_error'])}"
             + (f" ({verdict['worst_steady_plan']})" if verdict["worst_steady_plan"] else "")
             + f" (target <= {100 * verdict['worst_target']:.0f} %, steady plans); memory "
             f"worst {pct(verdict['memory_worst_abs_error'])} (target <= "
             f"{100 * verdict['memory_target']:.0f} %)"]
    for u in verdict["unsteady"]:
        lines.append(f"- unsteady on this host: {u['plan']}, median of {u['launches']} launches "
                     f"{1e3 * u['median_s']:.2f} ms, {100 * verdict['interval_confidence']:.0f} "
                     f"% interval {_interval_ms(u['interval_s'])} ms (wider than +-"
                     f"{100 * verdict['step_tolerance']:.0f} %), predicted "
                     f"{1e3 * u['predicted_s']:.2f} ms: "
                     + ("within it" if u["within"] else "outside it"))
    if verdict["one_launch"]:
        lines.append(f"- one launch, steadiness unknown (counted as steady): "
                     f"{', '.join(verdict['one_launch'])}")
    return lines
