"""The process's distributed lifecycle under apply(): the default process group (created from
torchrun's environment, on a rendezvous store that outlives it), the AppliedPlans still open,
and their orderly teardown (destroy_groups; Lifecycle.shutdown at exit)."""

from __future__ import annotations

import atexit
import datetime
import gc
import os
import sys
import weakref
from typing import Any, List, Optional, Sequence

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 300.0  # apply's timeout_s: process groups and every p2p wait
_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def destroy_groups(groups: Sequence[Optional["dist.ProcessGroup"]] = (None,)) -> None:
    """Destroys `groups` newest first (None: every group, the default included) after a garbage
    collection, while Python is fully alive. Call it once the DDP wrappers (and anything else
    holding a group) are dropped; AppliedPlan.close() does, and so does every plain-DDP job in
    the tests and benches (a CI run had both ranks of torch DDP abort at exit without it).

    Why (~1 exit in 4 aborted with "terminate called without an active exception" before):
    each backward stashes a Python object in thread-local state
    (torch.autograd.graph._engine_run_backward), and every all-reduce DDP launches from the
    backward keeps a copy of that state in its Gloo Work. A Gloo worker thread drops its last
    reference to a Work just after wait() returns; if the interpreter is finalizing by then,
    releasing the Python object makes the thread exit from inside take_gil (pthread_exit), which
    unwinds through the Work's noexcept destructor: std::terminate. A process group's Gloo
    threads are joined when its last reference goes, so the wrappers (which hold the groups, in
    reference cycles only a collection frees) must be collected and the groups destroyed while
    Python is alive. Order: the wrappers go first, while the groups are still registered, so
    that a DDP Reducer never holds a group's last reference. Its destruction would join the Gloo
    threads with the GIL held while a thread waits for the GIL to release that Python object: a
    deadlock (seen as hung plain-DDP ranks, exit_launches.py --plain-ddp).
    destroy_process_group() drops the registered references, and the group's own binding
    releases the GIL before joining."""
    gc.collect()
    for group in reversed(list(groups)):
        if dist.is_initialized():  # else every group is destroyed already
            dist.destroy_process_group(group)  # its last reference: joins its threads


class Lifecycle:
    """What apply() started in this process, so that it can be shut down in order: the
    AppliedPlans not yet closed (weak references, in creation order) and whether apply()
    created the default process group (then the last close() destroys it)."""
    open_plans: List["weakref.ref[Any]"] = []  # AppliedPlans
    owns_default_group = False
    atexit_registered = False
    store: Optional[Any] = None  # the job's rendezvous store, kept for the process's life
    incarnation = 0              # default groups apply() created so far (the same on every rank)

    @classmethod
    def track(cls, hp: Any) -> None:
        cls.open_plans.append(weakref.ref(hp))
        if not cls.atexit_registered:
            atexit.register(cls.shutdown)
            cls.atexit_registered = True

    @classmethod
    def forget(cls, hp: Optional[Any]) -> None:
        cls.open_plans = [r for r in cls.open_plans if r() is not None and r() is not hp]
        if not cls.open_plans and cls.owns_default_group and dist.is_initialized():
            dist.destroy_process_group()
            cls.owns_default_group = False

    @classmethod
    def shutdown(cls) -> None:
        """atexit: closes the plans the user did not close, newest first. After an uncaught
        exception (sys.last_value is set before atexit runs) it does not wait for the peers:
        they may be blocked in a collective this rank will never join, and they learn of its
        exit sooner from the closed connections than from a barrier's timeout."""
        failed = getattr(sys, "last_value", None) is not None
        for ref in reversed(list(cls.open_plans)):
            hp = ref()
            if hp is not None:
                try:
                    hp.close(wait_for_peers=not failed)
                except Exception:  # exiting anyway; a lost peer must not hang or mask it
                    pass
        cls.forget(None)


def init_process_group(timeout: datetime.timedelta) -> None:
    if dist.is_initialized():
        return
    missing = [k for k in _ENV if k not in os.environ]
    if missing:
        raise ValueError(f"hybridplan.apply must run inside a torch.distributed job (launch with "
                         f"torchrun): environment variables {missing} are not set")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "cpu:gloo,cuda:nccl"
    else:
        backend = "gloo"
    # The rendezvous store lives as long as the process, and each default group apply()
    # creates rendezvouses under a prefix of its own. With init_process_group's env:// store,
    # rank 0's TCPStore server stops when close() destroys the group; a second apply() in the
    # same processes then raced it: a rank that re-initialised before rank 0 had destroyed its
    # group joined the old server and its old keys, and rank 0 waited at the new one forever.
    Lifecycle.incarnation += 1
    store = dist.PrefixStore(f"{_restart_prefix()}hybridplan/apply{Lifecycle.incarnation}",
                             _job_store(timeout))
    dist.init_process_group(backend, store=store, rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]), timeout=timeout)
    Lifecycle.owns_default_group = True


def _restart_prefix() -> str:
    """"restart<N>/" when torchrun restarted this job's workers and they share the agent's
    store, else "". torchrun's agent keeps one TCPStore for every attempt (torch's shared
    rendezvous store, TORCHELASTIC_USE_AGENT_STORE), so a restarted worker found the keys the
    killed attempt's ranks had written (their Gloo addresses) and connected to dead ports:
    `Gloo connectFullMesh failed ... Connection refused`, or a hang (pytorch/pytorch#135712).
    The restart count tells the attempts apart only where every worker has the same one: one
    agent (GROUP_WORLD_SIZE 1, torchrun --standalone). Several agents count their restarts
    each on its own (a node that joins starts at 0): launch those with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (`python -m hybridplan run` sets it), which gives
    every attempt a store of its own."""
    if (os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True)
            or os.environ.get("GROUP_WORLD_SIZE", "1") != "1"):
        return ""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return "" if restart == "0" else f"restart{restart}/"


def _job_store(timeout: datetime.timedelta) -> Any:
    """The job's TCPStore at MASTER_ADDR:MASTER_PORT, created once per process as torch's env://
    rendezvous creates it: a client of torchrun's agent store when torchrun hosts one
    (TORCHELASTIC_USE_AGENT_STORE), else hosted by rank 0 (multi-tenant, as env:// does)."""
    if Lifecycle.store is None:
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
        Lifecycle.store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
            int(os.environ["WORLD_SIZE"]), is_master=not agent and int(os.environ["RANK"]) == 0,
            timeout=timeout, multi_tenant=True)
    return Lifecycle.store
