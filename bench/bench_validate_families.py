"""Predicted vs measured step time and memory on three model families, each on its own: the
Inception-style CNN the cost model was first validated on (branchy_cnn), a causal transformer
language model of torch's TransformerEncoderLayers (transformer_lm) and an LSTM language model
(biglstm). Each run is `make demo`'s job on that model (examples/demo.py --model: profile,
calibrate with the model's own graph, plan, validate 8 plans in 3 interleaved launches each,
up to 7 for a plan whose median step is not yet known within +-5 %), from scratch. The table
gives, per run, validate's verdict (hybridplan.measure.verdict): the median |step error| over
every plan, the worst over the steady plans, the plans unsteady on this host with their 90 %
interval and whether the prediction lies in it, the worst |memory error|, and which targets
missed; beside it the median signed error (a shift every plan shares: the host faster or
slower than when calibrated), each round of launches' speed against the plans' median launches
(the host's speed across the validation), and how many predicted steps lie within their plan's
own 10th-90th percentile of steps (validate's step spread). A summary per family follows.
Targets: median <= 10 %, worst (steady plans) <= 25 %, memory within 15 %, an unsteady plan's
prediction within its interval. The verdict is held on validate's comparison at launch (each
launch priced with the shared-core slowdown its own bursts measured: docs/calibration.md "The
comparison at launch"; "held on"); the same targets on the comparison as calibrated are given
beside it.

    python bench/bench_validate_families.py [--runs 3] [--models transformer_lm biglstm]
                                            [--out-dir out/bench/validate] [--quick]
                                            [--precision fp32 bf16] [--plans 8]
                                            [--max-launches 7]

`--precision fp32 bf16` validates each run's job in every precision given, one after the other
on the same profile and calibration (calibrate measures the model's own bf16 speed-up, which
the planner prices; examples/demo.py --precision): one row per run and precision, the
precision a column, and a summary per family and precision. `--plans` and `--max-launches`
bound each validation (a shorter run on a loaded host).

Needs a quiet machine: the ranks' timings are the measurement. Runs land in
<out-dir>/<model>-<run>/ (validate.md there has every plan's terms). `--quick` runs
`examples/demo.py --quick` instead (a smoke run of the same job: its errors are not measurements).
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("branchy_cnn", "transformer_lm", "biglstm")


def one_run(model: str, out_dir: Path, quick: bool = False, precisions=("fp32",),
            plans=None, max_launches=None) -> dict:
    """examples/demo.py on `model` into `out_dir`, validated in each of `precisions` in turn;
    {precision: the figures of its validate.json}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    extra = (["--quick"] if quick else []) + ["--precision", *precisions]
    extra += ["--plans", str(plans)] if plans else []
    extra += ["--max-launches", str(max_launches)] if max_launches else []
    with open(out_dir / "demo.log", "w") as log:  # the ranks' warnings stay out of the table
        done = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--model",
                               model, "--out-dir", str(out_dir)] + extra,
                              cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"{model}: examples/demo.py failed ({done.returncode}); see "
                         f"{out_dir / 'demo.log'}")
    out = {}
    for precision in precisions:  # demo.py's layout: fp32 in out_dir, another below it
        where = out_dir if precision == "fp32" else out_dir / precision
        result = json.loads((where / "validate.json").read_text())
        out[precision] = {"verdict": result["verdict"],
                          "as_calibrated": result.get("verdict_as_calibrated"),
                          "first_fastest": result["best_predicted_rank_measured"] == 1,
                          "signed": result.get("signed_median_error"),
                          "rounds": result.get("round_speed") or [],
                          "within": result.get("within_step_spread"),
                          "speedup": (result.get("precision") or {}).get("compute_speedup")}
    return out


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _unsteady(verdict: dict) -> str:
    """Each unsteady plan: its interval (ms) and whether its prediction lies in it."""
    return "; ".join(f"{u['plan']} {1e3 * u['interval_s'][0]:.1f}-{1e3 * u['interval_s'][1]:.1f} "
                     f"(pred {1e3 * u['predicted_s']:.1f}, {'in' if u['within'] else 'OUT'})"
                     for u in verdict["unsteady"]) or "-"


def _worst(verdict: dict) -> str:
    plan = verdict["worst_steady_plan"]
    return _pct(verdict["worst_steady_abs_error"]) + (f" ({plan})" if plan else "")


def _calibrated_once(run: dict) -> str:
    """The same targets on the comparison as calibrated, where the verdict was held at launch
    (validate.json verdict_as_calibrated); "-" where the verdict is that comparison."""
    v = run.get("as_calibrated")
    return "-" if not v else (f"{'met' if v['met'] else 'missed'}, "
                              f"{_pct(v['median_abs_error'])}")


def _span(values: list) -> str:
    return "-" if not values else f"{_pct(min(values))} - {_pct(max(values))}"


def summary(model: str, precision: str, runs: list) -> str:
    """One family over its runs: the verdicts met, the median and worst-steady ranges, every
    run's unsteady plans, the worst memory error and every target missed."""
    verdicts = [r["verdict"] for r in runs]
    medians = [v["median_abs_error"] for v in verdicts if v["median_abs_error"] is not None]
    worst = [v["worst_steady_abs_error"] for v in verdicts
             if v["worst_steady_abs_error"] is not None]
    memory = [v["memory_worst_abs_error"] for v in verdicts
              if v["memory_worst_abs_error"] is not None]
    unsteady = [f"run {i + 1}: {_unsteady(v)}" for i, v in enumerate(verdicts) if v["unsteady"]]
    missed = [f"run {i + 1}: {'; '.join(v['missed'])}" for i, v in enumerate(verdicts)
              if v["missed"]]
    return (f"| {model} | {precision} | {sum(v['met'] for v in verdicts)} of {len(verdicts)} | "
            f"{_span(medians)} | {_span(worst)} | {' / '.join(unsteady) or '-'} | "
            f"{_pct(max(memory, default=None))} | {' / '.join(missed) or '-'} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(FAMILIES))
    parser.add_argument("--out-dir", type=Path, default=ROOT / "out" / "bench" / "validate")
    parser.add_argument("--quick", action="store_true",
                        help="examples/demo.py --quick per run (a smoke run, not a measurement)")
    parser.add_argument("--precision", nargs="+", default=["fp32"],
                        choices=("fp32", "bf16", "fp16"),
                        help="the job's precision, each validated in turn on the same "
                             "calibration (default fp32)")
    parser.add_argument("--plans", type=int, help="plans per validation (demo's default 8)")
    parser.add_argument("--max-launches", type=int,
                        help="launches of a plan at most (default 7)")
    args = parser.parse_args(argv)
    precisions = list(dict.fromkeys(args.precision))
    print("| model | run | precision | compute_speedup | verdict | median \\|error\\| | "
          "worst, steady (plan) | unsteady: 90 % interval ms (prediction) | memory worst | "
          "first plan fastest | signed median | rounds' speed | within steps p10-p90 | "
          "held on | as calibrated: verdict, median \\|error\\| |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    runs = {}
    for model in args.models:
        for run in range(1, args.runs + 1):
            by_precision = one_run(model, args.out_dir / f"{model}-{run}", args.quick,
                                   precisions, args.plans, args.max_launches)
            for precision in precisions:
                r = by_precision[precision]
                runs.setdefault((model, precision), []).append(r)
                v = r["verdict"]
                signed = "-" if r["signed"] is None else f"{100 * r['signed']:+.1f} %"
                speedup = "-" if r["speedup"] is None else f"{r['speedup']:.3f}"
                print(f"| {model} | {run} | {precision} | {speedup} | "
                      f"{'met' if v['met'] else 'missed'} | "
                      f"{_pct(v['median_abs_error'])} | {_worst(v)} | {_unsteady(v)} | "
                      f"{_pct(v['memory_worst_abs_error'])} | "
                      f"{'yes' if r['first_fastest'] else 'no'} | {signed} | "
                      f"{', '.join(f'{x:.2f}' for x in r['rounds'])} | "
                      f"{'-' if not r['within'] else '{} of {}'.format(*r['within'])} | "
                      f"{v.get('comparison', 'as calibrated')} | {_calibrated_once(r)} |",
                      flush=True)
    print("\n| model | precision | verdict met | median \\|error\\| | worst, steady | "
          "unsteady plans | memory worst | missed |")
    print("|---|---|---|---|---|---|---|---|")
    for (model, precision), family in runs.items():
        print(summary(model, precision, family))
    met = all(r["verdict"]["met"] for family in runs.values() for r in family)
    print("verdict (median <= 10 %, worst steady <= 25 %, memory within 15 %, unsteady plans "
          "within their interval):", "met in every run" if met else "missed in at least one run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
