"""Point-to-point transfer of activations (forward) and their gradients (backward) between
pipeline stages, over torch.distributed send/recv (Gloo on CPU, NCCL on CUDA).

An activation message is a fixed-size int64 header describing every tensor (so the receiver can
allocate without knowing shapes in advance), then one message per tensor:

    header = [num_tensors, extra_header_len, (dtype_code, requires_grad, ndim, d0..d{ndim-1})...]

Headers longer than kHeaderLen continue in one extra message of extra_header_len int64s.
Gradients need no header: the receiver of a gradient is the sender of the activation and knows
its shape. Messages between one pair of ranks in one direction arrive in the order sent, and
every stage sends and receives in the order of StageProgram.sent_by/received_by, so no tags.

Sends are asynchronous (isend); the caller keeps their handles alive until wait(), because the
tensor being sent must outlive the transfer.
"""

from __future__ import annotations

import datetime
from typing import List, Sequence

import torch
import torch.distributed as dist

kHeaderLen = 32
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
           torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]
_DTYPE_CODE = {dt: i for i, dt in enumerate(_DTYPES)}


class Channel:
    """Sends and receives tensors for one process; `device` is where received tensors land."""

    def __init__(self, device: torch.device, timeout: datetime.timedelta):
        self.device = device
        self.timeout = timeout
        self._pending: List[dist.Work] = []
        self._keep_alive: List[torch.Tensor] = []

    # ---- sending ------------------------------------------------------------------------------
    def _isend(self, tensor: torch.Tensor, dst: int) -> None:
        tensor = tensor.contiguous()
        self._keep_alive.append(tensor)
        self._pending.append(dist.isend(tensor, dst))

    def send_tensors(self, tensors: Sequence[torch.Tensor], dst: int) -> None:
        """Header, then each tensor (detached: the graph stays with the sender)."""
        body: List[int] = []
        for t in tensors:
            if t.dtype not in _DTYPE_CODE:
                raise ValueError(f"pipeline: cannot send a tensor of dtype {t.dtype} between "
                                 f"stages (supported: {_DTYPES})")
            body += [_DTYPE_CODE[t.dtype], int(t.requires_grad), t.dim(), *t.shape]
        head_room = kHeaderLen - 2
        extra = body[head_room:]
        header = [len(tensors), len(extra)] + body[:head_room]
        header += [0] * (kHeaderLen - len(header))
        self._isend(torch.tensor(header, dtype=torch.int64, device=self.device), dst)
        if extra:
            self._isend(torch.tensor(extra, dtype=torch.int64, device=self.device), dst)
        for t in tensors:
            self._isend(t.detach(), dst)

    def send_grads(self, grads: Sequence[torch.Tensor], dst: int) -> None:
        for g in grads:
            self._isend(g.detach(), dst)

    # ---- receiving ----------------------------------------------------------------------------
    def _recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        dist.irecv(tensor, src).wait(self.timeout)
        return tensor

    def recv_tensors(self, src: int) -> List[torch.Tensor]:
        """Tensors as sent; floating-point ones the sender tracked gradients for require grad
        here, as leaves whose .grad the backward pass sends back."""
        header = self._recv(torch.empty(kHeaderLen, dtype=torch.int64, device=self.device), src)
        count, extra_len = int(header[0]), int(header[1])
        body = header[2:].tolist()
        if extra_len:
            extra = self._recv(torch.empty(extra_len, dtype=torch.int64, device=self.device), src)
            body += extra.tolist()
        tensors, pos = [], 0
        for _ in range(count):
            dtype, requires_grad, ndim = _DTYPES[body[pos]], bool(body[pos + 1]), body[pos + 2]
            shape = body[pos + 3:pos + 3 + ndim]
            pos += 3 + ndim
            t = self._recv(torch.empty(shape, dtype=dtype, device=self.device), src)
            tensors.append(t.requires_grad_(requires_grad))
        return tensors

    def recv_grads(self, like: Sequence[torch.Tensor], src: int) -> List[torch.Tensor]:
        return [self._recv(torch.empty(t.shape, dtype=t.dtype, device=self.device), src)
                for t in like]

    # ---- completion ---------------------------------------------------------------------------
    def wait(self) -> None:
        """Waits for every send still in flight, then lets go of the sent tensors."""
        for work in self._pending:
            work.wait(self.timeout)
        self._pending.clear()
        self._keep_alive.clear()
