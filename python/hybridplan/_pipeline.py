"""Pipeline mode: runs this rank's stage through the plan's schedule for one training step.

Micro-batches: the replica's batch is cut along the batch dimension into num_microbatches parts
(torch.tensor_split: sizes differ by at most one). With a mean-reduced loss, micro-batch j's loss
is scaled by its share of the batch,

    loss = sum_j loss_j * n_j / n      =>   sum_j grad(loss_j * n_j / n) = grad(full-batch mean)

so the gradients accumulated over the schedule are those of the replica's full batch.

Values cross stages as StageProgram says: each value is sent straight from the stage that makes
it to every later stage that reads it (a skip connection from stage 0 to stage 2 does not pass
through stage 1), and its gradient comes back the same way. Stage 0 sends the batch inputs that
later stages read; the last stage holds the targets and computes the loss.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from . import _schedules
from ._p2p import Channel
from ._stage_split import StageProgram, ValueKey, get_attr


def split_microbatches(values: Sequence[Any], num_microbatches: int, batch_dim: int
                       ) -> List[Tuple[Any, ...]]:
    """Per micro-batch, each tensor's part along batch_dim (non-tensors are passed to all)."""
    parts = []
    for v in values:
        if isinstance(v, torch.Tensor):
            if v.shape[batch_dim] < num_microbatches:
                raise ValueError(f"pipeline: a batch of {v.shape[batch_dim]} samples cannot "
                                 f"make num_microbatches={num_microbatches} micro-batches")
            parts.append(torch.tensor_split(v, num_microbatches, dim=batch_dim))
        else:
            parts.append([v] * num_microbatches)
    return [tuple(p[i] for p in parts) for i in range(num_microbatches)]


def _leaf_key(key: ValueKey) -> bool:
    return isinstance(key, tuple) and bool(key) and key[0] in ("input", "stage", "attr")


def _map_keys(tree: Any, fn: Callable[[ValueKey], Any]) -> Any:
    if _leaf_key(tree):
        return fn(tree)
    if isinstance(tree, (tuple, list)):
        return type(tree)(_map_keys(t, fn) for t in tree)
    if isinstance(tree, dict):
        return {k: _map_keys(v, fn) for k, v in tree.items()}
    return tree


class _MicroBatch:
    """What a forward leaves for its backward."""

    def __init__(self):
        self.received: Dict[ValueKey, torch.Tensor] = {}
        self.produced: Dict[ValueKey, torch.Tensor] = {}
        self.loss: Optional[torch.Tensor] = None


class PipelineStageRunner:
    """Executes one stage of one replica: forward/backward per micro-batch, p2p exchange."""

    def __init__(self, module: nn.Module, program: StageProgram, stage: int,
                 rank_of_stage: Callable[[int], int], channel: Channel, schedule: str,
                 num_microbatches: int, loss_fn: Callable, batch_dim: int):
        self.module, self.program, self.stage = module, program, stage
        self.last_stage = program.num_stages - 1
        self.submodule = program.submodules.get(stage)
        self.rank_of_stage, self.channel = rank_of_stage, channel
        self.num_microbatches, self.loss_fn, self.batch_dim = num_microbatches, loss_fn, batch_dim
        self.actions = _schedules.actions(schedule, program.num_stages, stage, num_microbatches)
        self._sends = program.sent_by(stage)
        self._recvs = program.received_by(stage)

    def run(self, inputs: Optional[Sequence[Any]], target: Any) -> torch.Tensor:
        """One step's schedule. Returns the replica's loss (mean over its batch) on the last
        stage, 0 elsewhere. Gradients accumulate into the stage's parameters."""
        m = self.num_microbatches
        input_mbs = (split_microbatches(inputs, m, self.batch_dim)
                     if self.stage == 0 else [None] * m)
        if self.stage == self.last_stage:
            if target is None:
                raise ValueError("pipeline: the last stage needs the target (got None)")
            target_mbs = [t[0] for t in split_microbatches([target], m, self.batch_dim)]
            total = sum(_batch_size(t, self.batch_dim) for t in target_mbs)
        state = [_MicroBatch() for _ in range(m)]
        loss_sum = torch.zeros((), device=self.channel.device)
        for kind, i in self.actions:
            if kind == "F":
                self._forward(state[i], input_mbs[i])
                if self.stage == self.last_stage:
                    output = _map_keys(self.program.output, lambda k: self._value(state[i], k,
                                                                                  None))
                    scale = _batch_size(target_mbs[i], self.batch_dim) / total
                    state[i].loss = self.loss_fn(output, target_mbs[i]) * scale
                    loss_sum = loss_sum + state[i].loss.detach()
            else:
                self._backward(state[i])
                state[i] = _MicroBatch()  # free the micro-batch's activations
        self.channel.wait()
        return loss_sum

    # ---- one micro-batch ------------------------------------------------------------------------
    def _value(self, mb: _MicroBatch, key: ValueKey, inputs: Optional[Sequence[Any]]) -> Any:
        if key[0] == "attr":
            return get_attr(self.module, key[1])
        if key in mb.received:
            return mb.received[key]
        if key in mb.produced:
            return mb.produced[key]
        if key[0] == "input" and inputs is not None:
            return inputs[key[1]]
        raise AssertionError(f"stage {self.stage} has no value for {key}")

    def _forward(self, mb: _MicroBatch, inputs: Optional[Sequence[Any]]) -> None:
        for key in self._recvs:
            src = self.rank_of_stage(self.program.producer[key])
            (mb.received[key],) = self.channel.recv_tensors(src)
        if self.submodule is not None:
            args = [self._value(mb, k, inputs) for k in self.program.stage_inputs[self.stage]]
            outputs = self.submodule(*args)
            for index, value in enumerate(outputs):
                mb.produced[("stage", self.stage, index)] = value
        for key in self._sends:
            value = mb.produced[key] if key[0] == "stage" else inputs[key[1]]
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"pipeline: only tensors can cross stages; the value {key} "
                                 f"sent by stage {self.stage} is a {type(value).__name__}")
            if key[0] == "input":
                value = value.detach()  # batch inputs carry no gradient back
            for consumer in self.program.consumers[key]:
                self.channel.send_tensors([value], self.rank_of_stage(consumer))

    def _backward(self, mb: _MicroBatch) -> None:
        roots: List[torch.Tensor] = []
        grads: List[Optional[torch.Tensor]] = []
        if mb.loss is not None:
            roots.append(mb.loss)
            grads.append(None)
        for key in self._sends:
            value = mb.produced.get(key)
            if key[0] != "stage" or not value.requires_grad:
                continue
            total = None
            for consumer in self.program.consumers[key]:
                (g,) = self.channel.recv_grads([value], self.rank_of_stage(consumer))
                total = g if total is None else total + g
            roots.append(value)
            grads.append(total)
        if roots:
            torch.autograd.backward(roots, grads)
        for key in self._recvs:
            value = mb.received[key]
            if value.requires_grad:
                g = value.grad if value.grad is not None else torch.zeros_like(value)
                self.channel.send_grads([g], self.rank_of_stage(self.program.producer[key]))


def _batch_size(value: Any, batch_dim: int) -> int:
    if isinstance(value, torch.Tensor):
        return value.shape[batch_dim]
    raise ValueError(f"pipeline: the target must be a tensor (got {type(value).__name__})")
