"""Runs every benchmark and collects their output into out/bench/results.md (`make bench`).

Benchmarks are the compiled build/bin/bench_* programs and the bench/bench_*.py scripts (each
owned by whoever measures that part). Each runs in turn (they would disturb each other's timings
if run together); its stdout is printed as it arrives and copied into the report. A benchmark
that fails is reported with its exit status and the run carries on; the script exits 1 if any did.
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


def find_benchmarks(build_dir: Path) -> list:
    """[(name, argv)] for the compiled and the Python benchmarks, each group sorted by name."""
    compiled = sorted(p for p in (build_dir / "bin").glob("bench_*")
                      if p.is_file() and os.access(p, os.X_OK))
    scripts = sorted((ROOT / "bench").glob("bench_*.py"))
    return ([(p.name, [str(p)]) for p in compiled]
            + [(p.name, [sys.executable, str(p)]) for p in scripts])


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


def report(results: list) -> str:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"# hybridplan benchmarks\n",
           f"{stamp}, {platform.node()}, {platform.machine()}, {os.cpu_count()} CPUs, "
           f"Python {platform.python_version()}\n",
           "| benchmark | status | seconds |", "|---|---|---|"]
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
    args = parser.parse_args(argv)

    benchmarks = find_benchmarks(args.build_dir)
    if not benchmarks:
        print(f"run_all: no benchmarks found ({args.build_dir}/bin/bench_*, bench/bench_*.py)")
    results = []
    for name, cmd in benchmarks:
        print(f"==> {name}", flush=True)
        status, output, seconds = run_one(cmd, args.timeout_s)
        print(f"<== {name}: {'ok' if status == 0 else f'exit {status}'} in {seconds:.1f} s\n",
              flush=True)
        results.append((name, status, output, seconds))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(results))
    print(f"run_all: wrote {args.out}")
    return 0 if all(status == 0 for _, status, _, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
