"""Time to accuracy, predicted against measured: trains plans to the target with torchrun.

    python -m hybridplan validate --time-to-target --task task.json --graph g.json \\
        --cluster cluster.json --job out/convergence/job.json \\
        [--noise-job out/convergence/job-noise-scale.json] [--devices 2] [--seeds 0,1,2]

The plans span global batches (`select_plans`): the planner's pick under the job's measured
convergence model, the throughput-optimal plan (the same search for samples/s), data parallel at
a small and at a large per-replica batch, and the best pipeline. Each is trained to the target
once per seed (launches interleaved: every plan with seed 0, then every plan with seed 1, ...)
by hybridplan.measure.time_to_target_worker, which times every training step (evaluations
excluded).

Predicted time to target is the planner's own: the plan's predicted step time times the steps
its Job's convergence model gives at the plan's global batch (convergence.h), once with the
measured convergence model and once with the noise-scale one. Measured time to target is the
slowest rank's summed step time up to the evaluation where the target held. The report gives,
per plan, the median over seeds and the spread (min-max), the error of each prediction, where
the planner's pick lands when measured, and the measured steps beside the one-process runs'.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..convergence import tradeoff as cv
from ..files import write_text_atomic
from ..planner import InfeasibleError, Job, evaluate, search
from ..trace import plan_kind
from .validation import rank_output, run_worker

__all__ = ["select_plans", "validate_time_to_target", "markdown"]


def _kind(plan: dict) -> str:
    return f"{plan_kind(plan)} (B={plan['global_batch']})"


def _best(graph, cluster, job, devices: int, min_mp: int = 1, **kwargs) -> Optional[dict]:
    """The search's best plan with mp >= min_mp (a pipeline search also ranks mp = 1 plans)."""
    try:
        ranked = search(graph, cluster, job, devices=devices, top_k=1 if min_mp == 1 else 200,
                        **kwargs).plans
    except InfeasibleError:
        return None
    return next((p.to_dict() for p in ranked if p.mp >= min_mp), None)


def select_plans(graph, cluster, job: dict, devices: int,
                 dp_batches: Tuple[int, int]) -> List[Tuple[str, dict]]:
    """(role, plan) for: the planner's pick under `job` (its convergence model and batch
    candidates), the throughput-optimal plan (the same candidates, no convergence model: samples
    per second), data parallel (mp = 1, unsharded) at per-replica batches dp_batches, and the
    best pipeline; a plan already chosen under another role is not repeated."""
    throughput_job = {k: v for k, v in job.items() if k not in ("convergence",)}
    candidates = [
        ("planner's pick", _best(graph, cluster, job, devices)),
        ("throughput-optimal", _best(graph, cluster, throughput_job, devices)),
    ]
    for b in dp_batches:
        fixed = dict(job, per_replica_batch=b)
        candidates.append((f"data parallel b={b}",
                           _best(graph, cluster, fixed, devices, dp_only=True,
                                 shardings=("none",))))
    candidates.append(("best pipeline", _best(graph, cluster, job, devices, min_mp=2,
                                              modes=("pipeline",))))
    chosen: List[Tuple[str, dict]] = []
    for role, plan in candidates:
        if plan is None:
            continue
        same = next((i for i, (_, p) in enumerate(chosen) if _same(p, plan)), None)
        if same is None:
            chosen.append((role, plan))
        else:
            chosen[same] = (f"{chosen[same][0]}, {role}", chosen[same][1])
    return chosen


def _same(a: dict, b: dict) -> bool:
    keys = ("dp", "mp", "mode", "per_replica_batch", "num_microbatches", "schedule", "sharding",
            "virtual_stages", "assignment")
    return all(a.get(k) == b.get(k) for k in keys)


def _launch(plan: dict, task_path: str, seed: int, timeout_s: float, work_dir: Path,
            measure_noise_scale: int = 0) -> dict:
    done, out_path = run_worker(
        plan, "hybridplan.measure.time_to_target_worker",
        ["--task", task_path, "--seed", str(seed), "--timeout-s", str(timeout_s),
         "--measure-noise-scale", str(measure_noise_scale)], 30 * timeout_s, work_dir)
    if done.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"time to target: the {_kind(plan)} plan failed (exit "
                           f"{done.returncode}); what the ranks printed:\n"
                           f"{rank_output(done.stdout + done.stderr)}")
    return json.loads(out_path.read_text())


def _one_process_steps(task, record: Optional[dict], global_batch: int, seed: int) -> int:
    """The one-process run's steps to target at (global_batch, seed): from the `convergence`
    record when it holds that run, else trained here."""
    for r in (record or {}).get("sweep", {}).get("runs", []):
        if r["global_batch"] == global_batch and r["seed"] == seed and r.get("start_samples", 0) == 0:
            return r["steps"]
    run, _ = cv.train_to_target(task, global_batch, seed)
    return run.steps


def _error(predicted: Optional[float], measured: Optional[float]) -> Optional[float]:
    if predicted is None or not measured:
        return None
    return predicted / measured - 1


def validate_time_to_target(graph, cluster, task_path: str, job: dict,
                            noise_job: Optional[dict] = None, devices: int = 2,
                            seeds: Sequence[int] = (0, 1, 2),
                            dp_batches: Tuple[int, int] = (8, 128), timeout_s: float = 120.0,
                            out_dir: str = "out/time_to_target",
                            one_process: Optional[dict] = None,
                            max_plans: Optional[int] = None,
                            progress=print) -> Dict[str, Any]:
    """Runs every selected plan to the target under each seed and compares (see the module
    docstring). Each plan's steps are set beside the one-process run's at the same global batch
    and seed: from `one_process` (a `convergence` record) where it holds that run, else trained
    here. Data-parallel plans also measure the online noise scale in their first pass. `max_plans`: only the
    first plans of the selection (the test suite's reduced form)."""
    task = cv.task_from_spec(json.loads(Path(task_path).read_text()), os.fspath(task_path))
    Job.from_dict(job, "job")  # the planner's validation, before anything runs
    if noise_job is not None:
        Job.from_dict(noise_job, "noise-scale job")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plans = select_plans(graph, cluster, job, devices, dp_batches)[:max_plans]
    launches: Dict[int, List[dict]] = {i: [] for i in range(len(plans))}
    for seed in seeds:
        for i, (role, plan) in enumerate(plans):
            online = plan["mp"] == 1 and plan["dp"] >= 2 and plan.get("sharding", "none") == "none"
            measured = _launch(plan, os.fspath(task_path), seed, timeout_s, out,
                               measure_noise_scale=1 if online else 0)
            launches[i].append(measured)
            progress(f"{role:<34s} {_kind(plan):<40s} seed {seed}: "
                     f"{'reached' if measured['reached'] else 'NOT reached'} after "
                     f"{measured['steps']} steps, {measured['train_s']:.2f} s")
    rows = []
    for i, (role, plan) in enumerate(plans):
        runs = launches[i]
        reached = [r for r in runs if r["reached"]]
        times = sorted(r["train_s"] for r in reached)
        predicted = evaluate(graph, cluster, plan, job)
        by_noise = evaluate(graph, cluster, plan, noise_job) if noise_job else None
        n = job["samples_per_epoch"]
        b = plan["global_batch"]
        row = {"role": role, "kind": _kind(plan), "plan": plan, "global_batch": b,
               "predicted_step_s": predicted["step_s"],
               "predicted_steps": predicted["epochs"] * n / b,
               "predicted_s": predicted["time_to_train_s"],
               "predicted_noise_s": by_noise["time_to_train_s"] if by_noise else None,
               "predicted_noise_steps": by_noise["epochs"] * n / b if by_noise else None,
               "measured_s": statistics.median(times) if len(times) == len(runs) else None,
               "measured_min_s": times[0] if times else None,
               "measured_max_s": times[-1] if times else None,
               "measured_steps": [r["steps"] for r in runs],
               "measured_step_s": statistics.median(r["median_step_s"] for r in runs),
               "reached": [r["reached"] for r in runs], "runs": runs}
        row["one_process_steps"] = [_one_process_steps(task, one_process, b, r["seed"])
                                    for r in runs]
        row["online_noise_scale"] = [r.get("noise_scale") for r in runs]
        row["error"] = _error(row["predicted_s"], row["measured_s"])
        row["noise_error"] = _error(row["predicted_noise_s"], row["measured_s"])
        rows.append(row)
    measured_order = sorted((r for r in rows if r["measured_s"] is not None),
                            key=lambda r: r["measured_s"])
    pick = rows[0]
    errors = [abs(r["error"]) for r in rows if r["error"] is not None]
    noise_errors = [abs(r["noise_error"]) for r in rows if r["noise_error"] is not None]
    fastest = measured_order[0] if measured_order else None
    result = {
        "rows": rows, "seeds": list(seeds), "devices": devices,
        "median_abs_error": statistics.median(errors) if errors else None,
        "worst_abs_error": max(errors) if errors else None,
        "noise_median_abs_error": statistics.median(noise_errors) if noise_errors else None,
        "pick_measured_rank": (1 + measured_order.index(pick)) if pick in measured_order else None,
        # Within the seeds' spread: the pick's fastest seed is no slower than the fastest plan's
        # median, i.e. the spreads overlap.
        "pick_within_spread": (fastest is not None and pick["measured_min_s"] is not None
                               and pick["measured_min_s"] <= fastest["measured_s"]),
        "fastest": fastest["role"] if fastest else None,
    }
    write_text_atomic(out / "time_to_target.json", json.dumps(result, indent=1))
    write_text_atomic(out / "time_to_target.md", markdown(result))
    return result


def _s(x: Optional[float]) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.2f}"


def _pct(x: Optional[float]) -> str:
    return "—" if x is None else f"{100 * x:+.0f} %"


def markdown(result: Dict[str, Any]) -> str:
    lines = ["| plan | role | predicted steps | measured steps per seed | one process | steps "
             "error | predicted step | measured step | step error | predicted s | predicted s "
             "(noise scale) | measured s (median, min–max) | error | error (noise scale) |",
             "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        one = ", ".join(str(s) for s in r.get("one_process_steps", [])) or "—"
        steps = statistics.median(r["measured_steps"])
        lines.append(
            f"| {r['kind']} | {r['role']} | {r['predicted_steps']:.0f} | "
            f"{', '.join(str(s) for s in r['measured_steps'])} | {one} | "
            f"{_pct(_error(r['predicted_steps'], steps))} | "
            f"{1e3 * r['predicted_step_s']:.2f} ms | {1e3 * r['measured_step_s']:.2f} ms | "
            f"{_pct(_error(r['predicted_step_s'], r['measured_step_s']))} | "
            f"{_s(r['predicted_s'])} | {_s(r['predicted_noise_s'])} | {_s(r['measured_s'])} "
            f"({_s(r['measured_min_s'])}–{_s(r['measured_max_s'])}) | {_pct(r['error'])} | "
            f"{_pct(r['noise_error'])} |")
    online = [(r["kind"], [o["b_simple"] for o in r.get("online_noise_scale", []) if o])
              for r in result["rows"]]
    online = [(k, v) for k, v in online if v]
    if online:
        lines += ["", "online noise scale B_simple at the target (the executor's, every step of "
                  "the first pass; small batch = per-replica, big = global): " + "; ".join(
                      f"{k}: {', '.join(f'{b:.0f}' for b in v)}" for k, v in online)]
    def pct(x: Optional[float]) -> str:
        return "—" if x is None else f"{100 * x:.0f} %"

    lines += ["", f"median |error| of predicted time to target: "
              f"{pct(result['median_abs_error'])} (worst {pct(result['worst_abs_error'])}); "
              f"with the noise-scale model: {pct(result['noise_median_abs_error'])}",
              f"the planner's pick is #{result['pick_measured_rank']} of {len(result['rows'])} "
              f"when measured (fastest: {result['fastest']}); within the seeds' spread of the "
              f"fastest: {'yes' if result['pick_within_spread'] else 'no'}"]
    return "\n".join(lines) + "\n"
