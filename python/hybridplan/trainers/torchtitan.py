"""torchtitan's TOML job configuration (torchtitan/config/job_config.py up to v0.2; the later
Python configurations take the same fields as `--section.option` flags).

    [parallelism]  data_parallel_replicate_degree, data_parallel_shard_degree,
                   fsdp_reshard_after_forward, tensor_parallel_degree, pipeline_parallel_degree,
                   pipeline_parallel_schedule, pipeline_parallel_microbatch_size,
                   pipeline_parallel_layers_per_stage
    [training]     local_batch_size (per data-parallel rank and accumulation step),
                   global_batch_size (gradient_accumulation_steps = global_batch_size /
                   (local_batch_size x data-parallel degree), torchtitan's Trainer computes it),
                   mixed_precision_param (bfloat16 or float32: no fp16), mixed_precision_reduce
    [activation_checkpoint] mode, selective_ac_option
    [compile]      enable

torchtitan's TP always splits the norms' sequence (SequenceParallel on every norm), and it
counts the embedding and the output layer as one layer each when it splits stages.
"""

from __future__ import annotations

import math
import sys
try:  # Python 3.11+; the package supports 3.10, where reading a TOML config is refused (read)
    import tomllib
except ModuleNotFoundError:  # pragma: no cover (3.10)
    tomllib = None
from typing import Optional

from .layout import Capabilities, Layout

CAPABILITIES = Capabilities(
    name="torchtitan",
    # torch.distributed.pipelining's class names, as torchtitan looks them up
    schedules={"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
               "interleaved-zb": "InterleavedZeroBubble", "zbv": "ZBVZeroBubble"},
    shardings=("none", "zero2", "zero3"), tensor_parallel=True, hybrid_sharding=True,
    sequence_parallel_optional=False,
    # generate_llm_fqn_per_model_part: the embedding and the output count as a layer each
    stage_split="layers+ends",
    # TrainingConfig.mixed_precision_param: Literal["bfloat16", "float32"]
    precisions=("fp32", "bf16"))

_RESHARD = {"zero2": "never", "zero3": "always"}
_DEFAULT_STAGES_PER_RANK = 2   # torchtitan's multi-stage schedules without layers_per_stage


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


def _layers_per_stage(layout: Layout, num_layers: Optional[int]) -> Optional[int]:
    """The pipeline_parallel_layers_per_stage giving pp * virtual_stages stages, or None when
    torchtitan's default already does (it counts the embedding and output as a layer each)."""
    multi = layout.schedule in ("interleaved-1f1b", "interleaved-zb", "zbv")
    default = _DEFAULT_STAGES_PER_RANK if multi else 1
    if layout.pp == 1 or layout.virtual_stages == default or num_layers is None:
        return None
    stages = layout.pp * layout.virtual_stages
    per_stage = math.ceil((num_layers + 2) / stages)
    return per_stage if math.ceil((num_layers + 2) / per_stage) == stages else None


def write(layout: Layout, num_layers: Optional[int] = None) -> str:
    parallelism = {
        "data_parallel_replicate_degree": layout.dp_replicate,
        "data_parallel_shard_degree": layout.dp_shard,
        "tensor_parallel_degree": layout.tp,
        "pipeline_parallel_degree": layout.pp,
    }
    if layout.sharding != "none":
        parallelism["fsdp_reshard_after_forward"] = _RESHARD[layout.sharding]
    if layout.pp > 1:
        parallelism["pipeline_parallel_schedule"] = CAPABILITIES.schedules[layout.schedule]
        parallelism["pipeline_parallel_microbatch_size"] = layout.micro_batch
        per_stage = _layers_per_stage(layout, num_layers)
        if per_stage is not None:
            parallelism["pipeline_parallel_layers_per_stage"] = per_stage
    dtype = "bfloat16" if layout.precision == "bf16" else "float32"
    # torchtitan accumulates global_batch_size / (local_batch_size x dp) steps, each running
    # the pipeline schedule (local_batch_size / pipeline_parallel_microbatch_size micro-batches)
    training = {"local_batch_size": layout.per_replica_batch,
                "global_batch_size": layout.global_batch,
                "mixed_precision_param": dtype, "mixed_precision_reduce": "float32"}
    ac = {"mode": layout.recompute}
    if layout.recompute == "selective":
        ac["selective_ac_option"] = "op"   # per-op: keeps the matmuls' outputs, as the plan
    sections = {"training": training, "parallelism": parallelism,
                "activation_checkpoint": ac, "compile": {"enable": False}}
    lines = ["# torchtitan job configuration written by `hybridplan export --to torchtitan`",
             "# (the model, optimizer and data sections are yours to add)"]
    for section, values in sections.items():
        lines += ["", f"[{section}]"] + [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def read(text: str, source: str = "torchtitan config",
         num_layers: Optional[int] = None) -> Layout:
    if tomllib is None:
        raise ValueError(f"{source}: reading TOML needs Python 3.11's tomllib (this is "
                         f"Python {sys.version.split()[0]})")
    try:
        d = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{source}: not TOML ({e})") from None
    par, train = d.get("parallelism", {}), d.get("training", {})
    replicate = int(par.get("data_parallel_replicate_degree", 1))
    shard = int(par.get("data_parallel_shard_degree", -1))
    if shard < 1:
        raise ValueError(f"{source}: parallelism.data_parallel_shard_degree must be given and "
                         f">= 1: the leftover ranks it means by -1 depend on the world size "
                         f"(got {shard})")
    pp = int(par.get("pipeline_parallel_degree", 1))
    names = {v: k for k, v in CAPABILITIES.schedules.items()}
    schedule = "none"
    vs = 1
    if pp > 1:
        name = par.get("pipeline_parallel_schedule", "1F1B")
        if name not in names:
            raise ValueError(f"{source}: parallelism.pipeline_parallel_schedule must be among "
                             f"{sorted(names)} (got {name!r})")
        schedule = names[name]
        multi = schedule in ("interleaved-1f1b", "interleaved-zb", "zbv")
        vs = _DEFAULT_STAGES_PER_RANK if multi else 1
        per_stage = par.get("pipeline_parallel_layers_per_stage")
        if per_stage is not None and num_layers is not None:
            vs = math.ceil((num_layers + 2) / int(per_stage)) // pp
    local = int(train.get("local_batch_size", 8))
    dp = replicate * shard
    global_batch = int(train.get("global_batch_size", -1))
    if global_batch <= 0:
        global_batch = local * dp   # torchtitan's default: no accumulation
    if global_batch % (local * dp):
        raise ValueError(f"{source}: training.global_batch_size must be a multiple of "
                         f"local_batch_size x the data-parallel degree = {local * dp} (got "
                         f"{global_batch})")
    mode = d.get("activation_checkpoint", {}).get("mode", "selective")
    if mode not in ("none", "full", "selective"):
        raise ValueError(f"{source}: activation_checkpoint.mode must be none, full or "
                         f"selective (got {mode!r})")
    sharding = "none"
    if shard > 1:
        # "default" reshards after forward (ZeRO-3) but under a pipeline, where torchtitan
        # keeps the parameters gathered across the micro-batches (ZeRO-2)
        reshard = par.get("fsdp_reshard_after_forward", "default")
        sharding = "zero2" if reshard == "never" or (reshard == "default" and pp > 1) \
            else "zero3"
    tp = int(par.get("tensor_parallel_degree", 1))
    return Layout(dp_replicate=replicate if shard > 1 else dp, dp_shard=shard if shard > 1 else 1,
                  tp=tp, pp=pp, schedule=schedule, virtual_stages=vs,
                  micro_batch=int(par.get("pipeline_parallel_microbatch_size", 1))
                  if pp > 1 else local,
                  global_batch=global_batch, accumulation_steps=global_batch // (local * dp),
                  recompute=mode, sharding=sharding,
                  precision="bf16" if train.get("mixed_precision_param", "bfloat16")
                  == "bfloat16" else "fp32",
                  sequence_parallel=tp > 1)
