"""The plan's precision applied the way torch does it (docs/training_step.md "Precision"): the
plan's "precision" (the Job's, which the planner priced: "fp32", "bf16" or "fp16"; the names
are the core's, csrc/planner/documents/precision.h, checked when the plan is read) names the
dtype the forward computes in; parameters stay fp32 (the master copies the optimizer steps, its
state fp32 too) and gradients are reduced in fp32.

  sharded placement plans (zero2, zero3, HSDP; FSDP2's fully_shard)
      MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=float32): FSDP2 all-gathers each
      unit's parameters in the dtype, computes in it, and reduce-scatters the gradients in
      fp32 into the fp32 shards (torchtitan's policy for FSDP).
  every other plan (DDP, placement, tensor parallelism, pipelines)
      torch.autocast(device_type, dtype) around the forward and the loss, as torchtitan does
      where FSDP does not cast (its maybe_enable_amp): the parameters stay fp32 and autocast
      casts them per op (matrix products in the dtype, reductions and the loss in fp32). A
      pipeline's stage forward runs under it (PipelineRunner: each stage's forward_one_chunk
      and the last stage's loss), and a stage sends its floating outputs in the dtype (the
      receive buffers are allocated in it), so messages and their gradients travel at the
      dtype's bytes, as the planner prices them.

fp16 (whose range is narrow: small gradients underflow) adds a loss scaler under every plan
kind: torch's ShardedGradScaler (on each gradient's local tensor: _scaler_class), the
GradScaler that all-reduces its inf/NaN check over a process group (here the whole job), so
that every rank skips or takes the same steps: a pipeline's stages and a tensor-parallel
group's ranks each see only their own gradients, and FSDP2's only their shards
(torch.amp.GradScaler alone checks the rank's own). The loss is scaled before its
backward, the gradients unscaled before clipping or the optimizer step, a step with an inf or
NaN skipped and the scale halved (doubled after 2000 clean steps), as GradScaler does. bf16 has
fp32's range and needs none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any, Dict, List, Optional, Tuple

import torch

# the plan's precision names (the core's) -> the compute dtype; fp32: none (no casting)
_DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclasses.dataclass(frozen=True)
class Precision:
    """How this rank applies the plan's precision (see the module doc)."""
    name: str = "fp32"
    dtype: Optional[torch.dtype] = None   # the compute dtype; None for fp32
    fsdp_policy: bool = False             # FSDP2's MixedPrecisionPolicy, else autocast

    @property
    def autocasts(self) -> bool:
        return self.dtype is not None and not self.fsdp_policy

    def autocast(self, device: torch.device):
        """torch.autocast in the compute dtype on `device`'s type where this plan autocasts; a
        null context otherwise."""
        if not self.autocasts:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(device).type, dtype=self.dtype)

    def mp_policy(self) -> Any:
        """FSDP2's MixedPrecisionPolicy for fully_shard (None: FSDP2's default, fp32)."""
        if not self.fsdp_policy or self.dtype is None:
            return None
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)

    def scaler(self, device: torch.device) -> Any:
        """fp16: the loss scaler (see the module doc), its scale already on `device` (a rank
        that never scales a loss, a pipeline's earlier stages, still unscales and steps); None
        otherwise."""
        if self.dtype != torch.float16:
            return None
        import torch.distributed as dist

        scaler = _scaler_class()(device=torch.device(device).type,
                                 process_group=dist.group.WORLD)
        scaler.scale(torch.zeros((), device=device))  # creates the scale tensor on `device`
        return scaler

    def message_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a pipeline stage sends a value traced in `dtype` in: floating values in the
        compute dtype under autocast, anything else as traced."""
        if self.autocasts and dtype.is_floating_point:
            return self.dtype
        return dtype


@functools.lru_cache(maxsize=None)
def _scaler_class():
    """ShardedGradScaler that checks and unscales each gradient's local tensor. torch 2.13's
    found-inf kernel refuses a DTensor gradient beside its plain found-inf tensor (FSDP2's
    shards and TP's slices over 2 ranks: "got mixed torch.Tensor and DTensor"); a DTensor's
    local tensor is this rank's part of it, all the check and the in-place unscale need, and
    ShardedGradScaler.unscale_ then all-reduces the found infs over the job as before."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    from torch.distributed.tensor import DTensor

    class LocalShardGradScaler(ShardedGradScaler):
        def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16=True):
            grads: Dict[Tuple[torch.device, torch.dtype], List[torch.Tensor]] = {}
            with torch.no_grad():
                for group in optimizer.param_groups:
                    for param in group["params"]:
                        if param.grad is None:
                            continue
                        grad = param.grad
                        local = grad.to_local() if isinstance(grad, DTensor) else grad
                        grads.setdefault((local.device, local.dtype), []).append(local)
                found: Dict[torch.device, torch.Tensor] = {}
                for (device, _), tensors in grads.items():
                    if device not in found:
                        found[device] = found_inf.to(device)
                    torch._amp_foreach_non_finite_check_and_unscale_(
                        tensors, found[device], inv_scale.to(device))
            if not found:  # nothing to unscale on this rank: still one found-inf to reduce
                found[found_inf.device] = found_inf
            return found
    return LocalShardGradScaler


def of_plan(plan: Any) -> Precision:
    """The Precision a plan asks for: its "precision" and its kind (see the module doc)."""
    name = plan.precision
    if name not in _DTYPES:  # the core checked it; a new name there needs a dtype here
        raise ValueError(f"{plan.source}: precision {name!r} has no compute dtype in the "
                         f"executor (known: {sorted(_DTYPES)})")
    sharded_placement = plan.mode == "placement" and plan.sharding != "none"
    return Precision(name, _DTYPES[name], fsdp_policy=sharded_placement)
