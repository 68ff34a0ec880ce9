"""Peak resident memory of a rank that materialises only what it holds (a model built on the meta
device, executor/materialize.py) against one process building the whole model.

    python bench/bench_meta_memory.py                 # TinyLlama-1.1B's shape, 4 Gloo ranks
    python bench/bench_meta_memory.py --layers 2 --hidden 256 --intermediate 688 --vocab 1000

The model is transformers' LlamaForCausalLM from a config (no weights downloaded): by default
TinyLlama-1.1B's (hidden 2048, MLP 5632, 22 layers, 32 heads, 4 key-value heads, vocabulary
32000: 1.10 B parameters, 4.4 GB in float32). Runs one after another:

  whole   one process builds the model on the meta device, hybridplan.materialize()s all of it
          on the CPU and trains --steps SGD steps on the global batch: the one-rank baseline;
  zero3   4 ranks, placement dp=4 with "sharding": "zero3" (FSDP2): each rank materialises its
          1/4 shard of every tensor, --steps steps at a quarter of the global batch each;
  pipe    4 ranks, a 4-stage 1F1B pipeline balanced by parameter count, cut on the meta
          device: each rank materialises its own stage only.

Each process reports its peak resident set (getrusage ru_maxrss) and its resident set after
apply/materialise (VmRSS). Every rank runs with one intra-op thread (4 ranks share the
machine's cores); the baseline with one too. The table gives each run's largest rank against
the baseline. --json writes the figures.

--phases breaks each process's peak down: a thread samples the resident set every 2 ms and
keeps the largest per phase, the phases marked by forward pre-hooks and backward pre-hooks of
every leaf module holding parameters (an FSDP unit in zero3, a graph node in the pipeline's
stages) and by the optimizer's step hooks; the largest phases are printed per rank, and the
phases that raised the peak, each with glibc's count of the bytes in use and of those freed
but kept in its heaps (mallinfo2).

Every process runs under apply's retain_freed_memory=False policy, the baseline too
(profiler.block_timing.return_freed_memory: blocks of 1 MiB or more go back to the kernel
when freed). Under glibc's own policy a 0.11 B model's zero3 ranks kept 0.4-0.66 GiB freed in
their heaps at their peak (benchmarks/meta-memory-2026-12-06.md).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))


def config(args):
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                       intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                       num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                       max_position_embeddings=max(2048, args.seq), use_cache=False,
                       tie_word_embeddings=False)


def meta_model(args):
    import torch
    from transformers import LlamaForCausalLM
    with torch.device("meta"):
        return LlamaForCausalLM(config(args))


def batch(args, n, step):
    import torch
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, args.vocab, (n, args.seq + 1), generator=g)
    return {"input_ids": ids[:, :-1]}, ids[:, 1:]


def loss_fn(output, target):
    import torch.nn.functional as F
    return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class Phases:
    """The resident set's largest value per phase (--phases; see the module doc), with what
    glibc's malloc says at that moment (mallinfo2, over all arenas): bytes in use by the
    program (heap chunks in use + mmapped blocks) and bytes freed but kept in its heaps."""

    def __init__(self):
        import ctypes
        import threading

        class MallInfo2(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                "uordblks", "fordblks", "keepcost")]
        self.mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
        self.mallinfo2.restype = MallInfo2
        self.page = os.sysconf("SC_PAGE_SIZE")
        self.step = None
        self.entries = [["start", 0, 0, 0]]  # [phase, peak RSS, in use, kept free] in order
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def rss(self):
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * self.page

    def run(self):
        while not self.stop.wait(0.002):
            self.sample()

    def sample(self):
        value = self.rss()
        with self.lock:
            entry = self.entries[-1]
            if value > entry[1]:
                info = self.mallinfo2()
                entry[1:] = [value, info.uordblks + info.hblkhd, info.fordblks]

    def mark(self, phase):
        self.sample()
        with self.lock:
            prefix = "" if self.step is None else f"step {self.step}: "
            self.entries.append([prefix + phase, 0, 0, 0])
        self.sample()

    def hook(self, module):
        """Marks each leaf module holding parameters' forward and backward; the optimizer's
        step and zero_grad are marked by the caller."""
        for name, mod in module.named_modules():
            if any(True for _ in mod.parameters(recurse=False)) and not list(mod.children()):
                mod.register_forward_pre_hook(lambda m, a, n=name: self.mark(f"fwd {n}"))
                mod.register_full_backward_pre_hook(
                    lambda m, g, n=name: self.mark(f"bwd {n}"))

    def top(self, k=8):
        """The k largest phases, and each phase that first raised the peak by 16 MiB or more
        (in order)."""
        self.stop.set()
        self.thread.join()
        best = sorted(self.entries, key=lambda e: -e[1])[:k]
        rises, high = [], 0
        for entry in self.entries:
            if entry[1] >= high + (16 << 20):
                rises.append(entry)
            high = max(high, entry[1])
        return {"top": best, "rises": rises}


def call_order(model):
    """Llama's graph nodes in call order: the rotary embedding runs right after the token
    embedding though it is registered after the final norm."""
    from hybridplan.profiler import block_list
    names = list(block_list.select_nodes(model))
    rotary = [n for n in names if n.endswith("rotary_emb")]
    rest = [n for n in names if n not in rotary]
    return rest[:1] + rotary + rest[1:]


def pipeline_plan(model, args):
    """4 stages of near-equal parameter counts, contiguous in call order, cut between decoder
    layers (a layer's nodes are registered in another order than they run: its norms last)."""
    import hybridplan
    order = call_order(model)
    group_of = {n: ".".join(n.split(".")[:3]) if n.startswith("model.layers.") else n
                for n in order}
    groups = list(dict.fromkeys(group_of[n] for n in order))
    sizes = [sum(p.numel() for p in model.get_submodule(g).parameters()) for g in groups]
    total, seen, stage_of = sum(sizes), 0, {}
    for group, size in zip(groups, sizes):
        stage_of[group] = min(args.ranks - 1, int((seen + size / 2) * args.ranks / total))
        seen += size
    assignment = {n: stage_of[group_of[n]] for n in order}
    plan = hybridplan.hand_plan(model, mode="pipeline", dp=1, mp=args.ranks, schedule="1f1b",
                                num_microbatches=args.ranks, per_replica_batch=args.batch,
                                assignment=assignment)
    plan["assignment"] = [{"node": i, "name": n, "device": assignment[n]}
                          for i, n in enumerate(order)]
    return plan


def worker(args):
    from hybridplan.profiler import block_timing
    block_timing.return_freed_memory()  # as apply(..., retain_freed_memory=False) does
    phases = Phases() if args.phases else None
    import torch
    torch.set_num_threads(1)
    started = time.perf_counter()
    model = meta_model(args)
    if phases:
        phases.mark("import, meta model")
    params = sum(p.numel() for p in model.parameters())
    sgd = lambda p: torch.optim.SGD(p, lr=1e-4)  # noqa: E731 (no optimizer state)
    out = {"mode": args.worker, "params": params}
    if args.worker == "whole":
        import hybridplan
        if phases:
            phases.mark("materialize")
        hybridplan.materialize(model, init_seed=0)
        out["rss_after_build"] = rss_bytes()
        if phases:
            phases.hook(model)
        out["build_s"] = time.perf_counter() - started
        opt = sgd(model.parameters())
        steps = []
        for step in range(args.steps):
            t = time.perf_counter()
            if phases:
                phases.step = step
            inputs, target = batch(args, args.batch, step)
            loss = loss_fn(model(**inputs), target)
            loss.backward()
            if phases:
                phases.mark("optimizer step")
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps.append(time.perf_counter() - t)
        out.update(rank=0, loss=float(loss), step_s=steps)
    else:
        import torch.distributed as dist
        import hybridplan
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        if phases:
            phases.mark("apply")
        if args.worker == "zero3":
            plan = hybridplan.hand_plan(model, mode="placement", dp=args.ranks, mp=1,
                                        per_replica_batch=args.batch // args.ranks)
            plan["sharding"] = "zero3"
        else:
            plan = pipeline_plan(model, args)
        dp = plan["dp"]
        example = batch(args, args.batch // dp, 0)[0]
        # retain_freed_memory=False: freed blocks go back to the kernel, as in the baseline
        # process (apply's default keeps freed memory, which would count each freed transient
        # as resident)
        hp = hybridplan.apply(plan, model, loss_fn=loss_fn, optimizer=sgd, timeout_s=1800,
                              example_inputs=example, init_seed=0, retain_freed_memory=False)
        out["rss_after_build"] = rss_bytes()
        if phases:
            phases.hook(hp.module)
            hp.optimizer.register_step_pre_hook(lambda *a: phases.mark("optimizer step"))
        out["build_s"] = time.perf_counter() - started
        held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                   for p in hp.optimizer.param_groups[0]["params"])
        steps = []
        for step in range(args.steps):
            t = time.perf_counter()
            if phases:
                phases.step = step
            loss = hp.step(*hp.shard(*batch(args, args.batch, step)))
            steps.append(time.perf_counter() - t)
        out.update(rank=rank, held_params=held, loss=float(loss), step_s=steps)
        hp.close()
    out["peak_rss"] = peak_bytes()
    if phases:
        out["phases"] = phases.top()
    with open(os.path.join(args.out_dir, f"{args.worker}.rank{out['rank']}.json"), "w") as f:
        json.dump(out, f)


def launch(args, mode, world):
    from hybridplan.net import free_port
    port = free_port()
    argv = [sys.executable, os.path.abspath(__file__), "--worker", mode] + args.passthrough
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
                   PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "python"),
                                               os.environ.get("PYTHONPATH", "")]))
        log = open(os.path.join(args.out_dir, f"{mode}.rank{rank}.log"), "w")
        procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
    started = time.perf_counter()
    codes = [p.wait(timeout=args.timeout_s) for p in procs]
    if any(codes):
        tail = open(os.path.join(args.out_dir, f"{mode}.rank{codes.index(max(codes))}.log")
                    ).read()[-3000:]
        raise SystemExit(f"{mode}: ranks exited {codes}\n{tail}")
    results = []
    for rank in range(world):
        with open(os.path.join(args.out_dir, f"{mode}.rank{rank}.json")) as f:
            results.append(json.load(f))
    return results, time.perf_counter() - started


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--intermediate", type=int, default=5632)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4, help="the global batch (sequences)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--modes", default="whole,zero3", help="of whole, zero3, pipe")
    parser.add_argument("--phases", action="store_true", help="peak RSS per phase")
    parser.add_argument("--timeout-s", type=float, default=3000)
    parser.add_argument("--out-dir", default=os.path.join(ROOT, "out", "bench", "meta_memory"))
    parser.add_argument("--json", default="")
    parser.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    os.makedirs(args.out_dir, exist_ok=True)
    args.passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    runs = {}
    for mode in args.modes.split(","):
        runs[mode] = launch(args, mode, 1 if mode == "whole" else args.ranks)
    gib = 2 ** 30
    first = next(iter(runs.values()))[0][0]
    print(f"LlamaForCausalLM {first['params'] / 1e9:.3f} B parameters "
          f"({first['params'] * 4 / gib:.2f} GiB float32), layers {args.layers}, hidden "
          f"{args.hidden}, global batch {args.batch} x {args.seq} tokens, {args.steps} SGD steps")
    base = max(r["peak_rss"] for r in runs["whole"][0]) if "whole" in runs else None
    print("| run | rank | params held | RSS after build | peak RSS | of one process "
          "| build s | step s |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, (results, wall) in runs.items():
        for r in results:
            share = f"{100 * r['peak_rss'] / base:.1f} %" if base else "-"
            held = r.get("held_params", r["params"])
            print(f"| {mode} | {r['rank']} | {held / 1e6:.1f} M | "
                  f"{r['rss_after_build'] / gib:.2f} GiB | {r['peak_rss'] / gib:.2f} GiB | "
                  f"{share} | {r['build_s']:.1f} | "
                  f"{', '.join(f'{s:.1f}' for s in r['step_s'])} |")
    for mode, (results, _) in runs.items():
        for r in results:
            if "phases" not in r:
                continue
            for title in ("top", "rises"):
                print(f"{mode} rank {r['rank']}, {title} (peak RSS / malloc in use / malloc "
                      f"kept free, GiB):")
                for phase, peak, used, kept in r["phases"][title]:
                    print(f"  {peak / gib:.3f} / {used / gib:.3f} / {kept / gib:.3f}  {phase}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({m: r for m, (r, _) in runs.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
