"""On paper, at scale: Llama-2-shaped decoders that do not fit data parallelism, planned on the
GPU presets (docs/sharding.md "At scale").

    python bench/bench_at_scale.py [--out-dir out/bench/at_scale]

Each decoder is a graph of one node per module (embedding, every decoder layer, final norm,
output head), built from its shape rather than profiled: forward time = forward FLOPs /
(peak_flops x kEfficiency), backward twice that; parameters, outputs and the activations a
layer keeps for backward in float32 (the planner's memory model holds parameters, gradients and
Adam's two moments at the parameters' width; mixed precision is not modelled). Activations per
layer and sample follow Korthikanti et al. 2022 (https://arxiv.org/abs/2205.05198, eq. 2:
s d (34 + 5 a s / d) bytes in 16-bit, doubled here for float32). The planner then searches
dp x mp x mode x micro-batches x sharding x recompute for 8 GPUs (7B, one DGX H100) and 64 GPUs
(70B, eight), and `explain` shows the chosen plan; the ranked table shows the alternatives and
why they lose (memory or time).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))

kEfficiency = 0.5  # sustained share of peak FLOP/s in a decoder layer's matmuls (an assumption)
kFloat = 4         # bytes per value

DECODERS = {  # name -> layers, d_model, ffn, heads, vocab, sequence, devices, nodes
    "llama2-7b": (32, 4096, 11008, 32, 32000, 4096, 8, 1),
    "llama2-70b": (80, 8192, 28672, 64, 32000, 4096, 64, 8),
}


def decoder_graph(name: str, layers: int, d: int, ffn: int, heads: int, vocab: int, seq: int,
                  peak_flops: float) -> dict:
    """The graph (kind hybridplan.graph) of one decoder at batch 1 (one sequence)."""
    def node(i, node_name, op, params, flops, output, saved):
        forward = flops / (peak_flops * kEfficiency)
        return {"id": i, "name": node_name, "op": op, "forward_s": forward,
                "backward_s": 2 * forward, "param_bytes": params * kFloat,
                "param_tensors": 0, "output_bytes": output, "saved_bytes": saved,
                "flops": flops}
    hidden = seq * d * kFloat
    layer_params = 4 * d * d + 3 * d * ffn + 2 * d  # attention, SwiGLU, two norms
    layer_flops = 2 * layer_params * seq + 4 * seq * seq * d  # matmuls + attention scores
    layer_saved = 2 * seq * d * (34 + 5 * heads * seq // d)
    nodes = [node(0, "model.embed_tokens", "embedding", vocab * d, 0, hidden, hidden)]
    for i in range(layers):
        nodes.append(node(1 + i, f"model.layers.{i}", "decoder_layer", layer_params, layer_flops,
                          hidden, layer_saved))
    nodes.append(node(layers + 1, "model.norm", "rmsnorm", d, 4 * seq * d, hidden, hidden))
    logits = seq * vocab * kFloat
    nodes.append(node(layers + 2, "lm_head", "linear", vocab * d, 2 * vocab * d * seq, logits,
                      hidden))
    for n in nodes:
        n["param_tensors"] = {"embedding": 1, "decoder_layer": 9, "rmsnorm": 1, "linear": 1}[n["op"]]
    edges = [{"src": i, "dst": i + 1} for i in range(len(nodes) - 1)]
    return {"schema_version": 1, "kind": "hybridplan.graph", "name": name,
            "profiled": {"device": "paper", "batch_size": 1, "dtype": "float32",
                         "input_bytes": seq * 8, "loss_backward_bytes": 2 * logits},
            "nodes": nodes, "edges": edges}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-dir", default="out/bench/at_scale")
    args = p.parse_args(argv)
    from hybridplan import planner

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cli = str(ROOT / "build" / "bin" / "hybridplan")
    preset = planner.Cluster.load("dgx-h100").to_dict()
    for name, (layers, d, ffn, heads, vocab, seq, devices, nodes) in DECODERS.items():
        graph = decoder_graph(name, layers, d, ffn, heads, vocab, seq, preset["device"]["peak_flops"])
        cluster = dict(preset, num_nodes=nodes, name=f"dgx-h100-x{nodes}")
        job = {"schema_version": 1, "kind": "hybridplan.job", "samples_per_epoch": 1 << 20,
               "global_batch": 2 * devices, "optimizer": "adam"}
        paths = {}
        for kind, doc in (("graph", graph), ("cluster", cluster), ("job", job)):
            paths[kind] = out / f"{name}.{kind}.json"
            paths[kind].write_text(json.dumps(doc, indent=1) + "\n")
        plan_path = out / f"{name}.plan.json"
        base = [cli, "plan", "-g", str(paths["graph"]), "-c", str(paths["cluster"]), "-j",
                str(paths["job"])]
        table = subprocess.run(base + ["-k", "8", "-o", str(plan_path)], capture_output=True,
                               text=True)
        unsharded = subprocess.run(base + ["-k", "3", "--sharding", "none"], capture_output=True,
                                   text=True)
        explain = subprocess.run([cli, "explain", str(plan_path), "-g", str(paths["graph"]),
                                  "-c", str(paths["cluster"]), "-j", str(paths["job"])],
                                 capture_output=True, text=True)
        params = sum(n["param_bytes"] for n in graph["nodes"]) / kFloat
        report = (f"# {name}: {params / 1e9:.1f} B parameters, {devices} x "
                  f"{preset['device']['name']}\n\n## plan (every axis)\n\n{table.stdout}"
                  f"{table.stderr}\n## plan without sharding\n\n{unsharded.stdout}"
                  f"{unsharded.stderr}\n## explain (the chosen plan)\n\n{explain.stdout}"
                  f"{explain.stderr}")
        (out / f"{name}.md").write_text(report)
        print(report)
        if table.returncode != 0:
            return table.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
