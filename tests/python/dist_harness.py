"""Runs a function on N ranks as N processes on loopback, the way torchrun would (env://
rendezvous: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, MASTER_PORT=a free port), and
returns each rank's exit code and output. A run that exceeds its timeout is killed and reported
as such, so a bug that hangs a collective fails the test instead of hanging it.

    results = run_ranks("test_executor_pipeline:train_rank", 4, {"out_dir": str(tmp_path)})
    assert all(r.returncode == 0 for r in results), format_results(results)

run_commands does the same with a command line per rank (a C++ program's ranks, say).

As a script (what each rank process runs):  python dist_harness.py MODULE:FUNCTION JSON_KWARGS
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from hybridplan.net import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


@dataclasses.dataclass
class RankResult:
    rank: int
    returncode: Optional[int]   # None: killed at the timeout
    stdout: str
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None


def rank_env(rank: int, world_size: int, port: int, extra: Optional[Dict[str, str]] = None
             ) -> Dict[str, str]:
    env = dict(os.environ)
    path = [os.path.join(REPO, "python"), HERE, env.get("PYTHONPATH", "")]
    env.update({
        "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "PYTHONPATH": os.pathsep.join(p for p in path if p),
        # one intra-op thread per rank: N ranks share 2 cores, and results stay deterministic
        "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
    })
    env.update(extra or {})
    return env


def run_ranks(target: str, world_size: int, kwargs: Dict[str, Any], *, timeout_s: float = 60,
              env: Optional[Dict[str, str]] = None,
              env_per_rank: Optional[List[Dict[str, str]]] = None) -> List[RankResult]:
    """Starts `target` ("module:function", importable from tests/python) on world_size ranks
    and waits for all of them, at most timeout_s in total."""
    argv = [sys.executable, os.path.join(HERE, "dist_harness.py"), target, json.dumps(kwargs)]
    return run_commands([argv] * world_size, timeout_s=timeout_s, env=env,
                        env_per_rank=env_per_rank)


def run_cases(target: str, by_world: Dict[int, List[Dict[str, Any]]], out_dir: Any, *,
              timeout_s: float, kwargs_for: Any = None) -> Tuple[Dict[str, Any], Dict[int, str]]:
    """Runs `target` ("module:function(cases_file, out_dir, **kwargs)") once per world size on
    that many ranks, with the cases of that size (dicts with an "id", torch.save'd to a file:
    graphs and plans are too long for a command line); the function saves each case's result
    as <out_dir>/<id>.rank<r>.pt. Returns ({id: [rank 0's result, ...], or the failed launch's
    output}, {world: output of a launch that failed}). `kwargs_for(world)`: more arguments."""
    import torch

    failures: Dict[int, str] = {}
    for world, cases in by_world.items():
        cases_file = os.path.join(str(out_dir), f"cases-world{world}.pt")
        torch.save(cases, cases_file)
        kwargs = {"cases_file": cases_file, "out_dir": str(out_dir),
                  **(kwargs_for(world) if kwargs_for else {})}
        results = run_ranks(target, world, kwargs, timeout_s=timeout_s)
        if not all(r.returncode == 0 for r in results):
            failures[world] = format_results(results)
    loaded: Dict[str, Any] = {}
    for world, cases in by_world.items():
        for case in cases:
            paths = [os.path.join(str(out_dir), f"{case['id']}.rank{r}.pt") for r in range(world)]
            loaded[case["id"]] = ([torch.load(p) for p in paths]
                                  if all(os.path.exists(p) for p in paths)
                                  else failures.get(world, "no output"))
    return loaded, failures


def outputs_of(loaded: Dict[str, Any], case_id: str) -> Any:
    """run_cases' results of one case (one per rank), or the test fails with the output of the
    launch that did not finish it."""
    import pytest

    outs = loaded[case_id]
    if isinstance(outs, str):
        pytest.fail(f"the ranks did not finish {case_id}:\n{outs}")
    return outs


def run_phases(module: str, phases: Sequence[str], out_dir: Any, *, world_size: int = 2,
               timeout_s: float = 300) -> Tuple[Any, Dict[str, Tuple[bool, str]]]:
    """Runs `module:phase` on world_size ranks for each phase in turn (each with out_dir),
    stopping after the first that fails: (out_dir, {phase: (all ranks exited 0, their
    output)}). require_phase reads it in the tests."""
    report: Dict[str, Tuple[bool, str]] = {}
    for phase in phases:
        results = run_ranks(f"{module}:{phase}", world_size, {"out_dir": str(out_dir)},
                            timeout_s=timeout_s)
        report[phase] = (all(r.returncode == 0 for r in results), format_results(results))
        if not report[phase][0]:
            break
    return out_dir, report


def require_phase(runs: Tuple[Any, Dict[str, Tuple[bool, str]]], phase: str) -> Any:
    """run_phases' out_dir once `phase` (and every phase before it) succeeded; else the test
    fails with the output of the phase that failed."""
    import pytest

    out_dir, report = runs
    if phase not in report or not report[phase][0]:
        failed = next(p for p, (ok, _) in report.items() if not ok)
        pytest.fail(f"{failed} failed:\n{report[failed][1]}")
    return out_dir


def load_allowance() -> float:
    """How many times longer than on an idle machine a job's hang guard waits: the load average
    per core (1-minute), at least 1 and at most 8. A timeout here only tells a hang from a slow
    run: on this 2-core host at a load average of 26, test_switch's dp -> pipeline -> dp job
    took 130 s against its 60 s guard, and a fixed guard called it a hang. What a test
    measures is never scaled."""
    return min(8.0, max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))


def run_commands(argvs: Sequence[Sequence[str]], *, timeout_s: float = 60,
                 env: Optional[Dict[str, str]] = None,
                 env_per_rank: Optional[List[Dict[str, str]]] = None) -> List[RankResult]:
    """Starts argvs[r] as rank r of a job of len(argvs) processes (any program: a C++ rank too)
    and waits for all of them, at most timeout_s in total."""
    world_size = len(argvs)
    timeout_s *= load_allowance()
    port = free_port()
    procs = []
    for rank, argv in enumerate(argvs):
        extra = dict(env or {})
        extra.update((env_per_rank or [{}] * world_size)[rank])
        procs.append(subprocess.Popen(
            list(argv), env=rank_env(rank, world_size, port, extra), cwd=REPO,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout_s
    results = []
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
            results.append(RankResult(rank, proc.returncode, out, err))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            results.append(RankResult(rank, None, out, err))
    return results


def format_results(results: List[RankResult], tail_chars: int = 3000) -> str:
    """Every rank's exit code and the tail of its output, for assertion messages."""
    parts = []
    for r in results:
        code = "TIMED OUT" if r.timed_out else f"exit {r.returncode}"
        parts.append(f"--- rank {r.rank}: {code}\n{r.stdout[-tail_chars:]}"
                     f"{r.stderr[-tail_chars:]}")
    return "\n".join(parts)


def _main(argv: List[str]) -> None:
    module_name, function_name = argv[1].split(":")
    function = getattr(importlib.import_module(module_name), function_name)
    function(**json.loads(argv[2]))


if __name__ == "__main__":
    _main(sys.argv)
