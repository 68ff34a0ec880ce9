"""Launches a one-step 2-rank Gloo job N times and reports each rank's exit status: the check
that a job ends with exit 0 every time (test_reliability.py).

    python tests/python/exit_launches.py --launches 20 [--model gpt2|tiny] [--plain-ddp]
                                         [--sharding none|zero2|zero3]

Each launch forks two rank processes from this one, which has imported torch, transformers and
hybridplan once (a fresh interpreter per rank costs seconds on a loaded 2-core machine); each
rank sets the env:// variables torchrun would set, trains one step and then leaves the way a
script does: it returns to the top level and the interpreter finalizes normally (atexit
handlers, garbage collection, C++ static destructors), which is where the abort happened. Even
launches close the AppliedPlan with `with`, odd ones rely on apply()'s atexit handler.
--plain-ddp runs torch DDP instead of apply (the baseline of the issue); --sharding sets the
plan's "sharding" (FSDP2 in place of DDP). Prints one line per
launch and a summary; exits 1 unless every rank exited 0.
"""

import argparse
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(os.path.dirname(os.path.dirname(HERE)), "python"), HERE]

import torch  # noqa: E402  (imported once, before the forks)
import torch._dynamo  # noqa: E402,F401  (DistributedDataParallel's first use imports it: seconds)
import torch.distributed as dist  # noqa: E402

import hybridplan  # noqa: E402,F401
from hybridplan.net import free_port  # noqa: E402


def job(model_name, plain_ddp, use_with, sharding="none"):
    torch.set_num_threads(1)
    if model_name == "gpt2":
        from user_models import gpt2
        model, batch, loss_fn = gpt2()
        inputs, target = batch(4, 0)
    else:
        from test_reliability import tiny_batch, tiny_model
        model, loss_fn = tiny_model(), torch.nn.functional.cross_entropy
        inputs, target = tiny_batch(0)
    if plain_ddp:
        dist.init_process_group("gloo")
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        share = {k: v.tensor_split(2)[dist.get_rank()] for k, v in inputs.items()} \
            if isinstance(inputs, dict) else inputs.tensor_split(2)[dist.get_rank()]
        out = ddp(**share) if isinstance(share, dict) else ddp(share)
        loss_fn(out, target.tensor_split(2)[dist.get_rank()]).backward()
        dist.destroy_process_group()
        return
    from plan_builders import placement_plan
    plan = placement_plan(model, dp=2, mp=1, per_replica_batch=2)
    if sharding != "none":
        plan["sharding"] = sharding
    hp = hybridplan.apply(plan, model, loss_fn=loss_fn, timeout_s=30)
    if use_with:
        with hp:
            hp.step(*hp.shard(inputs, target))
    else:
        hp.step(*hp.shard(inputs, target))


def launch(args, index):
    port = free_port()
    pids = []
    for rank in range(2):
        pid = os.fork()
        if pid == 0:  # the rank: run the job, then finalize like a script that ends
            os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
            code = 0
            try:
                job(args.model, args.plain_ddp, use_with=index % 2 == 0, sharding=args.sharding)
            except BaseException as e:  # noqa: BLE001 - reported through the exit code
                print(f"rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                code = 1
            raise SystemExit(code)
        pids.append(pid)
    deadline = time.monotonic() + args.timeout_s
    codes = {}
    while len(codes) < 2:
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if len(codes) < 2 and time.monotonic() > deadline:
            for pid in pids:
                if pid not in codes:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    codes[pid] = "timed out"
        time.sleep(0.02)
    return [codes[p] for p in pids]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=20)
    parser.add_argument("--model", choices=("gpt2", "tiny"), default="gpt2")
    parser.add_argument("--plain-ddp", action="store_true")
    parser.add_argument("--sharding", choices=("none", "zero2", "zero3"), default="none")
    parser.add_argument("--timeout-s", type=float, default=60)
    args = parser.parse_args()
    if args.model == "gpt2":  # import the model's code once, here, not in every rank
        import transformers.models.gpt2.modeling_gpt2  # noqa: F401
    start, failed = time.monotonic(), 0
    for i in range(args.launches):
        codes = launch(args, i)
        failed += any(c != 0 for c in codes)
        print(f"launch {i + 1}: exit codes {codes}", flush=True)
    print(f"{args.launches - failed}/{args.launches} launches exited 0 "
          f"({time.monotonic() - start:.1f} s)", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
