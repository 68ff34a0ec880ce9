"""At size, on paper: Hugging Face model configurations at their published shapes, profiled
without materialising (fake tensors priced for H100 by the device model), planned for DGX H100
clusters, beside published throughputs for the same or the nearest layouts.

    python bench/bench_at_size.py [--rows 8b-8 8b-128 70b-256 405b-512 mixtral-64]
                                  [--profile-layers 3] [--out-dir out/bench/at_size]

Per row:
1. **Profile** (a child process, so its wall time and peak resident memory are its own): the
   model built from its configuration (`LlamaConfig` / `MixtralConfig` with the published
   shapes, written out below; no weights, no network) under `torch.device("meta")`, cast to
   bfloat16, with `--profile-layers` decoder layers, and fake-profiled
   (`profile_dict(..., device_model="dgx-h100")`) at one sequence with the causal LM's
   cross-entropy loss, with its tensor- and sequence-parallel fields
   (profiler.fake_tensor_parallel: which nodes split and how, and whether the sequence splits
   between the TP regions, is checked on a miniature of the same class, heads and layers with
   values; max degrees, bytes and per-rank split times at the model's own shapes, priced).
   A fake profile costs Python's time per op, not the model's size, so
   the stack is profiled at 3 layers and repeated to its depth
   (`profiler.layer_repeat.repeat_layers`: every layer between the first and the last prices
   the same; `tests/python/test_fake_profile.py` checks this against a profile at full depth
   of a small model). The child reports its wall time and its peak RSS (`ru_maxrss`, the
   interpreter, torch and transformers included).
2. **Plan**: `hybridplan.search` on the `dgx-h100` preset with as many nodes as the row has
   GPUs / 8, the job: the row's global batch (the published run's), Adam, mixed precision
   (16 bytes a parameter), samples/s as the objective, every plan kind the planner has:
   data parallelism, FSDP-style sharding, pipelines, recompute and tensor parallelism (up to
   8, a DGX node) with or without sequence parallelism (`--sequence-parallel`: the search's
   option, default auto).
3. **Table**: the plan, predicted tokens/s per GPU, model TFLOP/s per GPU (6 N + 6 L s h FLOPs
   a token: the weights' forward and backward and causal attention, N the parameters without
   the embedding table), predicted memory per GPU, the published layout priced by the same
   model where the planner can express it (PUBLISHED_LAYOUT), and the published figure.

Mixtral's experts run under Hugging Face's `grouped_mm` experts implementation (the default in
transformers 5): the tokens sorted by expert, each expert's rows multiplied by its weights in
one grouped GEMM. Under fake tensors the routing has no values, so the device model prices the
grouped GEMM as one product over all tokens x top-k rows: the load spread evenly over the
experts (device_model._gemm_shape). The router's top-k, sort, histogram and gathers run as
fake ops of fixed shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "python")]

# Published shapes (each model's config.json on the Hugging Face Hub, transcribed): layers,
# hidden, intermediate, heads, kv heads, vocabulary, rope theta; sequence: the length the
# published throughput was measured at (torchtitan's Llama 3 runs: 8192; Mixtral: 4096).
MODELS = {
    "Llama-3.1-8B": dict(kind="llama", layers=32, hidden=4096, ffn=14336, heads=32, kv=8,
                         vocab=128256, rope_theta=500000.0, seq=8192),
    "Llama-3.1-70B": dict(kind="llama", layers=80, hidden=8192, ffn=28672, heads=64, kv=8,
                          vocab=128256, rope_theta=500000.0, seq=8192),
    "Llama-3.1-405B": dict(kind="llama", layers=126, hidden=16384, ffn=53248, heads=128, kv=8,
                           vocab=128256, rope_theta=500000.0, seq=8192),
    "Mixtral-8x7B": dict(kind="mixtral", layers=32, hidden=4096, ffn=14336, heads=32, kv=8,
                         vocab=32000, rope_theta=1e6, seq=4096, experts=8, top_k=2),
}

# Rows: (key, model, GPUs, global batch in sequences, the published figure beside it).
ROWS = {
    "8b-8": ("Llama-3.1-8B", 8, 16,
             "torchtitan (Dec 2024), FSDP 8, local batch 2, selective AC, bf16: 5,762 "
             "tokens/s/GPU, 82.4 GiB (torch.compile: 6,667)"),
    "8b-128": ("Llama-3.1-8B", 128, 256,
               "torchtitan (Dec 2024), FSDP 128, local batch 2, selective AC, bf16: 5,605 "
               "tokens/s/GPU, 67.0 GiB (torch.compile: 6,514)"),
    "70b-256": ("Llama-3.1-70B", 256, 512,
                "torchtitan (Dec 2024), FSDP 32 x TP 8, local batch 16, full AC, compile + "
                "Float8: 829 tokens/s/GPU, 71.9 GiB (AsyncTP: 876)"),
    "405b-512": ("Llama-3.1-405B", 512, 256,
                 "torchtitan (Dec 2024), FSDP 8 x TP 8 x PP 8, local batch 32, full AC, "
                 "compile + Float8 + AsyncTP: 100 (1F1B) / 128 (interleaved 1F1B) "
                 "tokens/s/GPU; Llama 3 paper (arXiv 2407.21783, Table 4) 405B on 8,192 GPUs "
                 "at TP 8 x CP 1 x PP 16 x DP 64, bf16: 430 TFLOP/s/GPU, 43 % MFU"),
    "mixtral-64": ("Mixtral-8x7B", 64, 256,
                   "none found for Mixtral 8x7B training on H100 in the sources searched"),
}

kPeakBf16 = 989e12  # H100 SXM dense bf16 (the preset's peak_flops): MFU's denominator


def build_model(name: str, layers: int):
    """The model of MODELS[name] with `layers` decoder layers, on the meta device, bfloat16."""
    import torch
    import transformers
    m = MODELS[name]
    common = dict(vocab_size=m["vocab"], hidden_size=m["hidden"],
                  intermediate_size=m["ffn"], num_hidden_layers=layers,
                  num_attention_heads=m["heads"], num_key_value_heads=m["kv"],
                  rope_theta=m["rope_theta"], max_position_embeddings=m["seq"],
                  tie_word_embeddings=False)
    if m["kind"] == "llama":
        config = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    else:
        config = transformers.MixtralConfig(**common, num_local_experts=m["experts"],
                                            num_experts_per_tok=m["top_k"])
        cls = transformers.MixtralForCausalLM
    with torch.device("meta"):
        model = cls(config).to(torch.bfloat16)
    return model


def parameters_at_depth(name: str) -> dict:
    """Total and non-embedding parameters at full depth, counted on meta models of 1 and 2
    layers (a layer's count is their difference)."""
    one = build_model(name, 1)
    two = build_model(name, 2)
    count = lambda mod: sum(p.numel() for p in mod.parameters())  # noqa: E731
    per_layer = count(two) - count(one)
    total = count(one) + (MODELS[name]["layers"] - 1) * per_layer
    embed = one.model.embed_tokens.weight.numel()
    return {"total": total, "non_embedding": total - embed, "per_layer": per_layer}


def profile_child(name: str, layers: int, out: str, tensor_parallel: bool = True) -> int:
    """Runs in the child: profiles `name` at `layers` layers into `out`, prints its costs."""
    import torch
    import torch.nn.functional as F
    from hybridplan.profiler import profile_dict
    started = time.monotonic()
    seq = MODELS[name]["seq"]
    model = build_model(name, layers)
    ids = torch.zeros(1, seq, dtype=torch.long)
    loss = lambda out, y: F.cross_entropy(out.logits.flatten(0, 1).float(),  # noqa: E731
                                          y.flatten())
    graph = profile_dict(model, ids, device_model="dgx-h100", verbose=False, batch_sizes=(),
                         loss_fn=loss, target=torch.zeros(1, seq, dtype=torch.long),
                         name=name.lower().replace(".", "_"), tensor_parallel=tensor_parallel)
    Path(out).write_text(json.dumps(graph))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"wall_s": time.monotonic() - started,
                      "cpu_s": usage.ru_utime + usage.ru_stime,
                      "peak_rss_bytes": usage.ru_maxrss * 1024,
                      "tensor_parallel_nodes": sum("tensor_parallel" in n
                                                   for n in graph["nodes"]),
                      "sequence_parallel_nodes": sum("sequence_parallel" in n
                                                     for n in graph["nodes"])}))
    return 0


def profile_row(name: str, layers: int, out_dir: Path, tensor_parallel: bool = True) -> dict:
    path = out_dir / f"{name}.shallow.json"
    started = time.monotonic()
    done = subprocess.run([sys.executable, __file__, "--profile-one", name, "--profile-layers",
                           str(layers), "--graph-out", str(path), "--tensor-parallel",
                           "on" if tensor_parallel else "off"], capture_output=True,
                          text=True, check=False, env={**os.environ, "PYTHONPATH": str(
                              ROOT / "python")})
    if done.returncode:
        raise SystemExit(f"bench_at_size: profiling {name} failed:\n{done.stderr[-3000:]}")
    costs = json.loads(done.stdout.strip().splitlines()[-1])
    costs["process_s"] = time.monotonic() - started
    return {"graph": json.loads(path.read_text()), **costs}


def cluster_for(gpus: int) -> dict:
    from hybridplan.planner import load_cluster
    cluster = load_cluster("dgx-h100").to_dict()
    if gpus % cluster["devices_per_node"]:
        raise SystemExit(f"bench_at_size: {gpus} GPUs is not whole DGX H100 nodes")
    cluster["num_nodes"] = gpus // cluster["devices_per_node"]
    cluster["name"] = f"dgx-h100 x{cluster['num_nodes']}"
    return cluster


# The published layouts as the planner can express them, priced by the same model: the search
# restricted to the layout's kinds and degrees at the published local batch (a replica's
# batch: a TP group's), the planner choosing recompute. FSDP over every GPU is zero3 data
# parallelism (dp_only, which also means tp 1); FSDP x TP is a zero3 placement at tp 8. torchtitan's 405B run shards a
# pipeline's stages with FSDP under TP as well, which the planner does not express (sharding
# under tp > 1 is a placement plan's only): its nearest is TP 8 x a pipeline, unsharded.
PUBLISHED_LAYOUT = {
    "8b-8": dict(local_batch=2, dp_only=True, shardings=("zero3",), tensor_degrees=(1,)),
    "8b-128": dict(local_batch=2, dp_only=True, shardings=("zero3",), tensor_degrees=(1,)),
    # placement with tp > 1 is mp = 1 only: zero3 data parallelism over TP groups of 8
    "70b-256": dict(local_batch=16, modes=("placement",), shardings=("zero3",),
                    tensor_degrees=(8,)),
    "405b-512": dict(local_batch=32, modes=("pipeline",), shardings=("none",),
                     tensor_degrees=(8,)),
}


def plan_row(graph: dict, gpus: int, global_batch: int, layout: dict = None,
             sequence_parallel: str = "auto"):
    """The planner's best plan for the row; with `layout` (PUBLISHED_LAYOUT's), the best plan
    restricted to the published layout instead. `sequence_parallel`: search's option."""
    from hybridplan.planner import search
    job = {"schema_version": 1, "kind": "hybridplan.job", "samples_per_epoch": 1 << 30,
           "global_batch": global_batch, "optimizer": "adam", "mixed_precision": True}
    only = {}
    if layout:
        only = {k: v for k, v in layout.items() if k != "local_batch"}
        job["per_replica_batch"] = layout["local_batch"]
        del job["global_batch"]
    started = time.monotonic()
    result = search(graph, cluster_for(gpus), job, devices=gpus, top_k=3,
                    sequence_parallel=sequence_parallel, **only)
    return result, time.monotonic() - started


def plan_words(plan: dict) -> str:
    words = [f"dp {plan['dp']}"]
    if plan["mp"] > 1:
        words.append(f"{plan['mode']} {plan['mp']}")
    if plan.get("tp", 1) > 1:
        words.append(f"tp {plan['tp']}" + (" sp" if plan.get("sequence_parallel") else ""))
    if plan.get("schedule") not in (None, "", "none"):
        words.append(f"{plan['schedule']} M={plan['num_microbatches']}")
    if plan.get("sharding", "none") != "none":
        words.append(plan["sharding"])
    recompute = {str(a.get("recompute")) for a in plan["assignment"] if a.get("recompute")}
    if recompute:
        words.append("recompute " + "/".join(sorted(recompute)))
    words.append(f"b={plan['per_replica_batch']}")
    if plan.get("accumulation_steps", 1) > 1:
        words.append(f"K={plan['accumulation_steps']} accumulation steps")
    return ", ".join(words)


def full_depth_check(name: str, layers: int, out_dir: Path) -> int:
    """`name` profiled at full depth and at `layers` layers repeated: the largest relative
    difference of any node's forward, backward, output and saved bytes, and the edges."""
    from hybridplan.profiler.layer_repeat import repeat_layers
    depth = MODELS[name]["layers"]
    full = profile_row(name, depth, out_dir)
    shallow = profile_row(name, layers, out_dir)
    repeated = repeat_layers(shallow["graph"], "model.layers.", depth)
    worst = (0.0, "")
    names = [n["name"] for n in full["graph"]["nodes"]]
    if names != [n["name"] for n in repeated["nodes"]]:
        raise SystemExit(f"bench_at_size: {name}: the repeated graph's nodes differ")
    for a, b in zip(full["graph"]["nodes"], repeated["nodes"]):
        pairs = [(key, a[key], b[key]) for key in ("forward_s", "backward_s", "output_bytes",
                                                    "saved_bytes", "flops")]
        ta, tb = a.get("tensor_parallel"), b.get("tensor_parallel")
        if (ta is None) != (tb is None) or (ta and {k: v for k, v in ta.items()
                                                 if k != "split_times"} != {
                k: v for k, v in tb.items() if k != "split_times"}):
            raise SystemExit(f"bench_at_size: {name}: {a['name']}'s tensor-parallel fields differ")
        if a.get("sequence_parallel") != b.get("sequence_parallel"):
            raise SystemExit(f"bench_at_size: {name}: {a['name']}'s sequence-parallel fields "
                             "differ")
        for sa, sb in zip((ta or {}).get("split_times", []), (tb or {}).get("split_times", [])):
            pairs += [(f"split {sa['degree']} {k}", sa[k], sb[k]) for k in ("forward_s",
                                                                              "backward_s")]
        for key, x, y in pairs:
            diff = abs(x - y) / max(abs(x), 1e-30) if x else abs(y)
            worst = max(worst, (diff, f"{a['name']} {key}"))
    edge = lambda e: (e["src"], e["dst"], e.get("bytes"))  # noqa: E731
    same_edges = sorted(map(edge, full["graph"]["edges"])) == sorted(map(edge, repeated["edges"]))
    print(f"{name}: full depth ({depth} layers) profiled in {full['wall_s']:.1f} s, peak RSS "
          f"{full['peak_rss_bytes'] / 1e9:.2f} GB; {layers} layers in {shallow['wall_s']:.1f} s, "
          f"{shallow['peak_rss_bytes'] / 1e9:.2f} GB; repeated against full: {len(names)} nodes, "
          f"largest relative difference {worst[0]:.2e} ({worst[1]}), edges equal: {same_edges}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--profile-layers", type=int, default=3)
    parser.add_argument("--out-dir", default=str(ROOT / "out" / "bench" / "at_size"))
    parser.add_argument("--full-depth-check", metavar="MODEL", choices=list(MODELS),
                        help="also profile MODEL at its full depth and compare it node by node "
                             "with the repeated profile (its wall time and memory too)")
    parser.add_argument("--tensor-parallel", choices=("on", "off"), default="on",
                        help="off: profile without the tensor-parallel fields (the graph then "
                             "plans without tensor parallelism; for measuring their cost)")
    parser.add_argument("--sequence-parallel", choices=("auto", "on", "off"), default="auto",
                        help="the search's sequence_parallel option (off: plans without it, "
                             "from the same graphs)")
    parser.add_argument("--profile-one", help=argparse.SUPPRESS)
    parser.add_argument("--graph-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile_one:
        return profile_child(args.profile_one, args.profile_layers, args.graph_out,
                             args.tensor_parallel == "on")
    from hybridplan.profiler.layer_repeat import repeat_layers
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.full_depth_check:
        return full_depth_check(args.full_depth_check, args.profile_layers, out_dir)
    profiles = {}
    print("| model | GPUs | global batch (seq x tokens) | profile: wall s (CPU s), peak RSS GB | "
          "plan | predicted tokens/s/GPU | model TFLOP/s/GPU (MFU) | predicted memory/GPU GiB "
          "| plan search s | the published layout, predicted: tokens/s/GPU, GiB | published, "
          "nearest layout |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key in args.rows:
        name, gpus, batch, published = ROWS[key]
        m = MODELS[name]
        if name not in profiles:
            prof = profile_row(name, args.profile_layers, out_dir, args.tensor_parallel == "on")
            prof["full"] = repeat_layers(prof["graph"], "model.layers.", m["layers"])
            prof["params"] = parameters_at_depth(name)
            (out_dir / f"{name}.json").write_text(json.dumps(prof["full"]))
            profiles[name] = prof
        prof = profiles[name]
        graph = prof["full"]
        result, search_s = plan_row(graph, gpus, batch, sequence_parallel=args.sequence_parallel)
        plan = result.plans[0].to_dict()
        (out_dir / f"{key}.plan.json").write_text(json.dumps(plan, indent=1))
        pred = plan["predicted"]
        tokens_per_gpu = pred["samples_per_s"] * m["seq"] / gpus
        active = prof["params"]["non_embedding"]
        if m["kind"] == "mixtral":  # the active parameters: top-k of the experts a token
            experts = 3 * m["hidden"] * m["ffn"] * m["experts"] * m["layers"]
            active -= experts * (m["experts"] - m["top_k"]) // m["experts"]
        flops_per_token = 6 * active + 6 * m["layers"] * m["seq"] * m["hidden"]
        tflops = tokens_per_gpu * flops_per_token
        memory = max(pred["memory_bytes"]) / 2 ** 30
        theirs = "-"
        if key in PUBLISHED_LAYOUT:
            from hybridplan.planner import InfeasibleError
            try:
                fsdp, _ = plan_row(graph, gpus, batch, PUBLISHED_LAYOUT[key],
                                   args.sequence_parallel)
                fp = fsdp.plans[0].to_dict()
                theirs = (f"{plan_words(fp)}: "
                          f"{fp['predicted']['samples_per_s'] * m['seq'] / gpus:,.0f}, "
                          f"{max(fp['predicted']['memory_bytes']) / 2 ** 30:.1f}")
            except InfeasibleError as exc:  # the message names the smallest need
                need = str(exc).split("smallest per-device memory need is ")[-1]
                theirs = f"does not fit: {need.split(' (over')[0]}"
        print(f"| {name} | {gpus} | {batch} x {m['seq']} | {prof['wall_s']:.1f} "
              f"({prof['cpu_s']:.1f} CPU), {prof['peak_rss_bytes'] / 1e9:.2f} | "
              f"{plan_words(plan)} | {tokens_per_gpu:,.0f} "
              f"| {tflops / 1e12:.0f} ({tflops / kPeakBf16:.0%}) | {memory:.1f} | "
              f"{search_s:.1f} | {theirs} | {published} |", flush=True)
    print()
    for name, prof in profiles.items():
        g = prof["full"]
        fwd = sum(n["forward_s"] for n in g["nodes"])
        bwd = sum(n["backward_s"] for n in g["nodes"])
        flops = sum(n.get("flops", 0.0) for n in g["nodes"])
        print(f"- {name}: {len(g['nodes'])} nodes ({args.profile_layers} layers profiled, "
              f"repeated to {MODELS[name]['layers']}), {prof['params']['total'] / 1e9:.2f} B "
              f"parameters, one sequence priced at forward {fwd * 1e3:.1f} ms + backward "
              f"{bwd * 1e3:.1f} ms, {flops / 1e12:.1f} TFLOP forward; "
              f"{prof['tensor_parallel_nodes']} of the profiled nodes carry tensor-parallel "
              f"and {prof['sequence_parallel_nodes']} sequence-parallel fields; profile child "
              f"{prof['process_s']:.1f} s with interpreter start")
    return 0


if __name__ == "__main__":
    sys.exit(main())
