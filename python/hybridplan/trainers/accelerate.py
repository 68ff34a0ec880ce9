"""Hugging Face Accelerate's configuration YAML (`accelerate launch --config_file F`), FSDP2.

    distributed_type: FSDP (sharded) | MULTI_GPU (DDP) | NO, num_processes, num_machines,
    mixed_precision: bf16 | fp16 | no
    fsdp_config: fsdp_version 2, fsdp_reshard_after_forward (true: ZeRO-3, false: ZeRO-2),
                 fsdp_activation_checkpointing, fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP
    parallelism_config: parallelism_config_dp_replicate_size, _dp_shard_size, _tp_size
                 (Accelerate's ParallelismConfig: HSDP and tensor parallelism under FSDP2)

Accelerate has no pipeline parallelism in its configuration, and one activation-checkpointing
switch (full recompute of each wrapped layer). Its file holds no gradient-accumulation steps
outside DeepSpeed (ClusterConfig refuses unknown keys; `accelerate launch
--gradient_accumulation_steps` reaches DeepSpeed launches only): the Accelerator takes them
(Accelerator(gradient_accumulation_steps=K), or ACCELERATE_GRADIENT_ACCUMULATION_STEPS=K in the
launch's environment, which it reads when not given), so export writes them as comments, the
batch line included.
"""

from __future__ import annotations

from typing import Optional

from .layout import Capabilities, Layout

CAPABILITIES = Capabilities(
    name="Accelerate", schedules={}, shardings=("none", "zero2", "zero3"),
    tensor_parallel=True, hybrid_sharding=True, sequence_parallel_optional=True,
    recompute_kinds=("none", "full"), sequence_parallel=False, tp_needs_sharding=True,
    accumulation_note="Accelerate's configuration file has no key for them outside DeepSpeed; "
                      "written as comments: set ACCELERATE_GRADIENT_ACCUMULATION_STEPS in the "
                      "launch's environment or Accelerator(gradient_accumulation_steps=) in "
                      "your script")


def write(layout: Layout, num_layers: Optional[int] = None, devices_per_node: int = 8) -> str:
    machines = max(1, -(-layout.world_size // devices_per_node))
    lines = ["# Accelerate config written by `hybridplan export --to accelerate`",
             "# (accelerate launch --config_file THIS train.py); the batch is your script's:",
             f"# per-process batch {layout.per_replica_batch}, global batch "
             f"{layout.global_batch}"
             + (f" = {layout.per_replica_batch} x {layout.accumulation_steps} accumulation "
                f"steps x {layout.dp} processes" if layout.accumulation_steps > 1 else "")]
    if layout.accumulation_steps > 1:
        lines += [f"# gradient accumulation: ACCELERATE_GRADIENT_ACCUMULATION_STEPS="
                  f"{layout.accumulation_steps} accelerate launch ..., or "
                  f"Accelerator(gradient_accumulation_steps={layout.accumulation_steps})"]
    lines += ["compute_environment: LOCAL_MACHINE"]
    sharded = layout.sharding != "none" or layout.tp > 1
    kind = "FSDP" if sharded else ("MULTI_GPU" if layout.world_size > 1 else "NO")
    lines += [f"distributed_type: {kind}",
              f"mixed_precision: "
              f"{layout.precision if layout.precision in ('bf16', 'fp16') else 'no'}",
              f"num_machines: {machines}", f"num_processes: {layout.world_size}",
              "machine_rank: 0", "main_training_function: main", "use_cpu: false"]
    if sharded:
        lines += ["fsdp_config:", "  fsdp_version: 2",
                  "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP",
                  f"  fsdp_reshard_after_forward: "
                  f"{'true' if layout.sharding == 'zero3' else 'false'}",
                  f"  fsdp_activation_checkpointing: "
                  f"{'true' if layout.recompute != 'none' else 'false'}",
                  "  fsdp_state_dict_type: SHARDED_STATE_DICT",
                  "  fsdp_cpu_ram_efficient_loading: true"]
        lines += ["parallelism_config:",
                  f"  parallelism_config_dp_replicate_size: {layout.dp_replicate}",
                  f"  parallelism_config_dp_shard_size: {layout.dp_shard}",
                  f"  parallelism_config_tp_size: {layout.tp}",
                  "  parallelism_config_cp_size: 1"]
    elif layout.recompute != "none":
        lines.append("# activation checkpointing without FSDP: model.gradient_checkpointing_"
                     "enable() in your script")
    # the batch as a comment Accelerate ignores and `parse` reads
    lines.append(f"# hybridplan: global_batch={layout.global_batch} "
                 f"recompute={layout.recompute}"
                 + (f" accumulation_steps={layout.accumulation_steps}"
                    if layout.accumulation_steps > 1 else ""))
    return "\n".join(lines) + "\n"


_BATCH_LINE = r"global_batch=(\d+) recompute=(\w+)(?: accumulation_steps=(\d+))?"


def holds_batch(text: str) -> bool:
    """Whether the file has the batch line export writes (Accelerate's own keys have none)."""
    import re
    return re.search(_BATCH_LINE, text) is not None


def read(text: str, source: str = "Accelerate config",
         num_layers: Optional[int] = None) -> Layout:
    # PyYAML comes with transformers (and Accelerate); only reading this format needs it
    import re

    import yaml
    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{source}: not YAML ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{source}: $ must be a mapping (got {type(d).__name__})")
    world = int(d.get("num_processes", 1))
    kind = d.get("distributed_type", "NO")
    fsdp, par = d.get("fsdp_config") or {}, d.get("parallelism_config") or {}
    tp = int(par.get("parallelism_config_tp_size", 1))
    hint = re.search(_BATCH_LINE, text)
    dp = world // tp
    global_batch = int(hint.group(1)) if hint else dp
    recompute = hint.group(2) if hint else "none"
    steps = int(hint.group(3)) if hint and hint.group(3) else 1
    if global_batch % (dp * steps):
        raise ValueError(f"{source}: the batch line's global_batch must be a multiple of the "
                         f"{dp} data-parallel processes x accumulation_steps {steps} (got "
                         f"{global_batch})")
    if fsdp.get("fsdp_activation_checkpointing"):
        recompute = "full"
    sharding, shard = "none", 1
    if kind == "FSDP":
        reshard = fsdp.get("fsdp_reshard_after_forward", True)
        if isinstance(reshard, str):   # FSDP1's strategy names, which Accelerate still takes
            reshard = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD": True,
                       "NO_SHARD": None}.get(reshard.upper(), True)
        shard = int(par.get("parallelism_config_dp_shard_size", dp))
        if reshard is not None and shard > 1:
            sharding = "zero3" if reshard else "zero2"
        else:
            shard = 1
    elif kind not in ("MULTI_GPU", "NO"):
        raise ValueError(f"{source}: distributed_type must be FSDP, MULTI_GPU or NO "
                         f"(got {kind!r})")
    return Layout(dp_replicate=dp // shard, dp_shard=shard, tp=tp, pp=1, schedule="none",
                  micro_batch=global_batch // (dp * steps), global_batch=global_batch,
                  recompute=recompute, sharding=sharding, accumulation_steps=steps,
                  precision=d.get("mixed_precision") if d.get("mixed_precision")
                  in ("bf16", "fp16") else "fp32")
