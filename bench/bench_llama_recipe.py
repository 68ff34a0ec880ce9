"""The training step people expect, end to end: a Llama built from a Hugging Face config
(transformers' LlamaForCausalLM, no weights downloaded; a vocabulary of 1,003 and widths 8 does
not divide) trained under the plan hybridplan.parallelize chooses, in bf16, with gradient
accumulation (the plan's accumulation_steps), clipping by the global norm at 1.0 and a warm-up
plus cosine schedule (hybridplan.warmup_cosine) — beside one process trained in the same
setting: the same policy (the plan's: torch.autocast, or FSDP2's MixedPrecisionPolicy for a
sharded placement plan), seed, global batch, schedule and clipping, with plain torch
(clip_grad_norm_, the scheduler stepped after the optimizer, no accumulation).

    python bench/bench_llama_recipe.py [--steps 50] [--nproc 4] [--sharding zero3]

launches `torchrun --standalone --nproc-per-node N` on this script (OMP_NUM_THREADS=1), then
trains the one-process reference and prints, per step, the loss on the global batch under the
plan (the mean of the ranks' replica losses), the reference's, their |difference| and the
tolerance, 4u x the reference's loss (u = 2^-8, bf16's unit roundoff; docs/training_step.md
"Precision" derives it). It exits 1 where a step's loss is outside it, a clipped norm differs
from torch's clip_grad_norm_'s by more than 4u relative, a learning rate differs, the ranks
disagree, or the ranks saved no bfloat16 tensor for backward (the plan did not compute in
bf16). The trained parameters' largest difference is printed, not bounded: AdamW moves an
element whose gradient lies within bf16's rounding of zero by about lr either way.

Then the planner's choice for the same graph (profiled by rank 0 in that run) and cluster on N
devices (front_door.choose_plan: what parallelize picks), for the job without the new axes
(fp32, "accumulation_steps": 1), with them (bf16, accumulation searched), and on devices whose
memory binds (`--no-planner` skips it).

The cluster: localhost-cpu with device.compute_speedup measured on this model in this process
(measure.calibration.compute_speedup, one thread), which a bf16 job on a float32 graph needs;
`--speedup X` gives the figure instead.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(REPO, "python")]

VOCAB, SEQ, HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS = 1003, 24, 36, 92, 3, 3, 1
# initializer_range 0.2 (Llama's default 0.02) and lr 1e-2: the global norm starts at 1.65 and
# stays near 1, so clipping at 1.0 scales most of the steps, and the loss falls from 7.7 to
# about 2.9 in 50 steps
INIT, LR, WEIGHT_DECAY, MAX_NORM = 0.2, 1e-2, 0.1, 1.0
GLOBAL_BATCH, ACCUMULATION = 32, 2
U = 2.0 ** -8                  # bf16's unit roundoff (8 significant bits)
TOLERANCE = 4 * U              # relative: of the loss, and of the update's size


def build_model():
    """The Llama, seeded: every rank and the reference build the same weights. No dropout, so
    that any plan trains as one process does."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        max_position_embeddings=SEQ, use_cache=False, attention_dropout=0.0, pad_token_id=0,
        bos_token_id=0, eos_token_id=0, tie_word_embeddings=False, initializer_range=INIT))


def batch(n, step):
    """n counting sequences (each token the previous + 1, mod the vocabulary) from random starts,
    the same on every rank for a step: inputs (a dict of forward()'s keyword arguments) and the
    next-token target."""
    ids = (torch.randint(0, VOCAB, (n, 1), generator=torch.Generator().manual_seed(1000 + step))
           + torch.arange(SEQ + 1)) % VOCAB
    return {"input_ids": ids[:, :-1]}, ids[:, 1:]


def loss_fn(output, target):
    """Next-token cross-entropy from the ModelOutput's logits (mean over the tokens)."""
    return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())


def adamw(params):
    return torch.optim.AdamW(params, lr=LR, weight_decay=WEIGHT_DECAY)


def schedule(steps):
    import hybridplan
    return hybridplan.warmup_cosine(max(1, steps // 10), steps, min_lr_ratio=0.1)


def speedup_cluster(speedup=None, memory_bytes=None):
    """localhost-cpu with device.compute_speedup (measured on this model when not given) and,
    where given, another device memory."""
    from hybridplan.planner import Cluster
    d = Cluster.preset("localhost-cpu").to_dict()
    if speedup is None:
        speedup = measure_speedup()
    d["device"]["compute_speedup"] = {"bf16": float(speedup)}
    if memory_bytes is not None:
        d["device"]["memory_bytes"] = int(memory_bytes)
    return d


def measure_speedup(per_replica_batch=GLOBAL_BATCH // 8):
    """fp32 / bf16 time of the model's forward and backward under autocast, one thread."""
    from hybridplan.measure.calibration import compute_speedup
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = build_model()
    inputs, target = batch(per_replica_batch, 0)

    def step():
        model.zero_grad(set_to_none=True)
        loss_fn(model(**inputs), target).backward()
    ratio, _ = compute_speedup(step, torch.device("cpu"), 3, 15)
    torch.set_num_threads(threads)
    return ratio["bf16"]


def job(global_batch=GLOBAL_BATCH, accumulation=ACCUMULATION, precision="bf16"):
    d = {"global_batch": global_batch, "precision": precision, "optimizer": "adam"}
    if accumulation is not None:
        d["accumulation_steps"] = accumulation
    return d


# ---- the plan's side: one rank ----------------------------------------------------------------

def train_rank(steps, cluster, out_dir, global_batch=GLOBAL_BATCH, accumulation=ACCUMULATION,
               precision="bf16", cache_dir=False, verbose=True, profile_options=None,
               sharding=None):
    """parallelize (the job: global_batch in `accumulation` micro-steps, the precision; with
    `sharding`, its plan applied again sharded so), then `steps` steps of hp.step with clip_grad_norm=MAX_NORM and the schedule; saves this rank's
    losses, the global batch's loss per step, the norms, the trained state, the plan, the
    dtypes autograd saved in the first step (and rank 0 the graph) to out_dir."""
    import torch.distributed as dist
    import hybridplan
    entered = time.monotonic()
    torch.set_num_threads(1)
    model = build_model()
    j = job(global_batch, accumulation, precision)
    # the example: one replica's micro-batch if the search keeps dp = world (it is resized
    # to the plan's per_replica_batch otherwise)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    example_batch = max(1, global_batch // (world * (accumulation or 1)))
    inputs, target = batch(example_batch, 0)
    hp = hybridplan.parallelize(
        model, inputs, example_target=target, loss_fn=loss_fn, optimizer=adamw, job=j,
        cluster=cluster, cache_dir=cache_dir, verbose=verbose, timeout_s=300,
        profile_options=profile_options,
        clip_grad_norm=MAX_NORM, lr_scheduler=schedule(steps))
    if sharding is not None:  # the chosen plan, sharded: FSDP2 and its precision policy
        parallelized = hp.parallelized
        plan = dict(hp.plan.to_dict(), sharding=sharding)
        hp.close()
        hp = hybridplan.apply(plan, build_model(), loss_fn=loss_fn, optimizer=adamw,
                              timeout_s=300, clip_grad_norm=MAX_NORM,
                              lr_scheduler=schedule(steps))
        hp.parallelized = parallelized
    losses, global_losses, norms, clipped, lrs, saved = [], [], [], [], [], set()

    def pack(t):
        saved.add(str(t.dtype))
        return t
    started = time.monotonic()
    for step in range(steps):
        lrs.append(hp.optimizer.param_groups[0]["lr"])
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = hp.step(*hp.shard(*batch(hp.global_batch, step)))
        # the global batch's loss: every replica's share is equal and a replica's ranks return
        # the same loss, so the mean over the ranks is the mean over the replicas
        total = loss.detach().float().clone()
        dist.all_reduce(total)
        losses.append(loss.item())
        global_losses.append(total.item() / dist.get_world_size())
        norms.append(hp.last_grad_norm.item())
        # the gradients as clipping left them (the optimizer does not change them): their
        # global norm, measured again with no scaling (max_norm inf: coefficient 1), must be
        # min(norm, MAX_NORM)
        clipped.append(hp.clip_grad_norm(float("inf")).item())
        if hp.rank == 0 and verbose:
            print(f"step {step} loss {global_losses[-1]:.5f} norm {norms[-1]:.4f} "
                  f"lr {lrs[-1]:.2e}", flush=True)
    elapsed = time.monotonic() - started
    plan = hp.plan
    result = {"losses": losses, "global_losses": global_losses, "norms": norms,
              "clipped": clipped, "lrs": lrs,
              "saved": sorted(saved), "state": hp.state_dict(), "plan": plan.to_dict(),
              "global_batch": hp.global_batch, "accumulation_steps": hp.accumulation_steps,
              "seconds": elapsed, "log": list(hp.parallelized.log),
              "setup_seconds": started - entered}
    if hp.rank == 0:
        hp.parallelized.graph.save(os.path.join(out_dir, "graph.json"))
        with open(os.path.join(out_dir, "cluster.json"), "w") as f:
            f.write(hp.parallelized.cluster.to_json())
    rank = hp.rank
    hp.close()
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


# ---- the one-process side -----------------------------------------------------------------------

def fsdp_policy(plan):
    """FSDP2's MixedPrecisionPolicy runs the plan (a sharded placement plan in 16 bits), else
    torch.autocast (executor/precision.py)."""
    return plan["mode"] == "placement" and plan.get("sharding", "none") != "none"


def reference(steps, global_batch=GLOBAL_BATCH, precision="bf16", fsdp=False):
    """One process, plain torch, on the global batch each step (no accumulation): the plan's
    policy (autocast around forward and loss; or FSDP2's: the parameters cast to bf16 for the
    forward and backward, the gradients cast to fp32 onto fp32 master parameters), torch's
    clip_grad_norm_, AdamW, the schedule stepped after it. Returns (losses, norms, lrs,
    initial state, final state)."""
    import copy
    torch.set_num_threads(1)
    model = build_model()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    master = list(model.parameters())
    opt = adamw(master)
    scheduler = schedule(steps)(opt)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    compute = model
    if fsdp and dtype is not None:
        compute = copy.deepcopy(model)
        for p in compute.parameters():
            p.data = p.data.to(dtype)
    losses, norms, lrs = [], [], []
    for step in range(steps):
        inputs, target = batch(global_batch, step)
        opt.zero_grad(set_to_none=True)
        lrs.append(opt.param_groups[0]["lr"])
        if compute is not model:
            with torch.no_grad():
                for c, m in zip(compute.parameters(), master):
                    c.copy_(m)
                    c.grad = None
            loss = loss_fn(compute(**inputs), target)
            loss.backward()
            for c, m in zip(compute.parameters(), master):
                m.grad = c.grad.float()
        else:
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                loss = loss_fn(model(**inputs), target)
            loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(master, MAX_NORM).item())
        opt.step()
        scheduler.step()
        losses.append(loss.item())
    return losses, norms, lrs, initial, model.state_dict()


def compare(outs, ref):
    """The plan's ranks against the reference: `rows` per step (step, the plan's loss on the
    global batch, the reference's, |difference|, tolerance 4u x the reference's) and what the
    bounds check (`ok` where all hold):

      loss        every step within 4u x the reference's loss
      first_norm  step 0's norm (both sides at the same parameters: only the rounding differs)
                  within 4u relative of clip_grad_norm_'s (a root of a sum of squares moves by
                  no more than its terms); later norms are at parameters that have drifted
                  apart by bf16's rounding and are reported (norm_rel), not bounded
      clip_rel    the gradients' norm after the step's clipping against min(norm, max_norm):
                  within 1e-5 relative (clip_grads_with_norm_'s 1e-6 in the coefficient, float
                  sums): clipping scaled what it measured
      lr_rel      the learning rates equal the scheduler's in one process
      ranks       every rank's global loss the same; bfloat16 among the tensors autograd saved
                  for backward on every rank (the loss bound does not tell bf16 from fp32
                  at this size)

    and for scale the largest parameter difference and the largest update."""
    losses, norms, lrs, initial, final = ref
    plan_losses = outs[0]["global_losses"]
    rows = [(s, a, b, abs(a - b), TOLERANCE * abs(b))
            for s, (a, b) in enumerate(zip(plan_losses, losses))]
    r = {"rows": rows}
    r["first_norm"] = max(abs(out["norms"][0] - norms[0]) / norms[0] for out in outs)
    r["norm_rel"] = max(abs(g - n) / n for out in outs for g, n in zip(out["norms"], norms))
    r["clip_rel"] = max(abs(c - min(n, MAX_NORM)) / min(n, MAX_NORM)
                        for out in outs for n, c in zip(out["norms"], out["clipped"]))
    r["lr_rel"] = max(abs(g - x) / x for out in outs for g, x in zip(out["lrs"], lrs))
    r["ranks_agree"] = all(out["global_losses"] == plan_losses for out in outs)
    r["param_diff"] = max((out["state"][k].float() - v.float()).abs().max().item()
                          for out in outs for k, v in final.items())
    r["update"] = max((final[k].float() - initial[k].float()).abs().max().item()
                      for k in final)
    r["bf16_saved"] = all("torch.bfloat16" in out["saved"] for out in outs)
    r["clipped"] = sum(n > MAX_NORM for n in norms)
    r["ok"] = (len(rows) == len(losses) and all(d <= t for *_, d, t in rows)
               and r["first_norm"] <= TOLERANCE and r["clip_rel"] <= 1e-5
               and r["lr_rel"] <= 1e-12 and r["ranks_agree"] and r["bf16_saved"])
    return r


# ---- the planner's choice -------------------------------------------------------------------------

def describe_choice(graph, cluster, j, world):
    """(plan text, predicted step s, peak memory bytes) of what parallelize picks, or the
    search's refusal."""
    from hybridplan.front_door import choose_plan, describe
    from hybridplan.planner import InfeasibleError, Job
    full = dict(j, schema_version=1, kind="hybridplan.job")
    try:
        choice = choose_plan(graph, cluster, Job.from_dict(full, "job"), world)
    except InfeasibleError as e:
        return "no plan: " + " ".join(str(e).split())[:160], None, None
    p = choice.plan
    return describe(p), p.predicted["step_s"], max(p.predicted["memory_bytes"])


def planner_rows(graph, cluster_dict, world, global_batch, accumulation):
    from hybridplan.planner import Cluster
    cluster = Cluster.from_dict(cluster_dict)
    cases = [
        ("fp32, accumulation_steps 1 (the old axes)", job(global_batch, 1, "fp32")),
        ("fp32, accumulation searched", job(global_batch, None, "fp32")),
        ("fp32, accumulation_steps [1, 2, 4]", job(global_batch, [1, 2, 4], "fp32")),
        ("bf16, accumulation_steps 1", job(global_batch, 1, "bf16")),
        ("bf16, accumulation searched", job(global_batch, None, "bf16")),
        ("bf16, accumulation_steps [1, 2, 4]", job(global_batch, [1, 2, 4], "bf16")),
        (f"bf16, accumulation_steps {accumulation} (the run's job)",
         job(global_batch, accumulation, "bf16")),
    ]
    return [(name, *describe_choice(graph, cluster, j, world)) for name, j in cases]


def print_planner(rows, title):
    print(f"\n{title}\n| job | plan parallelize picks | predicted step | peak memory/device |\n"
          "|---|---|---|---|")
    for name, text, step_s, memory in rows:
        if step_s is None:
            print(f"| {name} | {text} | | |")
        else:
            print(f"| {name} | {text} | {step_s * 1e3:.2f} ms | {memory / 2**20:.1f} MiB |")


# ---- the driver -------------------------------------------------------------------------------------

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--global-batch", type=int, default=GLOBAL_BATCH)
    parser.add_argument("--accumulation", type=int, default=ACCUMULATION)
    parser.add_argument("--speedup", type=float, default=None,
                        help="device.compute_speedup.bf16 (default: measured on this model)")
    parser.add_argument("--no-planner", action="store_true")
    parser.add_argument("--sharding", choices=("zero2", "zero3"), default=None,
                        help="apply the chosen plan sharded so (FSDP2, MixedPrecisionPolicy)")
    parser.add_argument("--bind-memory-mib", type=float, default=None,
                        help="the memory-bound comparison's device memory (default: 3/4, 1/2 "
                             "and 1/4 of the fp32 K=1 plan's peak at 32 x the global batch)")
    parser.add_argument("--out-dir", default=None)
    parser.add_argument("--timeout", type=float, default=1800)
    # the rank side (torchrun runs this script with it)
    parser.add_argument("--rank-side", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cluster", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_side:
        train_rank(args.steps, args.cluster, args.out_dir, args.global_batch, args.accumulation,
                   sharding=args.sharding)
        return 0

    out_dir = args.out_dir or tempfile.mkdtemp(prefix="llama-recipe-")
    os.makedirs(out_dir, exist_ok=True)
    started = time.monotonic()
    speedup = args.speedup if args.speedup is not None else measure_speedup(
        args.global_batch // (args.nproc * args.accumulation))
    cluster_path = os.path.join(out_dir, "cluster-in.json")
    with open(cluster_path, "w") as f:
        json.dump(speedup_cluster(speedup), f)
    print(f"device.compute_speedup.bf16 = {speedup:.3f} (this model, one thread); "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(p for p in (os.path.join(REPO, "python"),
                                                      os.environ.get("PYTHONPATH")) if p))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(args.nproc), os.path.abspath(__file__), "--rank-side",
           "--steps", str(args.steps), "--cluster", cluster_path, "--out-dir", out_dir,
           "--global-batch", str(args.global_batch), "--accumulation", str(args.accumulation)]
    if args.sharding:
        cmd += ["--sharding", args.sharding]
    print("$ OMP_NUM_THREADS=1 torchrun --standalone --nproc-per-node "
          f"{args.nproc} bench/bench_llama_recipe.py --rank-side ...", flush=True)
    launched = time.monotonic()
    proc = subprocess.run(cmd, env=env, timeout=args.timeout)
    launch_s = time.monotonic() - launched
    if proc.returncode != 0:
        print(f"the launch failed (exit {proc.returncode})")
        return 1
    outs = [torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=False)
            for r in range(args.nproc)]
    plan = outs[0]["plan"]
    fsdp = fsdp_policy(plan)
    ref = reference(args.steps, outs[0]["global_batch"], plan.get("precision", "fp32"), fsdp)
    fp32 = reference(args.steps, outs[0]["global_batch"], "fp32")
    r = compare(outs, ref)
    rows = r["rows"]
    from hybridplan.front_door import describe
    from hybridplan.planner import Plan
    print(f"\nplan: {describe(Plan.from_dict(plan))} (global batch {outs[0]['global_batch']}, "
          f"accumulation_steps {outs[0]['accumulation_steps']}), policy "
          f"{'MixedPrecisionPolicy' if fsdp else 'autocast'}; launch {launch_s:.0f} s, "
          f"{args.steps} steps {outs[0]['seconds']:.1f} s on rank 0")
    print(f"\n| step | loss, {args.nproc} ranks | loss, 1 process | difference | "
          f"tolerance (4u x loss) |\n|---|---|---|---|---|")
    for s, a, b, d, t in rows:
        print(f"| {s} | {a:.5f} | {b:.5f} | {d:.2e} | {t:.2e} |")
    worst = max(rows, key=lambda r: r[3] / r[4])
    print(f"\nmax loss difference {max(r[3] for r in rows):.2e}; largest against its "
          f"tolerance at step {worst[0]}: {worst[3]:.2e} of {worst[4]:.2e} "
          f"({worst[3] / worst[4]:.2f} of it)")
    print(f"norms: step 0 relative difference {r['first_norm']:.2e} (tolerance 4u = "
          f"{TOLERANCE:.2e}), every step's {r['norm_rel']:.2e} (not bounded); after clipping "
          f"against min(norm, {MAX_NORM}) {r['clip_rel']:.1e} (tolerance 1e-5); steps clipped "
          f"(norm > {MAX_NORM}): {r['clipped']} of {args.steps}; learning rates "
          f"{r['lr_rel']:.1e}; the ranks' global losses "
          f"{'agree' if r['ranks_agree'] else 'DISAGREE'}")
    print(f"trained parameters (not bounded: AdamW scales each element's update to about lr "
          f"whatever its gradient's size): max |difference| {r['param_diff']:.2e}, largest "
          f"update {r['update']:.2e}")
    fp32_gap = max(abs(a - b) / abs(b) for a, b in zip(ref[0], fp32[0]))
    print(f"for scale: one process in bf16 against one process in fp32, max relative loss "
          f"difference {fp32_gap:.2e}")
    print(f"bfloat16 tensors saved for backward on every rank: {r['bf16_saved']}")
    ok = r["ok"]
    print("within the bounds" if ok else "OUTSIDE the bounds")
    print(f"load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{time.monotonic() - started:.0f} s in all", flush=True)

    if not args.no_planner:
        from hybridplan.planner import Cluster, Graph
        graph = Graph.load(os.path.join(out_dir, "graph.json"))
        with open(os.path.join(out_dir, "cluster.json")) as f:
            cluster = json.load(f)
        print_planner(planner_rows(graph, cluster, args.nproc, args.global_batch,
                                   args.accumulation),
                      f"the planner's choice on {args.nproc} devices of {cluster['name']} "
                      f"(memory {cluster['device']['memory_bytes'] / 2**30:.1f} GiB), global "
                      f"batch {args.global_batch}:")
        big = 32 * args.global_batch
        fractions = [0.75, 0.5, 0.25]
        if args.bind_memory_mib is None:
            _, _, fp32_memory = describe_choice(graph, Cluster.from_dict(cluster),
                                                job(big, 1, "fp32"), args.nproc)
            memories = [int(f * fp32_memory) for f in fractions]
            print(f"\nat global batch {big} the fp32 job without accumulation peaks at "
                  f"{fp32_memory / 2**20:.1f} MiB a device; devices of 3/4, 1/2 and 1/4 of it:")
        else:
            memories = [int(args.bind_memory_mib * 2**20)]
        for memory in memories:
            bound = dict(cluster, device=dict(cluster["device"], memory_bytes=memory))
            print_planner(planner_rows(graph, bound, args.nproc, big, args.accumulation),
                          f"memory binding: global batch {big} on {args.nproc} devices of "
                          f"{memory / 2**20:.1f} MiB:")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
