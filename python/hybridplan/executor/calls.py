"""How a step's arguments are read under every plan: inputs as a tensor, a tuple of positional
arguments or a dict of keyword arguments (as_call), the pipeline's micro-batch and batch checks,
the local batch size, devices, and the default loss."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from ..planner import Plan


def device_for(spec: Plan, global_device: int) -> torch.device:
    """cuda:<local index> for mesh entry node * devices_per_node + local; CPU without CUDA."""
    if torch.cuda.is_available():
        return torch.device("cuda", global_device % spec.devices_per_node)
    return torch.device("cpu")



def as_call(inputs: Any) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """(args, kwargs) from a tensor, a tuple/list of positional arguments or a dict of keyword
    arguments."""
    if isinstance(inputs, dict):
        return (), dict(inputs)
    if isinstance(inputs, (tuple, list)):
        return tuple(inputs), {}
    return (inputs,), {}


def first_microbatch(spec: Plan, example_inputs: Any, batch_dim: int
                      ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """One micro-batch of the example: the shape the stages are traced at."""
    if example_inputs is None:
        raise ValueError(f"{spec.source}: a pipeline plan needs apply(..., example_inputs=) (one "
                         "replica batch): its stages are cut by torch.export at that shape")
    if batch_dim != 0:
        raise ValueError(f"{spec.source}: pipeline plans cut micro-batches along dimension 0, "
                         f"as torch.distributed.pipelining does (got batch_dim={batch_dim})")
    m, b = spec.num_microbatches, spec.per_replica_batch
    if b % m:
        raise ValueError(f"{spec.source}: per_replica_batch must be a multiple of "
                         f"num_microbatches={m}: the stages run equal micro-batches (got {b})")

    def part(v):
        if not isinstance(v, torch.Tensor):
            return v
        if v.dim() == 0 or v.shape[0] != b:
            raise ValueError(f"{spec.source}: example_inputs tensors must hold per_replica_batch"
                             f"={b} samples along dim 0 (got shape {list(v.shape)})")
        return v[: b // m]
    args, kwargs = as_call(example_inputs)
    return tuple(part(v) for v in args), {k: part(v) for k, v in kwargs.items()}


def check_batch(spec: Plan, flat: List[Any]) -> None:
    for t in flat:
        if t.dim() == 0 or t.shape[0] != spec.per_replica_batch:
            raise ValueError(f"{spec.source}: a pipeline step takes per_replica_batch="
                             f"{spec.per_replica_batch} samples per input tensor, the shape its "
                             f"stages were traced at (got shape {list(t.shape)})")


def batch_size(args: Tuple[Any, ...], kwargs: Dict[str, Any], batch_dim: int) -> int:
    """Samples in a placement step's local batch: the first input tensor's size along
    batch_dim (0 when no input is a tensor: the noise-scale meter then skips the step)."""
    for v in list(args) + list(kwargs.values()):
        if isinstance(v, torch.Tensor) and v.dim() > batch_dim:
            return int(v.shape[batch_dim])
    return 0


def device_of(value: Any) -> torch.device:
    if isinstance(value, torch.Tensor):
        return value.device
    if isinstance(value, (tuple, list)) and value:
        return device_of(value[0])
    return torch.device("cpu")


def to_device(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def default_loss(module: nn.Module) -> Callable:
    """The module's own `loss(output, target)` (hybridplan.models have one), else mean
    cross-entropy."""
    loss = getattr(module, "loss", None)
    return loss if callable(loss) else F.cross_entropy

