"""DeepSpeed's JSON configuration (deepspeed/runtime/config.py's keys).

    train_batch_size = train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp
    zero_optimization.stage 0 | 2 | 3 (read: mics_shard_size, the ZeRO-3 shard groups of the
                                       DeepSpeed versions before MiCS was removed, i.e. HSDP)
    tensor_parallel.autotp_size (AutoTP training), bf16.enabled, fp16.enabled (its dynamic loss
    scaler), activation_checkpointing

A plan's accumulation steps K are gradient_accumulation_steps (times a pipeline's micro-batches:
DeepSpeed's pipeline engine runs gradient_accumulation_steps micro-batches in one schedule).

DeepSpeed's pipeline engine takes its stages in code (deepspeed.pipe.PipelineModule(layers,
num_stages=...)), not in this file: a pipeline plan is written with its micro-batches as
gradient-accumulation steps, the stage count said in words. Its activation checkpointing section
configures deepspeed.checkpointing, which the model's own code calls on each layer.
"""

from __future__ import annotations

import json
from typing import Optional

from .layout import Capabilities, Layout

CAPABILITIES = Capabilities(
    name="DeepSpeed",
    # PipelineModule runs its own 1F1B-like TrainSchedule; the stages are set in code
    schedules={"1f1b": "TrainSchedule"},
    # hybrid sharding was MiCS (zero_optimization.mics_shard_size), which DeepSpeed 0.19.8
    # refuses ("MiCS ZeRO-3 sharding has been removed"): export writes one shard group
    shardings=("none", "zero2", "zero3"), tensor_parallel=True, hybrid_sharding=False,
    sequence_parallel_optional=True, recompute_kinds=("none", "full"), sequence_parallel=False,
    # partition_method "uniform" splits PipelineModule's layer list evenly, the first parts one
    # longer: [embedding, layers..., head] makes the embedding and head a layer each
    stage_split="layers+ends", pipeline_accumulates=True,
    pipeline_sharding_note="DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3 (\"ZeRO-2 and "
                           "ZeRO-3 are incompatible with pipeline parallelism\"); wrote ZeRO "
                           "stage 1 (the optimizer state sharded), which reads back as 'zero2'",
    pipeline_note="DeepSpeed sets its stages in code (deepspeed.pipe.PipelineModule(layers, "
                  "num_stages=N)); written under hybridplan_pipeline for the reader, with the "
                  "micro-batches as gradient_accumulation_steps")

_STAGE = {"none": 0, "zero2": 2, "zero3": 3}


def write(layout: Layout, num_layers: Optional[int] = None) -> str:
    # micro x accumulation x dp = train_batch_size, which DeepSpeed checks
    accumulation = layout.num_microbatches * layout.accumulation_steps
    d = {"train_batch_size": layout.global_batch,
         "train_micro_batch_size_per_gpu": layout.micro_batch,
         "gradient_accumulation_steps": accumulation,
         # under a pipeline, ZeRO-1 at most (deepspeed/runtime/pipe/engine.py)
         "zero_optimization": {"stage": min(_STAGE[layout.sharding], 1) if layout.pp > 1
                               else _STAGE[layout.sharding]},
         "bf16": {"enabled": layout.precision == "bf16"},
         "fp16": {"enabled": layout.precision == "fp16"}}
    if layout.tp > 1:
        d["tensor_parallel"] = {"autotp_size": layout.tp}
    if layout.recompute != "none":
        d["activation_checkpointing"] = {"partition_activations": False,
                                         "contiguous_memory_optimization": False,
                                         "cpu_checkpointing": False}
    if layout.pp > 1:
        # not a DeepSpeed key (its JSON has none for stages): read back by `parse`, ignored
        # by DeepSpeed's config class, which keeps unknown top-level keys
        d["hybridplan_pipeline"] = {"num_stages": layout.pp,
                                    "schedule": "1f1b", "partition_method": "uniform"}
    return json.dumps(d, indent=2) + "\n"


def read(text: str, source: str = "DeepSpeed config",
         num_layers: Optional[int] = None) -> Layout:
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: not JSON ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{source}: $ must be a JSON object (got {type(d).__name__})")
    stage = int(d.get("zero_optimization", {}).get("stage", 0))
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"{source}: zero_optimization.stage must be 0..3 (got {stage})")
    # ZeRO-1 shards only the optimizer state: hybridplan's nearest is ZeRO-2
    sharding = {0: "none", 1: "zero2", 2: "zero2", 3: "zero3"}[stage]
    micro = int(d.get("train_micro_batch_size_per_gpu", 1))
    accumulation = int(d.get("gradient_accumulation_steps", 1))
    pipe = d.get("hybridplan_pipeline", {})
    pp = int(pipe.get("num_stages", 1))
    tp = int(d.get("tensor_parallel", {}).get("autotp_size", 0) or 1)
    if "train_batch_size" not in d:
        raise ValueError(f"{source}: train_batch_size must be given: with the micro-batch and "
                         f"accumulation steps it fixes the data-parallel size (got none)")
    global_batch = int(d["train_batch_size"])
    if global_batch % (micro * accumulation):
        raise ValueError(f"{source}: train_batch_size must be a multiple of "
                         f"train_micro_batch_size_per_gpu x gradient_accumulation_steps = "
                         f"{micro * accumulation} (got {global_batch})")
    dp = global_batch // (micro * accumulation)
    # without a pipeline, the steps accumulated; under one, its micro-batches
    steps = accumulation if pp == 1 else 1
    mics = int(d.get("zero_optimization", {}).get("mics_shard_size", -1))
    shard = dp if sharding != "none" else 1
    if sharding == "zero3" and 0 < mics < dp:
        shard = mics
    recompute = "full" if d.get("activation_checkpointing") else "none"
    precision = ("bf16" if d.get("bf16", {}).get("enabled", False) else
                 "fp16" if d.get("fp16", {}).get("enabled", False) else "fp32")
    return Layout(dp_replicate=dp // shard, dp_shard=shard, tp=tp, pp=pp,
                  schedule="1f1b" if pp > 1 else "none", micro_batch=micro,
                  global_batch=global_batch, recompute=recompute, sharding=sharding,
                  precision=precision, sequence_parallel=False, accumulation_steps=steps)
