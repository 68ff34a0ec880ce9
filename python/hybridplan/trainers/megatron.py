"""Megatron-LM's command-line arguments (megatron/training/arguments.py; the parallel sizes are
Megatron-Core's ModelParallelConfig fields, recompute its TransformerConfig's).

    --tensor-model-parallel-size T --pipeline-model-parallel-size P
    --num-layers-per-virtual-pipeline-stage L | --num-virtual-stages-per-pipeline-rank V
    --micro-batch-size B --global-batch-size G --sequence-parallel
    --recompute-granularity full|selective --recompute-method uniform --recompute-num-layers 1
    --use-distributed-optimizer [--num-distributed-optimizer-instances R]
    --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params
    --ckpt-format fsdp_dtensor
    --bf16 | --fp16

The data-parallel size is what the world size leaves: world / (T * P). Megatron runs G / (B *
dp) micro-batches a step (megatron/core/num_microbatches_calculator.py, which requires B * dp to
divide G): a plan's accumulation steps K are G = B * micro-batches * K * dp; without a pipeline
they are accumulated one after another (read back: K = G / (B * dp), per-replica batch B),
under one they all run in one pipeline schedule (read back: one schedule of G / (B * dp)
micro-batches, K = 1). Megatron runs 1F1B, and
its interleaved 1F1B with virtual stages; its distributed optimizer shards the optimizer state
and reduce-scatters the gradients (ZeRO-2's traffic), over R instances for hybrid sharding;
Megatron-FSDP shards the parameters too (ZeRO-3).
"""

from __future__ import annotations

import re
import shlex
from typing import Dict, List, Optional

from .layout import Capabilities, Layout

CAPABILITIES = Capabilities(
    name="Megatron-LM",
    schedules={"1f1b": "1F1B", "interleaved-1f1b": "interleaved 1F1B"},
    shardings=("none", "zero2", "zero3"), tensor_parallel=True, hybrid_sharding=True,
    sequence_parallel_optional=True, pipeline_accumulates=True)


def write(layout: Layout, num_layers: Optional[int] = None) -> str:
    args: List[str] = [f"--tensor-model-parallel-size {layout.tp}",
                       f"--pipeline-model-parallel-size {layout.pp}"]
    if layout.virtual_stages > 1:
        stages = layout.pp * layout.virtual_stages
        if num_layers is not None and num_layers % stages == 0:
            args.append(f"--num-layers-per-virtual-pipeline-stage {num_layers // stages}")
        else:
            args.append(f"--num-virtual-stages-per-pipeline-rank {layout.virtual_stages}")
    args += [f"--micro-batch-size {layout.micro_batch}",
             f"--global-batch-size {layout.global_batch}"]
    if layout.sequence_parallel:
        args.append("--sequence-parallel")
    if layout.recompute == "full":
        args += ["--recompute-granularity full", "--recompute-method uniform",
                 "--recompute-num-layers 1"]
    elif layout.recompute == "selective":
        args.append("--recompute-granularity selective")
    if layout.sharding == "zero2":
        args.append("--use-distributed-optimizer")
        if layout.dp_replicate > 1:
            args.append(f"--num-distributed-optimizer-instances {layout.dp_replicate}")
    elif layout.sharding == "zero3":
        # validate_args: "Megatron FSDP only supports fsdp_dtensor checkpoint format"
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy optim_grads_params",
                 "--ckpt-format fsdp_dtensor"]
        if layout.dp_replicate > 1:
            args.append(f"--num-distributed-optimizer-instances {layout.dp_replicate}")
    if layout.precision in ("bf16", "fp16"):
        args.append(f"--{layout.precision}")
    header = (f"# Megatron-LM arguments written by `hybridplan export --to megatron`; add your "
              f"model's.\n# Megatron reads the world size from torchrun: WORLD_SIZE="
              f"{layout.world_size} (data-parallel size {layout.dp})")
    # validate_args' rules on the launch environment (before Blackwell GPUs)
    if layout.sharding == "zero3":
        header += ("\n# launch with CUDA_DEVICE_MAX_CONNECTIONS unset or above 1: Megatron-FSDP "
                   "refuses 1")
    elif layout.tp > 1:
        header += ("\n# launch with CUDA_DEVICE_MAX_CONNECTIONS=1: Megatron-LM requires it with "
                   "tensor parallelism")
    return header + "\n" + " \\\n".join(args) + "\n"


def _options(text: str, source: str) -> Dict[str, Optional[str]]:
    lines = [ln.split("#", 1)[0] for ln in text.splitlines()]
    try:
        words = shlex.split(" ".join(ln.rstrip().rstrip("\\") for ln in lines))
    except ValueError as e:
        raise ValueError(f"{source}: cannot be split into arguments ({e})") from None
    options: Dict[str, Optional[str]] = {}
    for i, word in enumerate(words):
        if word.startswith("--"):
            key, eq, value = word.partition("=")
            nxt = words[i + 1] if i + 1 < len(words) else None
            options[key] = value if eq else (None if nxt is None or nxt.startswith("--")
                                             else nxt)
    return options


def _int(options: Dict[str, Optional[str]], key: str, default: Optional[int],
         source: str) -> Optional[int]:
    value = options.get(key)
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"{source}: {key} must be an integer >= 1 (got {value!r})")
    return number


def _launcher_world_size(options: Dict[str, Optional[str]], source: str) -> Optional[int]:
    """nnodes x nproc-per-node when the file holds the torchrun command line that launches
    Megatron (`torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py ...`), else None."""
    per_node = next((options[k] for k in ("--nproc-per-node", "--nproc_per_node")
                     if k in options), None)
    if per_node is None:
        return None
    nodes = next((options[k] for k in ("--nnodes",) if k in options), "1")
    values = []
    for key, value in (("--nproc-per-node", per_node), ("--nnodes", nodes)):
        if value is None or not value.isdigit() or int(value) < 1:
            raise ValueError(f"{source}: torchrun's {key} must be an integer >= 1 for the "
                             f"world size (got {value!r})")
        values.append(int(value))
    return values[0] * values[1]


def read(text: str, source: str = "Megatron-LM arguments", num_layers: Optional[int] = None,
         world_size: Optional[int] = None) -> Layout:
    """The layout of Megatron-LM arguments. Megatron derives its data-parallel size from the
    world size: `world_size`, else torchrun's --nnodes x --nproc-per-node when the file holds
    the launch line, else the WORLD_SIZE= that export writes in its header."""
    o = _options(text, source)
    layers = _int(o, "--num-layers", None, source)
    if layers is not None and num_layers is not None and layers != num_layers:
        raise ValueError(f"{source}: --num-layers must be the graph's layer count {num_layers} "
                         f"(got {layers})")
    num_layers = num_layers or layers
    tp = _int(o, "--tensor-model-parallel-size", 1, source)
    pp = _int(o, "--pipeline-model-parallel-size", 1, source)
    micro = _int(o, "--micro-batch-size", None, source)
    if micro is None:
        raise ValueError(f"{source}: --micro-batch-size must be given (got none)")
    global_batch = _int(o, "--global-batch-size", None, source)
    if world_size is None:
        world_size = _launcher_world_size(o, source)
    if world_size is None:
        found = re.search(r"WORLD_SIZE=(\d+)", text)   # the header export writes
        world_size = int(found.group(1)) if found else None
    if world_size is None:
        raise ValueError(f"{source}: the world size must be given (--world-size, torchrun's "
                         f"--nnodes and --nproc-per-node in the file, or a WORLD_SIZE= line): "
                         f"Megatron's data-parallel size is world / (tensor * pipeline) "
                         f"(got none)")
    if world_size % (tp * pp):
        raise ValueError(f"{source}: world size must be a multiple of tensor x pipeline sizes "
                         f"{tp} x {pp} (got {world_size})")
    dp = world_size // (tp * pp)
    global_batch = global_batch or micro * dp   # arguments.py's default: one micro-batch
    # num_microbatches_calculator (ConstantNumMicroBatchesCalculator): the global batch runs as
    # global / (micro x dp) micro-batches a step, which must divide evenly
    if global_batch % (micro * dp):
        raise ValueError(f"{source}: --global-batch-size must be a multiple of --micro-batch-size "
                         f"{micro} x the data-parallel size {dp} (Megatron's micro-batch count "
                         f"per step; got {global_batch})")
    microbatches = global_batch // (micro * dp)
    vs = 1
    if "--num-virtual-stages-per-pipeline-rank" in o:
        vs = _int(o, "--num-virtual-stages-per-pipeline-rank", 1, source)
    elif "--num-layers-per-virtual-pipeline-stage" in o:
        per_stage = _int(o, "--num-layers-per-virtual-pipeline-stage", 1, source)
        if num_layers is None:
            raise ValueError(f"{source}: --num-layers-per-virtual-pipeline-stage needs the "
                             f"model's layer count (--num-layers, or a graph)")
        vs = num_layers // (per_stage * pp)
    granularity = o.get("--recompute-granularity") if "--recompute-granularity" in o else None
    if "--recompute-activations" in o:
        granularity = "selective"   # Megatron's shorthand for selective recompute
    if granularity not in (None, "full", "selective"):
        raise ValueError(f"{source}: --recompute-granularity must be full or selective "
                         f"(got {granularity!r})")
    sharding = "none"
    if "--use-megatron-fsdp" in o or "--use-torch-fsdp2" in o:
        sharding = "zero3"
    elif "--use-distributed-optimizer" in o:
        sharding = "zero2"
    instances = _int(o, "--num-distributed-optimizer-instances", 1, source)
    if sharding != "none" and dp % instances:
        raise ValueError(f"{source}: --num-distributed-optimizer-instances must divide the "
                         f"data-parallel size {dp} (got {instances})")
    shard = dp // instances if sharding != "none" else 1
    return Layout(dp_replicate=dp // shard, dp_shard=shard, tp=tp, pp=pp,
                  schedule=("interleaved-1f1b" if vs > 1 else "1f1b") if pp > 1 else "none",
                  virtual_stages=vs, micro_batch=micro, global_batch=global_batch,
                  recompute=granularity or "none", sharding=sharding,
                  precision=_precision(o, source), sequence_parallel="--sequence-parallel" in o,
                  # without a pipeline the micro-batches accumulate one after another: the
                  # plan's accumulation steps; under one they run in one schedule
                  accumulation_steps=microbatches if pp == 1 else 1)


def _precision(options: Dict[str, Optional[str]], source: str) -> str:
    """--bf16 or --fp16 (Megatron's validate_args refuses both), else fp32."""
    if "--bf16" in options and "--fp16" in options:
        raise ValueError(f"{source}: --bf16 and --fp16 must not both be given (Megatron-LM "
                         f"refuses both)")
    return "bf16" if "--bf16" in options else "fp16" if "--fp16" in options else "fp32"
