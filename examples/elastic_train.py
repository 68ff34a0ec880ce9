"""Training that survives a lost rank: torchrun restarts the job, which re-plans for the world
size it finds and resumes from the newest complete sharded checkpoint (docs/checkpoints.md).

    # a rank killed (SIGKILL) at step 7 of the first attempt; torchrun starts every rank again
    torchrun --standalone --nproc-per-node 2 --max-restarts 2 examples/elastic_train.py \\
        --dir ckpt --steps 12 --every 3 --kill 1:7 --final final.pt
    # the same job relaunched on fewer processes: parallelize plans for 1, resumes, finishes
    torchrun --standalone --nproc-per-node 1 examples/elastic_train.py --dir ckpt --steps 12
    # the same steps in one process without hybridplan, for comparison
    python examples/elastic_train.py --reference --steps 12 --final reference.pt
    # elastic: on each machine (--dir on storage they share); a machine lost, the others go on
    # under a plan for the ranks left (bench/bench_checkpoint.py runs two agents on one host)
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 1:2 --nproc-per-node 2 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id job --max-restarts 3 \\
        examples/elastic_train.py --dir /shared/ckpt --steps 24

Every rank builds the same model (seeded) and draws the same global batch of --global-batch
samples at each step (seeded by the step), whatever the world size: the job fixes the global
batch (job={"global_batch": G}), so the plan's dp only decides each replica's share, and a job
resumed on another number of processes trains exactly the same steps. A checkpoint is saved
every --every steps (hp.save_sharded; synchronous unless --async-save), so a crash loses at
most --every - 1 steps (2 x --every - 1 with --async-save: an asynchronous checkpoint is
complete only at the next save).

What it writes under --dir:
  step-<N>/              the sharded checkpoints (the newest --keep)
  attempts.jsonl         one line per attempt, by rank 0: restart count, world size, plan,
                         the step it started from and the checkpoint it resumed
  progress/<run id>-<restart>.rank<R>.json
                         by every rank after every step: the steps it completed in this
                         attempt (a crash loses the most of these minus the next attempt's
                         start: work_lost() reads them)
  cache/                 the profiled graph (parallelize's cache: profiled once; --cache-dir)
At the end rank 0 writes the final state_dict (hp.state_dict()) to --final.
"""

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

try:
    import hybridplan
except ImportError:  # run from a source checkout without PYTHONPATH=python
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import hybridplan

IN, HIDDEN, CLASSES = 16, 32, 4


def build_model(hidden: int = HIDDEN, layers: int = 3) -> nn.Module:
    """A small MLP, the same on every call (seeded); no dropout, no batch statistics, so any
    plan trains it as one process does."""
    torch.manual_seed(0)
    widths = [IN] + [hidden] * (layers - 1)
    mods = []
    for a, b in zip(widths, widths[1:]):
        mods += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*mods, nn.Linear(widths[-1], CLASSES))


def batch(n: int, step: int):
    """The global batch of step `step`: (inputs, target), the same on every rank."""
    g = torch.Generator().manual_seed(step)
    inputs = torch.randn(n, IN, generator=g)
    target = torch.randint(0, CLASSES, (n,), generator=g)
    return inputs, target


def loss_fn(output, target):
    return F.cross_entropy(output, target)


def optimizer_factory(kind: str = "sgd", lr: float = 0.05):
    if kind == "sgd":
        return lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9)
    return lambda params: torch.optim.Adam(params, lr=lr * 0.1)


def reference_state(steps: int, global_batch: int, optimizer: str = "sgd", lr: float = 0.05,
                    hidden: int = HIDDEN, layers: int = 3):
    """The same steps in one process, without hybridplan: the state_dict after `steps`."""
    model = build_model(hidden, layers)
    opt = optimizer_factory(optimizer, lr)(model.parameters())
    for step in range(steps):
        inputs, target = batch(global_batch, step)
        opt.zero_grad()
        loss_fn(model(inputs), target).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def read_attempts(directory: str):
    """The attempts log (attempts.jsonl) as a list of dicts, oldest first."""
    path = os.path.join(directory, "attempts.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def work_lost(directory: str):
    """[(attempt, steps completed, the next attempt's start, steps redone)] for each attempt
    that another followed: the most steps any of its ranks completed (progress/) minus the
    step the next attempt resumed from."""
    attempts = read_attempts(directory)
    lost = []
    for i, (a, b) in enumerate(zip(attempts, attempts[1:])):
        prefix = f"{a['attempt']}.rank"
        folder = os.path.join(directory, "progress")
        done = [json.load(open(os.path.join(folder, n), encoding="utf-8"))["completed"]
                for n in os.listdir(folder) if n.startswith(prefix) and n.endswith(".json")]
        reached = max(done) if done else a["started_from"]
        lost.append((i, reached, b["started_from"], reached - b["started_from"]))
    return lost


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", help="checkpoint directory (checkpoints, attempts.jsonl, cache)")
    p.add_argument("--steps", type=int, default=12, help="optimizer steps in all")
    p.add_argument("--every", type=int, default=3, help="save a checkpoint every N steps")
    p.add_argument("--keep", type=int, default=2, help="checkpoints kept")
    p.add_argument("--async-save", action="store_true", help="asynchronous saves")
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=HIDDEN)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--modes", default="placement,pipeline",
                   help="plan modes parallelize searches (comma-separated)")
    p.add_argument("--kill", metavar="RANK:STEP",
                   help="SIGKILL rank RANK when it is about to take step STEP (0-based), on "
                        "the first attempt only (TORCHELASTIC_RESTART_COUNT == 0)")
    p.add_argument("--step-sleep-s", type=float, default=0.0,
                   help="sleep after each step (a slower job, to be killed from outside)")
    p.add_argument("--cache-dir", help="parallelize's graph cache (default: DIR/cache)")
    p.add_argument("--timeout-s", type=float, default=60.0, help="apply's timeout")
    p.add_argument("--final", help="rank 0 writes the final state_dict here (torch.save)")
    p.add_argument("--reference", action="store_true",
                   help="train the same steps in one process without hybridplan (--final)")
    return p.parse_args(argv)


def _append_line(path: str, record: dict) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _write_progress(path: str, record: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(tmp, path)


def train(args) -> int:
    from hybridplan.front_door import describe

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    kill_rank, kill_step = (None, None)
    if args.kill:
        kill_rank, kill_step = (int(x) for x in args.kill.split(":"))
    os.makedirs(args.dir, exist_ok=True)
    started = time.time()
    model = build_model(args.hidden, args.layers)
    G = args.global_batch
    example, target = batch(G, 0)  # one replica's batch (cut to the plan's share by parallelize)
    hp = hybridplan.parallelize(
        model, example, example_target=target, loss_fn=loss_fn,
        optimizer=optimizer_factory(args.optimizer, args.lr),
        job={"global_batch": G}, cluster="localhost-cpu",
        cache_dir=args.cache_dir or os.path.join(args.dir, "cache"), modes=tuple(args.modes.split(",")),
        timeout_s=args.timeout_s, checkpoint_dir=args.dir, resume_from="latest")
    rank, world = hp.rank, torch.distributed.get_world_size()
    start = hp.step_count
    # torchrun's run id (a new one per launch with --standalone) and its restart count
    attempt = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}-{restart}"
    progress = os.path.join(args.dir, "progress", f"{attempt}.rank{rank}.json")
    os.makedirs(os.path.dirname(progress), exist_ok=True)
    _write_progress(progress, {"completed": start, "started_from": start})
    if rank == 0:
        _append_line(os.path.join(args.dir, "attempts.jsonl"), {
            "attempt": attempt, "restart": restart, "world_size": world,
            "plan": describe(hp.parallelized.plan),
            "started_from": start, "resumed_from": hp.resumed_from,
            "resumed_extra": hp.resumed_extra, "setup_s": round(time.time() - started, 3),
            "time": time.time()})
    for step in range(start, args.steps):
        if restart == 0 and rank == kill_rank and step == kill_step:
            print(f"elastic_train: rank {rank} kills itself (SIGKILL) at step {step}",
                  file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        hp.step(*hp.shard(*batch(G, step)))
        _write_progress(progress, {"completed": hp.step_count, "started_from": start})
        if hp.step_count % args.every == 0 and hp.step_count < args.steps:
            hp.save_sharded(async_save=args.async_save, keep=args.keep,
                            extra={"next_step": hp.step_count})
        if args.step_sleep_s:
            time.sleep(args.step_sleep_s)
    hp.wait_checkpoint()
    state = hp.state_dict()
    if rank == 0:
        if args.final:
            torch.save(state, args.final)
        print(f"elastic_train: finished {args.steps} steps on {world} ranks (restart "
              f"{restart}, started from step {start})", file=sys.stderr, flush=True)
    hp.close()
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.reference:
        torch.set_num_threads(1)
        state = reference_state(args.steps, args.global_batch, args.optimizer, args.lr,
                                args.hidden, args.layers)
        if args.final:
            torch.save(state, args.final)
        return 0
    if not args.dir:
        raise SystemExit("elastic_train: --dir is required (except with --reference)")
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
