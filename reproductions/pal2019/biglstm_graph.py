"""BigLSTM as a hybridplan graph, built from its published architecture (an ESTIMATE, not a profile).

Architecture: "BIG LSTM" of Jozefowicz et al. 2016, "Exploring the Limits of Language Modeling"
(https://arxiv.org/abs/1602.02410): word embeddings of 1024, two LSTM layers of 8192 units each
projected to 1024, a softmax over the One Billion Word vocabulary of 793,471 words trained as a
sampled softmax with 8192 negative samples; about 1.8 billion parameters. As in the authors'
released TensorFlow model (lm_1b), the embedding and softmax matrices are split into 8 shards by
rows, which is what lets a model-parallel plan spread those 3.2 GB matrices over devices:

    input -> emb_shard_0..7 -> embedding (gather) -> lstm_1 -> lstm_2 -> softmax_shard_0..7 -> loss

Times are not measured: each node's forward time is its FLOPs over an effective V100 rate,

    forward_s  = flops / (V100 FP32 peak 15.7e12 FLOP/s * 0.5 efficiency)      (GEMM-bound nodes)
    forward_s  = bytes_moved / (V100 HBM2 900e9 B/s * 0.5 efficiency)          (gathers)
    backward_s = 2 * forward_s   (gradients w.r.t. both inputs and weights: two GEMMs per GEMM)

FP32 because the PipeDream profiles this is compared with were measured in FP32; 50 % of peak
is our estimate for large LSTM GEMMs (M = 128 sequences, K = 2048, N = 4 * 8192). Per LSTM layer
and token: 2 * (4 * 8192 * (1024 + 1024) + 8192 * 1024) = 151 MFLOP forward.

Known simplifications (say so wherever the results are shown):
- parameter bytes are dense fp32, so the planner's all-reduce and gradient memory treat the
  embedding and softmax gradients as dense, while TensorFlow sends them as sparse row slices;
- an LSTM layer's internal gate activations (about 6 * 8192 floats per token) are not counted in
  memory: the graph format only knows each node's output.

Run as a script to write the graph JSON: python3 reproductions/pal2019/biglstm_graph.py out.json
"""

from __future__ import annotations

import json
import sys

VOCAB = 793_471                  # One Billion Word Benchmark vocabulary (Jozefowicz et al. 2016)
EMBED_DIM = 1024
LSTM_UNITS = 8192
PROJECTION_DIM = 1024
NUM_LAYERS = 2
NUM_SAMPLED = 8192               # sampled softmax negatives
NUM_SHARDS = 8                   # lm_1b: embedding and softmax weights in 8 row shards
SEQUENCE_LENGTH = 20             # unrolled steps per sequence (one sample = one sequence)
BATCH_SIZE = 128                 # sequences per replica per step (the times below are for this)
FLOAT_BYTES = 4

V100_FP32_FLOPS = 15.7e12        # V100-SXM2 datasheet
V100_HBM_BYTES_PER_S = 900e9     # V100-SXM2 datasheet
EFFICIENCY = 0.5                 # estimate, see the module docstring


def _gemm_s(flops: float) -> float:
    return flops / (V100_FP32_FLOPS * EFFICIENCY)


def _memory_s(num_bytes: float) -> float:
    return num_bytes / (V100_HBM_BYTES_PER_S * EFFICIENCY)


def lstm_flops_per_token() -> float:
    """2 * (gates: 4 * units * (input + recurrent projection) + projection: units * proj)."""
    gates = 4 * LSTM_UNITS * (PROJECTION_DIM + PROJECTION_DIM)
    projection = LSTM_UNITS * PROJECTION_DIM
    return 2.0 * (gates + projection)


def build_graph(batch_size: int = BATCH_SIZE) -> dict:
    """The BigLSTM graph dict (kind "hybridplan.graph") with times for `batch_size` sequences."""
    tokens = batch_size * SEQUENCE_LENGTH
    activation_bytes = tokens * PROJECTION_DIM * FLOAT_BYTES
    shard_rows = -(-VOCAB // NUM_SHARDS)
    nodes, edges = [], []

    def node(name, op, forward_s, backward_s, param_bytes, output_bytes, flops=0.0):
        nodes.append({"id": len(nodes), "name": name, "op": op, "forward_s": forward_s,
                      "backward_s": backward_s, "param_bytes": int(param_bytes),
                      "output_bytes": int(output_bytes), "flops": flops})
        return len(nodes) - 1

    def edge(src, dst):
        edges.append({"src": src, "dst": dst})

    inputs = node("input", "input", 0.0, 0.0, 0, tokens * 2 * 4)  # int32 words and targets
    # Each embedding shard gathers the rows of its words (about tokens / NUM_SHARDS of them).
    gather_s = _memory_s(2 * tokens / NUM_SHARDS * EMBED_DIM * FLOAT_BYTES)
    shard_out = tokens / NUM_SHARDS * EMBED_DIM * FLOAT_BYTES
    emb_shards = [node(f"embedding.shard_{k}", "embedding", gather_s, gather_s,
                       shard_rows * EMBED_DIM * FLOAT_BYTES, shard_out)
                  for k in range(NUM_SHARDS)]
    for s in emb_shards:
        edge(inputs, s)
    embedding = node("embedding", "gather", _memory_s(2 * activation_bytes),
                     _memory_s(2 * activation_bytes), 0, activation_bytes)
    for s in emb_shards:
        edge(s, embedding)

    previous = embedding
    lstm_params = (4 * LSTM_UNITS * (EMBED_DIM + PROJECTION_DIM) + 4 * LSTM_UNITS
                   + LSTM_UNITS * PROJECTION_DIM) * FLOAT_BYTES
    for layer in range(1, NUM_LAYERS + 1):
        flops = lstm_flops_per_token() * tokens
        lstm = node(f"lstm_{layer}", "lstm", _gemm_s(flops), 2 * _gemm_s(flops), lstm_params,
                    activation_bytes, flops)
        edge(previous, lstm)
        previous = lstm

    # Each softmax shard scores every token against its share of the sampled words (and the
    # true ones): a (tokens x 1024) by (1024 x sampled/shards) GEMM.
    sampled_per_shard = NUM_SAMPLED // NUM_SHARDS
    logits_flops = 2.0 * tokens * PROJECTION_DIM * sampled_per_shard
    logits_bytes = tokens * sampled_per_shard * FLOAT_BYTES
    gather_w_s = _memory_s(sampled_per_shard * PROJECTION_DIM * FLOAT_BYTES)
    softmax_shards = [node(f"softmax.shard_{k}", "sampled_softmax",
                           _gemm_s(logits_flops) + gather_w_s,
                           2 * _gemm_s(logits_flops) + gather_w_s,
                           shard_rows * (PROJECTION_DIM + 1) * FLOAT_BYTES, logits_bytes,
                           logits_flops)
                      for k in range(NUM_SHARDS)]
    loss = node("loss", "cross_entropy", _memory_s(2 * NUM_SHARDS * logits_bytes),
                _memory_s(2 * NUM_SHARDS * logits_bytes), 0, FLOAT_BYTES)
    for s in softmax_shards:
        edge(previous, s)
        edge(s, loss)
    edge(inputs, loss)  # the targets

    return {"schema_version": 1, "kind": "hybridplan.graph", "name": "biglstm",
            "profiled": {"device": "V100-SXM2 (estimated from FLOPs, not measured)",
                         "batch_size": batch_size, "dtype": "float32"},
            "nodes": nodes, "edges": edges}


def num_parameters(graph: dict) -> int:
    return sum(n["param_bytes"] for n in graph["nodes"]) // FLOAT_BYTES


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: biglstm_graph.py OUT.json")
    g = build_graph()
    with open(sys.argv[1], "w") as f:
        json.dump(g, f, indent=1)
    print(f"{sys.argv[1]}: {len(g['nodes'])} nodes, {num_parameters(g) / 1e9:.2f} B parameters")
