"""Runs every benchmark and collects their output into out/bench/results.md (`make bench`).

Benchmarks are the compiled build/bin/bench_* programs and the bench/bench_*.py scripts (each
owned by whoever measures that part). Each runs in turn (they would disturb each other's timings
if run together); its stdout is printed as it arrives and copied into the report. A benchmark
that fails is reported with its exit status and the run carries on; the script exits 1 if any did.

After them it runs the long test matrices' full form (`make test-full`: pytest -m full, the
cases `make test` leaves out), reported as the benchmark "test-full".

`--quick` runs each benchmark at its smallest size (QUICK_ARGS: a step or two, one round, the
smallest model), writing what a benchmark writes beside the report instead of into out/bench/:
a smoke run proving every benchmark still runs, whose figures are not measurements. `--only`
runs the named benchmarks alone (file names, e.g. bench_search bench_profiler.py). A benchmark
that judges its own tolerance (bench_profile_agreement.py) can miss it on so few samples, and
then says so in its status.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# --quick: each benchmark's arguments at its smallest size ({out}: the report's folder).
# A benchmark not listed takes no size arguments and runs as it is.
QUICK_ARGS = {
    "bench_allocator_policy.py": ["--models", "branchy_cnn", "--pairs", "1", "--steps", "2",
                                  "--batch", "4"],
    "bench_at_scale.py": ["--out-dir", "{out}/at_scale"],
    "bench_at_size.py": ["--rows", "8b-8", "--out-dir", "{out}/at_size"],
    "bench_checkpoint.py": ["--quick", "--out-dir", "{out}/checkpoint"],
    "bench_cpp_ddp.py": ["--widths", "16,32,8", "--global-batch", "8", "--steps", "3",
                         "--warmup-steps", "1", "--rounds", "1"],
    "bench_fake_profile.py": ["--models", "branchy_cnn", "--batch", "4", "--repeats", "2"],
    "bench_meta_memory.py": ["--layers", "2", "--hidden", "64", "--intermediate", "128",
                             "--heads", "4", "--kv-heads", "2", "--vocab", "256", "--seq", "8",
                             "--steps", "1", "--out-dir", "{out}/meta_memory"],
    "bench_host_noise.py": ["--seconds", "2", "--model", "hybridplan.models:digits_cnn",
                            "--batch", "4"],
    "bench_executor.py": ["--steps", "3", "--warmup-steps", "1", "--global-batch", "8",
                          "--microbatches", "2"],
    "bench_noise_online.py": ["--steps", "3", "--warmup-steps", "1", "--global-batch", "8",
                              "--every", "1", "--rounds", "1"],
    "bench_profile_agreement.py": ["--models", "mlp", "--batch", "4", "--repeats", "3",
                                   "--rounds", "1"],
    "bench_profiler.py": ["--batch", "2", "--rounds", "1", "--steps", "2", "--clock", "thread"],
    "bench_send_while_computing.py": ["--repeats", "2", "--compute-ms", "1"],
    "bench_shard_batch.py": ["--batches", "2,4", "--rounds", "1"],
    "bench_split_backward.py": ["--steps", "8", "16", "--layers", "1", "--repeats", "1"],
    "bench_stage_code.py": ["--batches", "1", "--repeats", "2"],
    "bench_trainer_parsers.py": ["--quick", "--out-dir", "{out}/trainer_parsers"],
    "bench_validate_families.py": ["--runs", "1", "--models", "branchy_cnn", "--quick",
                                   "--out-dir", "{out}/validate"],
}


# Benchmarks that need more than --timeout-s at full size (seconds; the larger is used).
# bench_checkpoint.py: four 100M-parameter save/load runs, 20 restarted 4-rank jobs, an elastic run.
# test-full: every model under every plan kind and the 4-rank variants (pytest -m full).
# bench_meta_memory.py: a 1.1B-parameter Llama built, materialised and trained on 4 ranks.
TIMEOUTS = {"bench_checkpoint.py": 3600.0, "test-full": 3600.0, "bench_meta_memory.py": 3600.0}


def search_inputs(folder: Path) -> list:
    """bench_search's arguments: the MT-NLG 530B graph it plans (Smith et al. 2022: 105 layers,
    hidden 20480, 128 heads, sequence 2048), written by hybridplan.profiler.from_config into
    `folder` (the graph comes from Python; the benchmark is C++). [] when it cannot be written
    (bench_search then says it skipped that part)."""
    path = folder / "mtnlg-530b.graph.json"
    code = ("import json, sys; sys.path.insert(0, sys.argv[2]); "
            "from hybridplan.profiler.from_config import TransformerConfig, graph_from_config; "
            "cfg = TransformerConfig('mt-nlg-530b', 105, 20480, 128, 2048, 51200); "
            "open(sys.argv[1], 'w').write(json.dumps(graph_from_config("
            "cfg, device='A100', parallel_cross_entropy=True)))")
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-c", code, str(path), str(ROOT / "python")],
                          cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        print(f"run_all: bench_search runs without MT-NLG: {done.stderr.strip()[-300:]}")
        return []
    return ["--mtnlg-graph", str(path)]


# The long test matrices' full form (`make test-full`: pytest -m full), which `make test` runs
# reduced; run here after the benchmarks, left out of --quick unless --only names it.
TEST_FULL = ("test-full", [sys.executable, "-m", "pytest", "-q", "tests/python", "-m", "full",
                           "-p", "no:cacheprovider"])


def find_benchmarks(build_dir: Path) -> list:
    """[(name, argv)] for the compiled and the Python benchmarks, each group sorted by name,
    then the full test matrix (TEST_FULL)."""
    compiled = sorted(p for p in (build_dir / "bin").glob("bench_*")
                      if p.is_file() and os.access(p, os.X_OK))
    scripts = sorted((ROOT / "bench").glob("bench_*.py"))
    return ([(p.name, [str(p)]) for p in compiled]
            + [(p.name, [sys.executable, str(p)]) for p in scripts] + [TEST_FULL])


def run_one(argv: list, timeout_s: float) -> tuple:
    """(exit status, combined output, seconds); the output is echoed line by line. A benchmark
    still running after `timeout_s` is killed (a reader thread keeps a silent hang killable)."""
    start = time.monotonic()
    lines = []

    def pump(stream):
        for line in stream:
            print(line, end="", flush=True)
            lines.append(line)

    with subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1, start_new_session=True) as proc:
        reader = threading.Thread(target=pump, args=(proc.stdout,), daemon=True)
        reader.start()
        try:
            status = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: children die with it
            status = proc.wait()
            lines.append(f"\n[killed after {timeout_s:.0f} s]\n")
        reader.join(timeout=5)
    return status, "".join(lines), time.monotonic() - start


def report(results: list, quick: bool = False) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = ["# hybridplan benchmarks\n",
           f"{stamp}, {platform.node()}, {platform.machine()}, {os.cpu_count()} CPUs, "
           f"Python {platform.python_version()}\n"]
    if quick:
        out.append("**--quick**: each benchmark at its smallest size; a smoke run, the figures "
                   "below are not measurements.\n")
    out += ["| benchmark | status | seconds |", "|---|---|---|"]
    out += [f"| {name} | {'ok' if status == 0 else f'exit {status}'} | {seconds:.1f} |"
            for name, status, _, seconds in results]
    for name, status, output, _ in results:
        out += ["", f"## {name}", "", "```", output.rstrip(), "```"]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-dir", type=Path, default=ROOT / "build",
                        help="where build/bin/bench_* live (default: build)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench" / "results.md")
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per benchmark")
    parser.add_argument("--quick", action="store_true",
                        help="each benchmark at its smallest size (a smoke run, not a "
                             "measurement; files beside --out)")
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="run only these benchmarks (file names: bench_search, "
                             "bench_profiler.py, ...)")
    args = parser.parse_args(argv)

    benchmarks = find_benchmarks(args.build_dir)
    if args.only:
        unknown = sorted(set(args.only) - {name for name, _ in benchmarks})
        if unknown:
            parser.error(f"--only: no such benchmark {', '.join(unknown)} (found: "
                         f"{', '.join(name for name, _ in benchmarks)})")
        benchmarks = [(name, cmd) for name, cmd in benchmarks if name in args.only]
    elif args.quick:  # the full matrix has no smaller size: a smoke run leaves it out
        benchmarks = [(name, cmd) for name, cmd in benchmarks if name != TEST_FULL[0]]
    if args.quick:
        folder = str(args.out.resolve().parent)
        benchmarks = [(name, cmd + [a.replace("{out}", folder) for a in QUICK_ARGS.get(name, [])])
                      for name, cmd in benchmarks]
    benchmarks = [(name, cmd + search_inputs(args.out.resolve().parent) if name == "bench_search"
                   else cmd) for name, cmd in benchmarks]
    if not benchmarks:
        print(f"run_all: no benchmarks found ({args.build_dir}/bin/bench_*, bench/bench_*.py)")
    results = []
    for name, cmd in benchmarks:
        print(f"==> {name}", flush=True)
        timeout_s = args.timeout_s if args.quick else max(args.timeout_s,
                                                          TIMEOUTS.get(name, 0.0))
        status, output, seconds = run_one(cmd, timeout_s)
        print(f"<== {name}: {'ok' if status == 0 else f'exit {status}'} in {seconds:.1f} s\n",
              flush=True)
        results.append((name, status, output, seconds))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(results, args.quick))
    print(f"run_all: wrote {args.out}")
    return 0 if all(status == 0 for _, status, _, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
