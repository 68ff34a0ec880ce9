"""A GPT-style decoder's Graph from its configuration, without profiling: the graph a planner
needs for a model too large to build (Megatron-LM's 1T-parameter GPT), priced by a GEMM
efficiency model instead of measurements.

    from hybridplan.profiler.from_config import TransformerConfig, graph_from_config
    g = graph_from_config(TransformerConfig("gpt-175b", layers=96, hidden=12288, heads=96,
                                            seq_len=2048, vocab=51200), device="A100")

or `python -m hybridplan graph-from-config --layers 96 --hidden 12288 ... --out g.json`.

**Nodes** (docs/formats.md "Graph"; `tensor_parallel` per docs/tensor_parallel.md):
`embedding` (word + position embeddings, split by vocabulary: `vocab_rowwise`), then per layer
`layers.<i>.ln1`, `.qkv` (colwise), `.attn` (the attention core: QK^T, scale-mask-softmax,
dropout, attention over V, on each rank's heads: `sharded`), `.proj` (rowwise; its bias,
dropout and residual add fused in), `.ln2`, `.fc1` (colwise), `.gelu` (`sharded`), `.fc2`
(rowwise, bias-dropout-add fused), then `final_ln` and `lm_head` (colwise_gather, tied with the
embedding's word table through `tied_params`). A pipeline stage may begin only at a layer's
`ln1` (or `final_ln`): stages hold whole layers, as in Megatron-LM.

**Times** (seconds at `profiled.batch_size` = the micro-batch unit, and at each batch in
`batch_times`): each matrix product's time from the GEMM efficiency model below, its backward
as the two matrix products it runs (input gradient and weight gradient, at their own shapes:
about twice the forward); element-wise work (layer norms, softmax, dropout, GeLU, residual
adds) at the device's memory bandwidth, from the bytes it reads and writes (backward: 1.5x the
forward's bytes: it reads the output gradient and the saved input and writes the input
gradient). `split_times` are the same model at a tensor-parallel rank's narrower shapes
(degrees 2, 4, 8, up to the node's `max_degree`).

**GEMM efficiency model** (fp16/bf16 on tensor cores). An (M x K) @ (K x N) product, `count`
of them batched (attention), takes

    t = max(2 M N K count / (MAMF * q),  bytes / memory_bandwidth)
    q = (M N count) / (ceil(T / SMs) * SMs * tile_m * tile_n),  T = count ceil(M/tile_m) ceil(N/tile_n)

- MAMF, the maximum achievable matmul FLOP/s of the device, measured by Bekman's
  mamf-finder over a sweep of large shapes: A100 SXM 271.2 TFLOP/s BF16 (86.9 % of the 312
  peak), H100 SXM 794.5 TFLOP/s (80.3 % of 989). Source: "Maximum Achievable Matmul FLOPS
  comparison table", https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md#maximum-achievable-matmul-flops-comparison-table
  (measured with torch 2.6 / CUDA 12.6; Megatron-LM's 2021 runs had an older cuBLAS).
- q, the tile and wave quantization of NVIDIA's "Matrix Multiplication Background User's Guide"
  (https://docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication/index.html,
  sections "GPU Implementation", "Tile Quantization", "Wave Quantization"): cuBLAS tiles the
  output into thread-block tiles (256 x 128 the largest and most efficient on A100, either
  orientation; the better of the two is taken) and runs them in waves of one tile per SM (108
  SMs on A100, 132 on H100 SXM); a partial last tile or a partial last wave costs as much as a
  full one.
- bytes = 2 (M K + K N + M N) count (fp16 operands read once, output written once): the
  memory-bound floor of the same guide's arithmetic-intensity section, at the datasheet HBM
  bandwidth.

Nothing in this model is fitted to Megatron-LM's (or any training run's) throughput: the
ceiling is a single-GEMM benchmark, the shape penalty is the vendor's documented mechanism.
What it leaves out: kernel launch gaps, the smaller tiles and GEMV kernels cuBLAS picks for small
or thin problems (the model is meant for M, N >= 256, as in these graphs: M is batch x
sequence tokens), L2 reuse, clocks under a whole model's power draw.

**Memory.** `param_bytes` counts `param_bytes_per_param` bytes per parameter (default
`dtype_bytes`, the fp16 weights). The planner prices a node's parameter state as
param_bytes x (2 + k_opt) (weights, gradients, and k_opt = 2 Adam moments: 4x), i.e. 8 bytes per
fp16 parameter, while mixed-precision Adam as Megatron-LM runs it holds 16 (fp16 weights and
gradients, fp32 master weights and two fp32 moments): a job with `"mixed_precision": true`
prices exactly that (docs/formats.md, Job), which the Megatron-LM reproduction uses.
`param_bytes_per_param=4` remains as a knob (every parameter counted at fp32, its gradient
all-reduce too). Activations (`saved_bytes`) follow Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", arXiv 2205.05198, section 4.1): per
layer s b h (34 + 5 a s / h) bytes in fp16, of which s b h (24 + 5 a s / h) divide by the
tensor-parallel degree (without sequence parallelism: layer norms, the inputs of qkv and fc1
and the dropout masks stay whole): ln1 and ln2 keep their input (2 sbh) and the mask of the
residual dropout before them (sbh; layer 0's ln1: the embedding dropout's; final_ln the last
layer's), qkv and fc1 their input (2 sbh each), attn Q, K, V (6 sbh) and the softmax output,
its dropout mask and the dropout's output (5 a s^2 b), proj its input (2 sbh), gelu its input
(8 sbh), fc2 its input (8 sbh). The selective recompute of that paper (attention core rerun,
Q, K, V kept) is given as `selective_saved_bytes` / `selective_recompute_fraction` on `attn`.

**FLOPs** (`flops`, forward): qkv 6 b s h^2, attn 4 b s^2 h, proj 2 b s h^2, fc1 and fc2
8 b s h^2 each, lm_head 2 b s h V: per layer 24 b s h^2 + 4 b s^2 h, the terms of
Narayanan et al. 2021 (arXiv 2104.04473) eq. (3) (`megatron_step_flops`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence

from ..planner import Graph

TP_DEGREES = (2, 4, 8)               # split_times measured (modelled) at these degrees
BATCH_TIMES = (2, 4, 8, 16, 32, 64)  # multiples of the micro-batch unit in batch_times


@dataclasses.dataclass(frozen=True)
class GemmDevice:
    """What the GEMM efficiency model needs of a device (see the module docstring)."""
    name: str
    peak_flops: float             # datasheet dense fp16/bf16 tensor FLOP/s
    mamf_flops: float             # maximum achievable matmul FLOP/s (measured, cited)
    memory_bandwidth: float       # bytes/s, datasheet HBM
    sms: int                      # streaming multiprocessors: tiles per wave
    tile: tuple = (256, 128)      # cuBLAS's largest thread-block tile (the guide's A100 example)
    source: str = ""


MAMF_SOURCE = ("https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/"
               "README.md#maximum-achievable-matmul-flops-comparison-table")
QUANTIZATION_SOURCE = ("https://docs.nvidia.com/deeplearning/performance/"
                       "dl-performance-matrix-multiplication/index.html")

DEVICES: Dict[str, GemmDevice] = {
    "A100": GemmDevice("A100-SXM4-80GB", 312e12, 271.2e12, 2.039e12, 108,
                       source=f"MAMF 271.2 TFLOP/s BF16: {MAMF_SOURCE}; 108 SMs, tiles and "
                              f"waves: {QUANTIZATION_SOURCE}; 2,039 GB/s: A100 80GB datasheet"),
    "H100": GemmDevice("H100-SXM5-80GB", 989e12, 794.5e12, 3.35e12, 132,
                       source=f"MAMF 794.5 TFLOP/s BF16: {MAMF_SOURCE}; 132 SMs (H100 SXM5); "
                              f"tiles and waves: {QUANTIZATION_SOURCE}; 3.35 TB/s: H100 "
                              "datasheet"),
}


def device_for(name_or_cluster_device: str) -> GemmDevice:
    """The GemmDevice for "A100"/"H100" or a cluster's device name (e.g. "A100-SXM4-80GB")."""
    for key, dev in DEVICES.items():
        if name_or_cluster_device == key or name_or_cluster_device.upper().startswith(key):
            return dev
    raise ValueError(f"from_config: no GEMM efficiency data for device "
                     f"{name_or_cluster_device!r} (known: {sorted(DEVICES)})")


def gemm_time(m: int, n: int, k: int, dev: GemmDevice, count: int = 1,
              efficiency_scale: float = 1.0, dtype_bytes: int = 2) -> float:
    """Seconds for `count` (m x k) @ (k x n) products on `dev` (the module docstring's model);
    `efficiency_scale` multiplies the achievable FLOP/s (sensitivity studies)."""
    if min(m, n, k, count) < 1:
        raise ValueError(f"gemm_time: dimensions must be >= 1 (got m={m}, n={n}, k={k}, "
                         f"count={count})")
    best_q = 0.0
    for tm, tn in (dev.tile, dev.tile[::-1]):
        tiles = count * math.ceil(m / tm) * math.ceil(n / tn)
        waves = math.ceil(tiles / dev.sms)
        best_q = max(best_q, (m * n * count) / (waves * dev.sms * tm * tn))
    compute = 2.0 * m * n * k * count / (dev.mamf_flops * efficiency_scale * best_q)
    memory = dtype_bytes * (m * k + k * n + m * n) * count / dev.memory_bandwidth
    return max(compute, memory)


def gemm_efficiency(m: int, n: int, k: int, dev: GemmDevice, count: int = 1) -> float:
    """Achieved FLOP/s over the datasheet peak for that product (for tables and tests)."""
    return 2.0 * m * n * k * count / gemm_time(m, n, k, dev, count) / dev.peak_flops


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A GPT-style decoder: pre-LayerNorm blocks, 4h MLP with GeLU, learned positions, the LM
    head tied to the word embedding (GPT-2 / GPT-3 / Megatron-LM's GPT)."""
    name: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    ffn_hidden: Optional[int] = None   # default 4 * hidden
    dtype_bytes: int = 2               # activations and weights (fp16/bf16)
    param_bytes_per_param: Optional[int] = None  # what param_bytes counts; default dtype_bytes

    def __post_init__(self):
        for field in ("layers", "hidden", "heads", "seq_len", "vocab", "dtype_bytes"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TransformerConfig.{field} must be an integer >= 1 "
                                 f"(got {value!r})")
        if self.hidden % self.heads:
            raise ValueError(f"TransformerConfig: hidden ({self.hidden}) must be a multiple of "
                             f"heads ({self.heads})")
        for field in ("ffn_hidden", "param_bytes_per_param"):
            value = getattr(self, field)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"TransformerConfig.{field} must be an integer >= 1 or None "
                                 f"(got {value!r})")

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or 4 * self.hidden

    @property
    def weight_bytes(self) -> int:
        return self.param_bytes_per_param or self.dtype_bytes

    def num_parameters(self) -> int:
        """Parameters, the tied word embedding once."""
        h, f = self.hidden, self.ffn
        per_layer = (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h
        return self.layers * per_layer + self.vocab * h + self.seq_len * h + 2 * h


def megatron_step_flops(cfg: TransformerConfig, global_batch: int) -> float:
    """Model FLOPs of one training step as Narayanan et al. 2021 count them (eq. 3: forward,
    backward and the recomputed forward of every transformer layer, the LM head's forward and
    backward): 96 B s l h^2 (1 + s / 6h + V / 16 l h)."""
    b, s, l, h, v = global_batch, cfg.seq_len, cfg.layers, cfg.hidden, cfg.vocab
    return 96.0 * b * s * l * h * h * (1 + s / (6.0 * h) + v / (16.0 * l * h))


def _elementwise(bytes_moved: float, dev: GemmDevice) -> float:
    return bytes_moved / dev.memory_bandwidth


@dataclasses.dataclass
class _Node:
    """One node's description at micro-batch b and tensor-parallel degree t (t = 1: whole)."""
    name: str
    op: str
    fwd: float
    bwd: float
    flops: float
    param_count: int
    split_param_count: int
    output_bytes: int
    saved_bytes: int
    style: Optional[str] = None
    max_degree: int = 0
    activation_split: bool = False
    forward_collective: Optional[dict] = None
    backward_collective: Optional[dict] = None
    cut_before: bool = False


def _gemm_node_times(m: int, n: int, k: int, dev: GemmDevice, scale: float,
                     dtype_bytes: int) -> tuple:
    """(forward, backward) of a linear layer y = x W (x: m x k, W: k x n): backward is the
    input gradient (m x n @ n x k) and the weight gradient (k x m @ m x n)."""
    fwd = gemm_time(m, n, k, dev, 1, scale, dtype_bytes)
    bwd = (gemm_time(m, k, n, dev, 1, scale, dtype_bytes)
           + gemm_time(k, n, m, dev, 1, scale, dtype_bytes))
    return fwd, bwd


def _layer_nodes(cfg: TransformerConfig, i: int, b: int, t: int, dev: GemmDevice,
                 scale: float) -> List[_Node]:
    """Layer i's eight nodes at micro-batch b, as one rank of a t-way split runs them."""
    s, h, a, f, e = cfg.seq_len, cfg.hidden, cfg.heads, cfg.ffn, cfg.dtype_bytes
    tok = b * s
    sbh = tok * h                       # elements of one activation of width h
    if a % t:
        raise ValueError(f"from_config: tensor-parallel degree {t} does not divide the "
                         f"{a} heads")
    max_deg = math.gcd(a, f)            # whole heads per rank; the MLP splits alike
    ar = lambda nbytes: {"op": "all_reduce", "bytes": int(nbytes)}  # noqa: E731
    p = f"layers.{i}."
    nodes = []

    def ln(name: str, cut: bool) -> _Node:
        # keeps its input and the one-byte mask of the residual dropout before it
        fwd = _elementwise(2 * sbh * e, dev)
        return _Node(p + name, "layer_norm", fwd, 1.5 * fwd, 0.0, 2 * h, 0, sbh * e,
                     sbh * e + sbh, cut_before=cut)

    nodes.append(ln("ln1", True))
    fq, bq = _gemm_node_times(tok, 3 * h // t, h, dev, scale, e)
    nodes.append(_Node(p + "qkv", "linear", fq, bq, 6.0 * tok * h * h, 3 * h * h + 3 * h,
                       3 * h * h + 3 * h, 3 * sbh * e // t, sbh * e, "colwise", max_deg,
                       False, None, ar(sbh * e)))
    # attention core on this rank's heads: QK^T and attention-over-V as batched products,
    # Megatron's fused scale-mask-softmax (read and write the scores) and the dropout on the
    # probabilities (read, write, a one-byte mask) as element-wise passes
    n_heads = a // t * b
    d = h // a
    qk = gemm_time(s, s, d, dev, n_heads, scale, e)
    av = gemm_time(s, d, s, dev, n_heads, scale, e)
    scores = n_heads * s * s
    elem_f = _elementwise(scores * (2 * e + 2 * e + 1), dev)
    # backward: two products per forward product at their own shapes, 1.5x the element bytes
    qk_b = gemm_time(s, d, s, dev, n_heads, scale, e) + gemm_time(d, s, s, dev, n_heads, scale, e)
    av_b = gemm_time(s, s, d, dev, n_heads, scale, e) + gemm_time(s, d, s, dev, n_heads, scale, e)
    # Q, K, V; the softmax output, its dropout's one-byte mask and output: 5 a s^2 b in fp16
    attn_saved = (3 * sbh * e + (2 * e + 1) * a * s * s * b) // t
    attn = _Node(p + "attn", "attention", qk + av + elem_f, qk_b + av_b + 1.5 * elem_f,
                 4.0 * tok * s * h, 0, 0, sbh * e // t, attn_saved, "sharded", max_deg, True)
    nodes.append(attn)
    fp, bp = _gemm_node_times(tok, h, h // t, dev, scale, e)
    resid = _elementwise(4 * sbh * e, dev)   # bias-dropout-add: read 2, write 1, mask
    nodes.append(_Node(p + "proj", "linear", fp + resid, bp + 1.5 * resid, 2.0 * tok * h * h,
                       h * h + h, h * h, sbh * e, sbh * e // t, "rowwise", max_deg, True,
                       ar(sbh * e), None))
    nodes.append(ln("ln2", False))
    f1, b1 = _gemm_node_times(tok, f // t, h, dev, scale, e)
    nodes.append(_Node(p + "fc1", "linear", f1, b1, 2.0 * tok * h * f, h * f + f, h * f + f,
                       tok * f * e // t, sbh * e, "colwise", max_deg, False, None,
                       ar(sbh * e)))
    g = _elementwise(2 * tok * f * e // t, dev)   # fused bias-GeLU: read and write
    nodes.append(_Node(p + "gelu", "gelu", g, 1.5 * g, 0.0, 0, 0, tok * f * e // t,
                       tok * f * e // t, "sharded", max_deg, True))
    f2, b2 = _gemm_node_times(tok, h, f // t, dev, scale, e)
    nodes.append(_Node(p + "fc2", "linear", f2 + resid, b2 + 1.5 * resid, 2.0 * tok * f * h,
                       f * h + h, f * h, sbh * e, tok * f * e // t, "rowwise", max_deg, True,
                       ar(sbh * e), None))
    return nodes


def _all_nodes(cfg: TransformerConfig, b: int, t: int, dev: GemmDevice, scale: float,
               parallel_cross_entropy: bool) -> List[_Node]:
    s, h, v, e = cfg.seq_len, cfg.hidden, cfg.vocab, cfg.dtype_bytes
    tok = b * s
    sbh = tok * h
    # embedding: a gather of b s rows of the (V/t)-row table plus positions, dropout; backward
    # scatters the gradient into the table (element-wise bytes of the rows touched)
    emb_f = _elementwise(3 * sbh * e, dev)
    nodes = [_Node("embedding", "embedding", emb_f, 2 * emb_f, 0.0, v * h + s * h, v * h,
                   sbh * e, 0, "vocab_rowwise", _vocab_degree(v), False,
                   {"op": "all_reduce", "bytes": int(sbh * e)}, None, True)]
    for i in range(cfg.layers):
        nodes += _layer_nodes(cfg, i, b, t, dev, scale)
    fl = _elementwise(2 * sbh * e, dev)
    nodes.append(_Node("final_ln", "layer_norm", fl, 1.5 * fl, 0.0, 2 * h, 0, sbh * e,
                       sbh * e + sbh, cut_before=True))
    vt = -(-v // t)
    fh, bh = _gemm_node_times(tok, vt, h, dev, scale, e)
    if parallel_cross_entropy:
        # Megatron-LM's vocab-parallel cross-entropy: the logits stay split; three fp32 values
        # per token (max, sum of exponentials, the target's logit) are all-reduced
        fwd_coll = {"op": "all_reduce", "bytes": int(3 * 4 * tok)}
    else:
        fwd_coll = {"op": "all_gather", "bytes": int(tok * v * e)}
    nodes.append(_Node("lm_head", "linear", fh, bh, 2.0 * tok * h * v, 0, 0, tok * v * e,
                       sbh * e, "colwise_gather", _vocab_degree(v), False, fwd_coll,
                       {"op": "all_reduce", "bytes": int(sbh * e)}))
    return nodes


def _vocab_degree(v: int) -> int:
    """The largest power-of-two degree (<= 64) the vocabulary splits evenly into."""
    d = 1
    while d < 64 and v % (2 * d) == 0:
        d *= 2
    return d


def graph_from_config(cfg: TransformerConfig, device: str = "A100", micro_batch: int = 1,
                      efficiency_scale: float = 1.0, parallel_cross_entropy: bool = False,
                      tp_degrees: Sequence[int] = TP_DEGREES,
                      batch_multiples: Sequence[int] = BATCH_TIMES,
                      vocab_multiple: int = 128) -> dict:
    """The Graph JSON (a dict; `hybridplan.planner.Graph.from_dict` validates it) of `cfg` on
    `device` ("A100", "H100" or a cluster's device name), profiled at `micro_batch` sequences,
    with batch_times at `micro_batch` x `batch_multiples` and split_times at `tp_degrees` (those
    dividing each node's max_degree). `efficiency_scale` multiplies the GEMM model's achievable
    FLOP/s; `parallel_cross_entropy`: the LM head's forward collective is Megatron-LM's
    vocab-parallel cross-entropy's small all-reduce instead of gathering the logits (what
    DTensor's ColwiseParallel(output_layouts=Replicate()) does). The vocabulary is padded up
    to a multiple of `vocab_multiple` (Megatron-LM's --make-vocab-size-divisible-by, default
    128; GPT-2's 50257 becomes 50304) so that the embedding and the LM head split evenly."""
    dev = device_for(device)
    if not isinstance(vocab_multiple, int) or vocab_multiple < 1:
        raise ValueError(f"graph_from_config: vocab_multiple must be an integer >= 1 "
                         f"(got {vocab_multiple!r})")
    cfg = dataclasses.replace(cfg, vocab=-(-cfg.vocab // vocab_multiple) * vocab_multiple)
    if not isinstance(micro_batch, int) or micro_batch < 1:
        raise ValueError(f"graph_from_config: micro_batch must be an integer >= 1 "
                         f"(got {micro_batch!r})")
    if not efficiency_scale > 0:
        raise ValueError(f"graph_from_config: efficiency_scale must be > 0 "
                         f"(got {efficiency_scale!r})")
    build = lambda b, t: _all_nodes(cfg, b, t, dev, efficiency_scale,  # noqa: E731
                                    parallel_cross_entropy)
    base = build(micro_batch, 1)
    batches = [micro_batch * m for m in batch_multiples if m > 1]
    at_batch = {bb: build(bb, 1) for bb in batches}
    degrees = sorted(set(int(d) for d in tp_degrees))
    at_degree = {d: build(micro_batch, d) for d in degrees if cfg.heads % d == 0}
    wb = cfg.weight_bytes
    nodes = []
    for idx, n in enumerate(base):
        node = {"id": idx, "name": n.name, "op": n.op, "forward_s": n.fwd, "backward_s": n.bwd,
                "param_bytes": n.param_count * wb, "output_bytes": int(n.output_bytes),
                "saved_bytes": int(n.saved_bytes), "flops": n.flops,
                # weight and bias (layer norms: scale and shift; embedding: word and position
                # tables); the LM head's word table is counted at the embedding
                "param_tensors": 2 if n.param_count else 0}
        if not n.cut_before:
            node["cut_before"] = False
        if batches:
            node["batch_times"] = [{"batch_size": bb, "forward_s": at_batch[bb][idx].fwd,
                                    "backward_s": at_batch[bb][idx].bwd} for bb in batches]
        if n.op == "attention":
            # Korthikanti et al.'s selective recompute: keep Q, K, V, rerun the core
            node["selective_saved_bytes"] = int(6 * micro_batch * cfg.seq_len * cfg.hidden
                                                * cfg.dtype_bytes)
            node["selective_recompute_fraction"] = 1.0
        else:   # nothing to rerun: keeps what it keeps (given so a stage recomputes alike)
            node["selective_saved_bytes"] = int(n.saved_bytes)
            node["selective_recompute_fraction"] = 0.0
        if n.style is not None:
            tp = {"style": n.style, "max_degree": int(n.max_degree),
                  "split_param_bytes": n.split_param_count * wb,
                  "activation_split": bool(n.activation_split)}
            if n.forward_collective:
                tp["forward_collective"] = n.forward_collective
            if n.backward_collective:
                tp["backward_collective"] = n.backward_collective
            splits = [{"degree": d, "forward_s": at_degree[d][idx].fwd,
                       "backward_s": at_degree[d][idx].bwd}
                      for d in sorted(at_degree) if n.max_degree % d == 0]
            if splits:
                tp["split_times"] = splits
            node["tensor_parallel"] = tp
        nodes.append(node)
    edges = _edges(cfg, base, micro_batch)
    h, e = cfg.hidden, cfg.dtype_bytes
    return {
        "schema_version": 1, "kind": "hybridplan.graph", "name": cfg.name,
        "profiled": {"device": dev.name, "batch_size": micro_batch,
                     "dtype": {2: "float16", 4: "float32"}.get(e, f"{8 * e}-bit"),
                     "input_bytes": 8 * micro_batch * cfg.seq_len,
                     # the cross-entropy's backward holds two logits-sized gradients
                     "loss_backward_bytes": 2 * micro_batch * cfg.seq_len * cfg.vocab * e},
        "nodes": nodes,
        "edges": edges,
        "tied_params": [{"nodes": [0, len(nodes) - 1], "bytes": cfg.vocab * h * cfg.weight_bytes}],
    }


def _edges(cfg: TransformerConfig, nodes: List[_Node], b: int) -> List[dict]:
    """The dataflow: each layer's chain, plus the residual stream into proj (the attention's
    residual add) and fc2 (the MLP's)."""
    resid = b * cfg.seq_len * cfg.hidden * cfg.dtype_bytes
    index = {n.name: i for i, n in enumerate(nodes)}
    edges = []
    prev = index["embedding"]          # the residual stream entering layer 0
    for i in range(cfg.layers):
        p = f"layers.{i}."
        chain = [index[p + k] for k in ("ln1", "qkv", "attn", "proj", "ln2", "fc1", "gelu",
                                        "fc2")]
        edges.append({"src": prev, "dst": chain[0], "bytes": resid})
        for a, c in zip(chain, chain[1:]):
            edges.append({"src": a, "dst": c})
        edges.append({"src": prev, "dst": chain[3], "bytes": resid})    # x into x + attn
        edges.append({"src": chain[3], "dst": chain[7], "bytes": resid})  # into + mlp
        prev = chain[7]
    edges.append({"src": prev, "dst": index["final_ln"], "bytes": resid})
    edges.append({"src": index["final_ln"], "dst": index["lm_head"]})
    return edges


def graph(cfg: TransformerConfig, **kwargs):
    """graph_from_config as a validated hybridplan.planner.Graph."""
    return Graph.from_dict(graph_from_config(cfg, **kwargs), f"from_config:{cfg.name}")
