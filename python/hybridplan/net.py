"""One way to pick a port for a job of processes on this machine: MASTER_PORT of a torch.distributed
rendezvous on loopback (the front door's job of one process, and the tests and benchmarks that
start their ranks themselves)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that no socket holds now (the system's pick; another process may
    still take it before the job binds it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
