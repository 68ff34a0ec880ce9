"""Cross-rank agreement before training: every rank must run the same torch and hybridplan
versions and hold the same plan and the same parameter shapes, and no rank may have failed its
local checks.

Each rank gathers every rank's report (all_gather_object, under the process group's timeout) and
then judges the same list, so a problem raises the same ValueError on every rank instead of
leaving the healthy ranks waiting in a collective that the failed rank never joins.

The C++ executor checks the same versions with the same message (csrc/executor/rank_agreement.h,
describe_version_difference; tests/data/rank_messages.json holds the two together).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional, Tuple, Type, Union

import torch
import torch.distributed as dist
from torch import nn

from .. import __version__

ParamSignature = List[Tuple[str, List[int], str]]  # (state_dict key, shape, dtype)
Catch = Union[Type[BaseException], Tuple[Type[BaseException], ...]]


@dataclasses.dataclass
class RankReport:
    rank: int
    plan_sha256: Optional[str]   # None: the plan could not be read on this rank
    error: Optional[str]         # this rank's local check failure, if any
    params: ParamSignature
    torch_version: str = ""       # torch.__version__
    hybridplan_version: str = ""  # hybridplan.__version__
    resumed: str = ""             # the checkpoint this rank resumes from ("" if none)


def local_versions() -> Tuple[str, str]:
    """(torch, hybridplan) versions of this process, as its RankReport carries them."""
    return torch.__version__, __version__


def param_signature(module: nn.Module) -> ParamSignature:
    return [(k, list(v.shape), str(v.dtype)) for k, v in module.state_dict().items()]


def _ranks_text(ranks: List[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def describe_version_difference(rank_a: int, torch_a: str, hybridplan_a: str, rank_b: int,
                                torch_b: str, hybridplan_b: str) -> Optional[str]:
    """Pure: the message when two ranks run different torch or hybridplan versions, else None."""
    if (torch_a, hybridplan_a) == (torch_b, hybridplan_b):
        return None
    return (f"rank {rank_a} and rank {rank_b} run different versions: rank {rank_a} has torch "
            f"{torch_a}, hybridplan {hybridplan_a}; rank {rank_b} has torch {torch_b}, "
            f"hybridplan {hybridplan_b}; every rank must run the same torch and hybridplan "
            f"versions")


def judge(reports: List[RankReport]) -> Optional[str]:
    """The message to raise on every rank, or None when all ranks agree. Versions are compared
    first (another torch can explain any other difference), then plans: a different plan
    explains most other differences."""
    first = reports[0]
    for other in reports[1:]:
        message = describe_version_difference(
            first.rank, first.torch_version, first.hybridplan_version,
            other.rank, other.torch_version, other.hybridplan_version)
        if message is not None:
            return f"hybridplan.apply: {message}"
    for other in reports[1:]:
        if other.plan_sha256 != first.plan_sha256:
            def sha(r):
                return (r.plan_sha256 or "unreadable")[:12]
            return (f"hybridplan.apply: rank {first.rank} and rank {other.rank} hold different "
                    f"plans (canonical JSON sha256 {sha(first)}... vs {sha(other)}...); "
                    f"every rank must apply the same plan")
    failed = [r for r in reports if r.error is not None]
    if failed:
        same = [r.rank for r in failed if r.error == failed[0].error]
        more = len(failed) - len(same)
        tail = f" (and different errors on {more} other ranks)" if more else ""
        return f"hybridplan.apply failed on {_ranks_text(same)}{tail}: {failed[0].error}"
    for other in reports[1:]:
        if other.params != first.params:
            return _param_difference(first, other)
    for other in reports[1:]:
        if other.resumed != first.resumed:
            def what(r):
                return repr(r.resumed) if r.resumed else "no checkpoint"
            return (f"hybridplan.apply: rank {first.rank} resumes from {what(first)} and rank "
                    f"{other.rank} from {what(other)}; every rank must resume from the same "
                    f"checkpoint (did one appear or fail verification while the ranks looked?)")
    return None


def _param_difference(a: RankReport, b: RankReport) -> str:
    prefix = f"hybridplan.apply: rank {a.rank} and rank {b.rank} hold different models: "
    da = {k: (s, t) for k, s, t in a.params}
    db = {k: (s, t) for k, s, t in b.params}
    for key in list(da) + list(db):
        if key not in db:
            return prefix + f"{key!r} exists on rank {a.rank} but not on rank {b.rank}"
        if key not in da:
            return prefix + f"{key!r} exists on rank {b.rank} but not on rank {a.rank}"
        if da[key] != db[key]:
            (sa, ta), (sb, tb) = da[key], db[key]
            return (prefix + f"{key!r} is {ta}{sa} on rank {a.rank} and {tb}{sb} on "
                    f"rank {b.rank}")
    return prefix + "parameter order differs"


def agree_across_ranks(report: RankReport) -> None:
    """Gathers every rank's report and raises ValueError (the same on every rank) unless all
    ranks hold the same plan and parameter shapes and none failed a local check."""
    reports: List[Optional[RankReport]] = [None] * dist.get_world_size()
    dist.all_gather_object(reports, report)
    message = judge([r for r in reports if r is not None])
    if message is not None:
        raise ValueError(message)


def rank_zero_acts(action: Callable[[], Any], error: Callable[[str, str], BaseException], *,
                   group: Any = None, catch: Catch = Exception,
                   rank_zero_raises_own: bool = False) -> Any:
    """Runs `action()` on rank 0 alone (it writes a file, gathers a state, profiles) and gives
    every rank of `group` (None: the default group) its outcome: the value it returned,
    broadcast, or, when it raised one of `catch`, the exception `error(kind, message)` (kind
    the exception's class name) raised on every rank. Rank 0 raises its own exception instead
    where `rank_zero_raises_own` (its traceback tells more). Collective: every rank calls it,
    so a failure on rank 0 cannot leave the others waiting in a later collective that rank 0
    never joins. A job of one process broadcasts nothing."""
    box: List[Any] = [None]
    failure: Optional[BaseException] = None
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", action())
        except catch as e:  # every rank raises it, below
            failure = e
            box[0] = ("error", type(e).__name__, str(e))
    if dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0, group=group)
    if box[0][0] == "ok":
        return box[0][1]
    if failure is not None and rank_zero_raises_own:
        raise failure
    raise error(box[0][1], box[0][2]) from failure


def rank_zero_error(message: Callable[[str], str], kind: Type[BaseException] = RuntimeError
                    ) -> Callable[[str, str], BaseException]:
    """rank_zero_acts' `error` for the usual message: `kind(message("<Class>: <text>"))`."""
    return lambda name, text: kind(message(f"{name}: {text}"))
