"""Which rank was lost: when a collective or p2p transfer of a training step fails (a peer was
killed, its host died, or it stopped answering within the timeout), Gloo's error names a socket
address ("Connection closed by peer [127.0.0.1]:41234") or just a timeout, not a rank. Every
rank whose step fails reports itself alive through the job's rendezvous store (the default
process group's store, which torchrun or rank 0 hosts) and waits a short grace period for the
others; the ranks that did not report are named as lost or timed out. If the store itself cannot
be reached, its host (rank 0 when ranks are launched without torchrun) is the one lost.

No heartbeat thread: the store is only used once a step has already failed.

The C++ executor does the same (csrc/executor/lost_peer.h): same keys, grace period, markers and
message; tests/data/rank_messages.json holds the two together.
"""

from __future__ import annotations

import time
from typing import List, Optional

import torch.distributed as dist

kGraceS = 3.0  # how long a failed rank waits for the others' reports
# Text that marks a transport error (Gloo/NCCL/store messages name no exception class of their own)
kCommunicationMarkers = (
    "Connection closed by peer", "Connection reset by peer", "Connection refused",
    "Broken pipe", "Timed out waiting", "timed out", "Timeout", "gloo", "Gloo", "NCCL", "Socket")


def alive_key(incident: str, rank: int) -> str:
    return f"hybridplan/alive/{incident}/{rank}"


def is_communication_error_text(text: str) -> bool:
    return any(s in text for s in kCommunicationMarkers)


def is_communication_error(error: BaseException) -> bool:
    """A failure of the transport (Gloo/NCCL/store), not of the user's model code."""
    if isinstance(error, dist.DistError):
        return True
    return isinstance(error, RuntimeError) and is_communication_error_text(str(error))


def _ranks_text(ranks: List[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def lost_ranks(incident: str, rank: int, world_size: int, grace_s: float = kGraceS
               ) -> Optional[List[int]]:
    """The ranks that did not report alive within grace_s of this rank's report (keys under
    `incident`, e.g. the step number), or None if the store cannot be reached."""
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(alive_key(incident, rank), "1")
        deadline = time.monotonic() + grace_s
        missing = [r for r in range(world_size) if r != rank]
        while missing and time.monotonic() < deadline:
            missing = [r for r in missing if not store.check([alive_key(incident, r)])]
            if missing:
                time.sleep(0.1)
        return missing
    except Exception:  # the store is gone with its host
        return None


def lost_peer_message(what: str, rank: int, missing: Optional[List[int]], error_type: str,
                      error_text: str) -> str:
    """Pure: the message naming the ranks in `missing` (None: the store's host, rank 0)."""
    if missing is None:
        who = ("rank 0 lost or timed out (it hosts the job's rendezvous store, which cannot be "
               "reached)")
    elif missing:
        who = f"{_ranks_text(missing)} lost or timed out"
    else:
        who = "every rank reported alive, the transfer itself failed"
    first_line = error_text.strip().splitlines()[0] if error_text.strip() else ""
    return f"hybridplan: {what} failed on rank {rank}: {who} ({error_type}: {first_line})"


def lost_peer_error(error: BaseException, what: str, rank: int, world_size: int,
                    incident: str) -> RuntimeError:
    """The error to raise instead of `error` (which failed `what`, e.g. "step 3"): it names the
    lost ranks when they can be found."""
    return RuntimeError(lost_peer_message(what, rank, lost_ranks(incident, rank, world_size),
                                          type(error).__name__, str(error)))
