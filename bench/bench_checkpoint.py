"""Checkpoints at scale and lost ranks (docs/checkpoints.md "Measured"); not a timed test:

  1. size: a model of >= 100M parameters (--layers Linear(--width, --width): 6 x 4096 is
     100.7M) trained with Adam (state 2x the parameters) on 2 and 4 ranks under a data-parallel
     plan and a sharded one (zero3: FSDP2): the sharded save (hp.save_sharded: DCP, every rank
     its part, manifest) against the consolidated file (hp.save_checkpoint: rank 0 gathers and
     writes), time and bytes; loading each (apply(resume_from=...), against apply without);
     and what a save costs the training: a synchronous save holds it for the whole save, an
     asynchronous one for hp.last_save_stall_s (the copy to CPU memory), then the steps run
     while a thread writes (their time against the steps before) until the checkpoint is
     completed (hp.wait_checkpoint()).
  2. trials: --trials runs of examples/elastic_train.py on --trial-ranks ranks under torchrun
     --max-restarts 2, a random rank killed with SIGKILL at a random step (seeded): how many
     finish, whether the final weights equal one-process training (rtol 1e-5, atol 1e-6), the
     most steps redone against the checkpoint interval.
  3. elastic: two torchrun agents on this machine (--nnodes 1:2, c10d rendezvous), 2 ranks
     each; one agent and its ranks killed mid-run (a lost machine): the other re-rendezvouses
     alone, parallelize plans for 2 ranks, resumes and finishes; the time from the kill to the
     resumed training, and the final weights against uninterrupted training.

Writes out/bench/checkpoint/{size,trials,elastic}.json (--out-dir) and prints markdown tables.
Checkpoint files go to a temporary folder (--work-dir), removed at the end.

    python bench/bench_checkpoint.py [--quick] [--only size trials elastic]
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import importlib.util
import json
import os
import platform
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
EXAMPLE = os.path.join(ROOT, "examples", "elastic_train.py")


def _example():
    spec = importlib.util.spec_from_file_location("elastic_train_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env(**extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(p for p in (os.path.join(ROOT, "python"),
                                                      os.environ.get("PYTHONPATH", "")) if p))
    env.update(extra)
    return env


def _launcher():
    return ([shutil.which("torchrun")] if shutil.which("torchrun")
            else [sys.executable, "-m", "torch.distributed.run"])


def _tree_bytes(path):
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


# ---- 1. size: one configuration, on every rank (under torchrun) ------------------------------

def _mem_available():
    """MemAvailable in bytes (/proc/meminfo), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def big_model(width, layers):
    from torch import nn
    torch.manual_seed(0)
    mods = []
    for i in range(layers):
        mods.append(nn.Linear(width, width))
        if i < layers - 1:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods)


def size_worker(args):
    """One (world, plan): saves and loads, timings the slowest rank's (rank 0 writes them)."""
    import torch.distributed as dist
    import torch.nn.functional as F

    import hybridplan

    torch.set_num_threads(1)
    # the default group is this script's, so that it outlives the AppliedPlans (apply, close,
    # apply again) and the timings can take the slowest rank's
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=1800))
    rank, world = dist.get_rank(), dist.get_world_size()
    sharded_dir = os.path.join(args.work_dir, "sharded")
    consolidated = os.path.join(args.work_dir, "consolidated.pt")
    optimizer = functools.partial(torch.optim.Adam, lr=1e-4)

    def loss_fn(output, target):
        return F.mse_loss(output, target)

    def batch(step):
        g = torch.Generator().manual_seed(step)
        n = world * args.batch
        return (torch.randn(n, args.width, generator=g), torch.randn(n, args.width, generator=g))

    def slowest(seconds):
        t = torch.tensor([float(seconds)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def timed(fn):
        dist.barrier()
        started = time.perf_counter()
        value = fn()
        elapsed = time.perf_counter() - started
        dist.barrier()
        return slowest(elapsed), value

    def steps(hp, n, first):
        times = []
        for i in range(n):
            started = time.perf_counter()
            hp.step(*hp.shard(*batch(first + i)))
            times.append(time.perf_counter() - started)
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def plan_for(model):
        plan = hybridplan.hand_plan(model, mode="placement", dp=world, mp=1,
                                    per_replica_batch=args.batch)
        return plan if args.plan == "dp" else dict(plan, sharding=args.plan)

    def applied(**kw):
        model = big_model(args.width, args.layers)
        plan = plan_for(model)
        seconds, hp = timed(lambda: hybridplan.apply(plan, model, loss_fn=loss_fn,
                                                     optimizer=optimizer, timeout_s=1800,
                                                     checkpoint_dir=sharded_dir, **kw))
        return seconds, hp

    def peak_mib(phase):
        """The job's peak resident memory so far: every rank's ru_maxrss, summed."""
        t = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0],
                         dtype=torch.float64)
        dist.all_reduce(t)
        r.setdefault("peak_rss_mib", {})[phase] = round(float(t.item()))

    r = {"world": world, "plan": args.plan, "width": args.width, "layers": args.layers,
         "batch_per_replica": args.batch,
         "params": args.layers * (args.width * args.width + args.width)}
    state_bytes = 3 * 4 * r["params"]  # fp32 parameters and Adam's two moments
    _, hp = applied()  # cold: the first apply pays lazy imports; apply_s is measured later
    steps(hp, 2, 0)  # the optimizer's state exists from here
    peak_mib("training")
    K = args.steps_around
    # synchronous sharded save: the training waits for all of it
    r["save_sharded_s"], path = timed(lambda: hp.save_sharded(keep=1))
    r["sharded_bytes"] = _tree_bytes(path) if rank == 0 else None
    r["sharded_files"] = len(os.listdir(path)) if rank == 0 else None
    peak_mib("sharded save")
    # the consolidated file: rank 0 gathers every part (gather_object pads each rank's to the
    # largest, rank 0 receives world of them) and writes; skipped where memory cannot hold it
    need = (2 * world + 3) * state_bytes + (world * state_bytes if args.plan != "dp" else 0)
    available = _mem_available()
    flag = torch.tensor([1 if available is None or available > need * 1.15 else 0])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    if flag.item():
        r["save_consolidated_s"], _ = timed(lambda: hp.save_checkpoint(consolidated))
        r["consolidated_bytes"] = os.path.getsize(consolidated) if rank == 0 else None
        peak_mib("consolidated save")
    else:
        r["consolidated_skipped"] = (f"needs ~{need / 2**30:.1f} GiB more memory, "
                                     f"{available / 2**30:.1f} GiB available")
    # asynchronous sharded save: the stall, the steps while the thread writes, the completion
    first = hp.step_count
    before = steps(hp, K, first)
    r["async_call_s"], _ = timed(lambda: hp.save_sharded(async_save=True, keep=1))
    r["async_stall_s"] = slowest(hp.last_save_stall_s)
    saved_step = hp.step_count
    during = steps(hp, K, first + K)
    pending = getattr(hp, "_pending_save", None)
    done = torch.tensor([1 if pending is None or pending.done.is_set() else 0])
    dist.all_reduce(done, op=dist.ReduceOp.MIN)
    r["async_write_done_within_steps"] = bool(done.item())
    r["async_wait_s"], _ = timed(hp.wait_checkpoint)
    peak_mib("asynchronous save")
    r["steps_before_s"], r["steps_during_async_s"] = before, during
    r["step_s"] = statistics.median(before)
    r["async_step_s"] = statistics.median(during)
    hp.close()
    hp = None
    gc.collect()
    # loading: apply(resume_from=...) of each, against apply alone (warm: imports done)
    r["apply_s"], hp = applied()
    hp.close()
    hp = None
    gc.collect()
    r["load_sharded_s"], hp = applied(resume_from=sharded_dir)
    assert hp.step_count == saved_step, (hp.step_count, saved_step)
    hp.close()
    hp = None
    gc.collect()
    peak_mib("load sharded")
    if os.path.exists(consolidated):
        r["load_consolidated_s"], hp = applied(resume_from=consolidated)
        hp.close()
        hp = None
        gc.collect()
        peak_mib("load consolidated")
    if rank == 0:
        with open(args.result, "w") as f:
            json.dump(r, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


def run_size(args, work):
    rows = []
    for world in args.worlds:
        for plan in args.plans:
            folder = os.path.join(work, f"size-{world}-{plan}")
            os.makedirs(folder, exist_ok=True)
            result = os.path.join(folder, "result.json")
            cmd = _launcher() + ["--standalone", "--nproc-per-node", str(world), __file__,
                                 "--size-worker", "--plan-kind", plan, "--width",
                                 str(args.width), "--layers", str(args.layers), "--batch",
                                 str(args.batch), "--steps-around", str(args.steps_around),
                                 "--work-dir", folder, "--result", result]
            print(f"bench_checkpoint: size, {world} ranks, {plan} ...", flush=True)
            started = time.monotonic()
            done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                                  timeout=args.size_timeout_s)
            if done.returncode != 0 or not os.path.exists(result):
                text = (done.stdout + done.stderr)[-3000:]
                print(f"bench_checkpoint: size {world} {plan} failed (exit {done.returncode})"
                      f":\n{text}", flush=True)
                rows.append({"world": world, "plan": plan, "error": text})
            else:
                with open(result) as f:
                    rows.append(json.load(f))
                print(f"  done in {time.monotonic() - started:.0f} s", flush=True)
            shutil.rmtree(folder, ignore_errors=True)
    return rows


def size_tables(rows):
    ok = [r for r in rows if "error" not in r]
    mb = 1 / 2**20
    t1 = ["| ranks | plan | parameters | sharded save s | sharded MiB (files) | "
          "consolidated save s | consolidated MiB | load sharded s | load consolidated s | "
          "apply alone s | peak RSS of all ranks GiB: training / after the consolidated save |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in ok:
        peak = r["peak_rss_mib"]
        skipped = "consolidated_skipped" in r
        save_c = "skipped*" if skipped else f"{r['save_consolidated_s']:.2f}"
        bytes_c = "-" if skipped else f"{r['consolidated_bytes'] * mb:.0f}"
        load_c = "-" if skipped else f"{r['load_consolidated_s']:.2f}"
        after = "-" if skipped else f"{peak['consolidated save'] / 1024:.1f}"
        t1.append(f"| {r['world']} | {r['plan']} | {r['params'] / 1e6:.1f}M | "
                  f"{r['save_sharded_s']:.2f} | {r['sharded_bytes'] * mb:.0f} "
                  f"({r['sharded_files']}) | {save_c} | {bytes_c} | {r['load_sharded_s']:.2f} "
                  f"| {load_c} | {r['apply_s']:.2f} | {peak['training'] / 1024:.1f} / {after} |")
    notes = [f"\\* {r['world']} ranks {r['plan']}: the consolidated save was skipped: "
             f"{r['consolidated_skipped']}" for r in ok if "consolidated_skipped" in r]
    t2 = ["| ranks | plan | step s (median of K before) | synchronous save: stall s | "
          "asynchronous save: stall s | the K steps after it: first / median s | write done "
          "within them | completion wait s |", "|---|---|---|---|---|---|---|---|"]
    for r in ok:
        during = r["steps_during_async_s"]
        t2.append(f"| {r['world']} | {r['plan']} | {r['step_s']:.2f} | "
                  f"{r['save_sharded_s']:.2f} | {r['async_stall_s']:.2f} | "
                  f"{during[0]:.2f} / {r['async_step_s']:.2f} (K={len(during)}) | "
                  f"{'yes' if r['async_write_done_within_steps'] else 'no'} | "
                  f"{r['async_wait_s']:.2f} |")
    failed = [f"- {r['world']} ranks {r['plan']}: failed" for r in rows if "error" in r]
    return ("\n".join(t1) + ("\n\n" + "\n\n".join(notes) if notes else ""),
            "\n".join(t2 + ([""] + failed if failed else [])))


# ---- 2. trials: a random rank killed at a random step ----------------------------------------

def _states_equal(path, expected):
    if not os.path.exists(path):
        return False
    got = torch.load(path)
    if list(got) != list(expected):
        return False
    try:
        for k, v in expected.items():
            torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-6)
    except AssertionError:
        return False
    return True


def run_trials(args, work):
    example = _example()
    rng = random.Random(args.seed)
    expected = example.reference_state(args.trial_steps, args.trial_batch)
    cache = os.path.join(work, "trials-cache")
    rows = []
    for i in range(args.trials):
        kill_rank = rng.randrange(args.trial_ranks)
        kill_step = rng.randrange(1, args.trial_steps)
        folder = os.path.join(work, f"trial-{i}")
        final = os.path.join(folder, "final.pt")
        cmd = _launcher() + ["--standalone", "--nproc-per-node", str(args.trial_ranks),
                             "--max-restarts", "2", "--monitor-interval", "0.1", EXAMPLE,
                             "--dir", os.path.join(folder, "ckpt"), "--cache-dir", cache,
                             "--steps", str(args.trial_steps), "--every", str(args.every),
                             "--global-batch", str(args.trial_batch), "--kill",
                             f"{kill_rank}:{kill_step}", "--final", final]
        started = time.monotonic()
        try:
            done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                                  timeout=args.trial_timeout_s, start_new_session=True)
            rc, text = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as e:
            rc, text = "timeout", str(e.stdout or "")
        wall = time.monotonic() - started
        ckpt = os.path.join(folder, "ckpt")
        attempts = example.read_attempts(ckpt) if os.path.isdir(ckpt) else []
        lost = example.work_lost(ckpt) if len(attempts) > 1 else []
        row = {"trial": i, "kill_rank": kill_rank, "kill_step": kill_step, "exit": rc,
               "finished": rc == 0, "equal": rc == 0 and _states_equal(final, expected),
               "attempts": len(attempts), "plans": [a["plan"] for a in attempts],
               "resumed_from": attempts[1]["started_from"] if len(attempts) > 1 else None,
               "steps_redone": max((x[3] for x in lost), default=None),
               "wall_s": round(wall, 2)}
        if rc != 0:
            row["output_tail"] = text[-3000:]
        rows.append(row)
        print(f"  trial {i}: rank {kill_rank} killed at step {kill_step}: exit {rc}, "
              f"equal {row['equal']}, resumed from {row['resumed_from']}, "
              f"redone {row['steps_redone']}, {wall:.1f} s", flush=True)
        shutil.rmtree(folder, ignore_errors=True)
    return {"ranks": args.trial_ranks, "steps": args.trial_steps, "every": args.every,
            "global_batch": args.trial_batch, "seed": args.seed, "trials": rows}


def trials_tables(result):
    rows = result["trials"]
    t1 = ["| trial | killed rank | at step | exit | attempts | resumed from | steps redone | "
          "final = uninterrupted | wall s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t1.append(f"| {r['trial']} | {r['kill_rank']} | {r['kill_step']} | {r['exit']} | "
                  f"{r['attempts']} | {r['resumed_from']} | {r['steps_redone']} | "
                  f"{'yes' if r['equal'] else 'no'} | {r['wall_s']:.1f} |")
    redone = [r["steps_redone"] for r in rows if r["steps_redone"] is not None]
    plans = sorted({p for r in rows for p in r["plans"]})
    t2 = ["| ranks | trials | finished | final = uninterrupted | max steps redone | "
          "checkpoint interval | median wall s | plans |", "|---|---|---|---|---|---|---|---|",
          f"| {result['ranks']} | {len(rows)} | {sum(r['finished'] for r in rows)} | "
          f"{sum(r['equal'] for r in rows)} | {max(redone) if redone else '-'} | "
          f"{result['every']} | "
          f"{statistics.median(r['wall_s'] for r in rows) if rows else 0:.1f} | "
          f"{'; '.join(plans)} |"]
    return "\n".join(t2), "\n".join(t1)


# ---- 3. elastic: two agents, one lost ----------------------------------------------------------

def _descendants(pid):
    """pid and every process below it (/proc): torchrun's workers have sessions of their own."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def _progress(ckpt):
    best = 0
    folder = os.path.join(ckpt, "progress")
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        try:
            with open(os.path.join(folder, name)) as f:
                best = max(best, json.load(f)["completed"])
        except (OSError, ValueError, KeyError):
            pass
    return best


def run_elastic(args, work):
    from hybridplan.net import free_port

    example = _example()
    folder = os.path.join(work, "elastic")
    ckpt, final = os.path.join(folder, "ckpt"), os.path.join(folder, "final.pt")
    os.makedirs(folder, exist_ok=True)
    port = free_port()
    steps, kill_at = args.elastic_steps, args.elastic_kill_at
    # last_call: how long a round that has MIN agents waits for more (both must make the first
    # round; the round after the loss waits this long too); keep-alive: a lost agent is
    # declared dead after interval x attempts
    conf = (f"last_call_timeout={args.elastic_last_call_s},join_timeout=120,close_timeout=5,"
            f"keep_alive_interval=1,keep_alive_max_attempt=2")
    # the agents' store per attempt (as `python -m hybridplan run` does for --nnodes MIN:MAX)
    env = _env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")

    def agent(name):
        cmd = _launcher() + ["--nnodes", "1:2", "--nproc-per-node", str(args.elastic_per_node),
                             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                             "--rdzv-id", "bench-elastic", "--rdzv-conf", conf,
                             "--max-restarts", "3", "--monitor-interval", "0.1", EXAMPLE,
                             "--dir", ckpt, "--steps", str(steps), "--every", str(args.every),
                             "--global-batch", str(args.trial_batch), "--final", final,
                             "--step-sleep-s", "0.1"]
        log = open(os.path.join(folder, f"{name}.log"), "w")
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True), log

    started = time.time()
    a, a_log = agent("A")  # the first: it hosts the rendezvous
    time.sleep(0.5)
    b, b_log = agent("B")
    result = {"ranks_per_agent": args.elastic_per_node, "steps": steps, "every": args.every,
              "kill_at_step": kill_at, "global_batch": args.trial_batch}
    while _progress(ckpt) < kill_at and time.time() - started < args.elastic_timeout_s:
        if a.poll() is not None or b.poll() is not None:
            break
        time.sleep(0.05)
    killed_at = time.time()
    result["killed_after_step"] = _progress(ckpt)
    for pid in _descendants(b.pid):  # agent B and its ranks: a lost machine
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    b.wait()
    try:
        rc = a.wait(timeout=max(10.0, args.elastic_timeout_s - (time.time() - started)))
    except subprocess.TimeoutExpired:
        for pid in _descendants(a.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        a.wait()
        rc = "timeout"
    a_log.close()
    b_log.close()
    attempts = example.read_attempts(ckpt)
    expected = example.reference_state(steps, args.trial_batch)
    result.update(exit=rc, wall_s=round(time.time() - started, 2), attempts=attempts,
                  equal=rc == 0 and _states_equal(final, expected),
                  last_call_timeout_s=args.elastic_last_call_s,
                  world_sizes=[a["world_size"] for a in attempts])
    # shown as it happened: both agents in the first round, the survivor alone after
    result["shrank"] = result["world_sizes"] == [2 * args.elastic_per_node,
                                                 args.elastic_per_node]
    if len(attempts) > 1:
        nxt = attempts[-1]
        result["kill_to_new_attempt_s"] = round(nxt["time"] - nxt["setup_s"] - killed_at, 2)
        result["kill_to_training_s"] = round(nxt["time"] - killed_at, 2)
        result["steps_redone"] = max(x[3] for x in example.work_lost(ckpt))
    if rc != 0:
        with open(os.path.join(folder, "A.log")) as f:
            result["output_tail"] = f.read()[-4000:]
    shutil.rmtree(folder, ignore_errors=True)
    return result


def elastic_table(r):
    worlds = " -> ".join(str(a["world_size"]) for a in r["attempts"]) or "-"
    plans = " -> ".join(a["plan"] for a in r["attempts"]) or "-"
    return "\n".join([
        "| agents x ranks | world | plans | killed after step | resumed from | steps redone | "
        "kill -> new attempt s | kill -> training s | exit | final = uninterrupted |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| 2 x {r['ranks_per_agent']} | {worlds} | {plans} | {r['killed_after_step']} | "
        f"{r['attempts'][-1]['started_from'] if len(r['attempts']) > 1 else '-'} | "
        f"{r.get('steps_redone', '-')} | {r.get('kill_to_new_attempt_s', '-')} | "
        f"{r.get('kill_to_training_s', '-')} | {r['exit']} | "
        f"{'yes' if r['equal'] else 'no'} |"])


# ---- the driver --------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smallest sizes: a 2-layer 512-wide model on 2 ranks, 2 trials on 2 "
                        "ranks, no elastic run (a smoke run, not a measurement)")
    p.add_argument("--only", nargs="+", choices=["size", "trials", "elastic"],
                   default=["size", "trials", "elastic"])
    p.add_argument("--report", action="store_true",
                   help="print the tables of the results already in --out-dir (runs nothing)")
    p.add_argument("--out-dir", default=os.path.join(ROOT, "out", "bench", "checkpoint"))
    p.add_argument("--work-dir", help="where checkpoints are written (default: a temporary "
                                      "folder, removed at the end)")
    p.add_argument("--worlds", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4])
    p.add_argument("--plans", type=lambda s: s.split(","), default=["dp", "zero3"])
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--batch", type=int, default=4, help="samples per replica (size runs)")
    p.add_argument("--steps-around", type=int, default=4,
                   help="steps timed before and while an asynchronous save writes")
    p.add_argument("--size-timeout-s", type=float, default=600)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--trial-ranks", type=int, default=4)
    p.add_argument("--trial-steps", type=int, default=12)
    p.add_argument("--trial-batch", type=int, default=16, help="the trials' global batch")
    p.add_argument("--every", type=int, default=3, help="checkpoint interval (steps)")
    p.add_argument("--trial-timeout-s", type=float, default=120)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--elastic-per-node", type=int, default=2)
    p.add_argument("--elastic-steps", type=int, default=24)
    p.add_argument("--elastic-kill-at", type=int, default=10)
    p.add_argument("--elastic-timeout-s", type=float, default=240)
    p.add_argument("--elastic-last-call-s", type=int, default=5)
    # one size configuration on this rank (under torchrun; the driver starts it)
    p.add_argument("--size-worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--plan-kind", default="dp", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.worlds, args.width, args.layers = [2], 512, 2
        args.trials, args.trial_ranks, args.trial_steps, args.trial_batch = 2, 2, 6, 8
        args.steps_around = 2
        if "elastic" in args.only:
            args.only = [x for x in args.only if x != "elastic"]
    return args


def report(args) -> int:
    """The tables of --out-dir's JSON files, as a full run prints them."""
    sections = []
    path = os.path.join(args.out_dir, "size.json")
    if os.path.exists(path):
        with open(path) as f:
            size = json.load(f)
        t1, t2 = size_tables(size["rows"])
        sections += [f"size: {size['when']}", t1, t2]
    path = os.path.join(args.out_dir, "trials.json")
    if os.path.exists(path):
        with open(path) as f:
            trials = json.load(f)
        sections += [f"trials: {trials['when']}", *trials_tables(trials)]
    path = os.path.join(args.out_dir, "elastic.json")
    if os.path.exists(path):
        with open(path) as f:
            elastic = json.load(f)
        sections += [f"elastic: {elastic['when']}", elastic_table(elastic)]
    print("\n\n".join(sections))
    return 0 if sections else 1


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.size_worker:
        args.plan = args.plan_kind
        size_worker(args)
        return 0
    if args.report:
        return report(args)
    os.makedirs(args.out_dir, exist_ok=True)
    work = args.work_dir or tempfile.mkdtemp(prefix="bench_checkpoint-")
    os.makedirs(work, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (f"bench_checkpoint: {stamp}, {platform.node()}, {os.cpu_count()} CPUs, torch "
              f"{torch.__version__}, Gloo on CPU{' (--quick: not a measurement)' if args.quick else ''}")
    print(header, flush=True)
    sections, failed = [], False
    try:
        if "size" in args.only:
            rows = run_size(args, work)
            with open(os.path.join(args.out_dir, "size.json"), "w") as f:
                json.dump({"when": stamp, "rows": rows}, f, indent=1)
            t1, t2 = size_tables(rows)
            sections += ["### Save and load (Adam; sharded = DCP, consolidated = one file)",
                         t1, "### What a save costs the training", t2]
            failed |= any("error" in r for r in rows)
        if "trials" in args.only:
            print(f"bench_checkpoint: {args.trials} trials, {args.trial_ranks} ranks ...",
                  flush=True)
            result = run_trials(args, work)
            with open(os.path.join(args.out_dir, "trials.json"), "w") as f:
                json.dump(dict(result, when=stamp), f, indent=1)
            summary, per_trial = trials_tables(result)
            sections += [f"### A random rank killed (SIGKILL) at a random step, torchrun "
                         f"--max-restarts 2 (seed {args.seed})", summary, "", per_trial]
            failed |= not all(r["equal"] for r in result["trials"])
        if "elastic" in args.only:
            print("bench_checkpoint: elastic, 2 agents ...", flush=True)
            result = run_elastic(args, work)
            with open(os.path.join(args.out_dir, "elastic.json"), "w") as f:
                json.dump(dict(result, when=stamp), f, indent=1)
            sections += ["### A lost agent: torchrun --nnodes 1:2 (c10d), two agents on this "
                         "machine", elastic_table(result)]
            failed |= not (result["equal"] and result["shrank"])
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    print("\n" + header + "\n\n" + "\n\n".join(sections) + "\n", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
