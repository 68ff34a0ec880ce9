"""The multi-stage pipeline schedules have one definition of their order for the cost model, the
core's rank_passes (pipeline_schedule.h), ported from torch.distributed.pipelining's
ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble and ScheduleZBVZeroBubble, which the
Python executor runs. These tests hold the port equal to torch's own orders (`pipeline_order`,
less the idle slots torch pads with None), and the stage-to-rank mapping equal to torch's
generate_stage_to_rank_mapping, for every shape tried; a torch upgrade that changes an order
fails here rather than silently mispredicting."""

from __future__ import annotations

import types

import pytest

from hybridplan import _C, planner

from torch.distributed.pipelining import schedules as torch_schedules
from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

TORCH_CLASSES = {
    "interleaved-1f1b": torch_schedules.ScheduleInterleaved1F1B,
    "interleaved-zb": torch_schedules.ScheduleInterleavedZeroBubble,
    "zbv": torch_schedules.ScheduleZBVZeroBubble,
}


def torch_order(schedule: str, mp: int, v: int, m: int, rank: int):
    """torch's order for one rank, computed by the class's own method on the attributes its
    constructor sets (building the real schedule needs stages on a process group)."""
    rounds = max(1, m // mp)
    fake = types.SimpleNamespace(pp_group_size=mp, n_local_stages=v, _n_microbatches=m,
                                 number_of_rounds=rounds, microbatches_per_round=m // rounds,
                                 num_stages=mp * v)
    ops = TORCH_CLASSES[schedule]._calculate_single_rank_operations(fake, rank)
    return [(a.computation_type.value, a.microbatch_index, a.stage_index)
            for a in ops if a is not None]


def shapes():
    for schedule in TORCH_CLASSES:
        for mp in (2, 3, 4):
            for v in ((2,) if schedule == "zbv" else (2, 3)):
                for m in range(1, 10):
                    rounds = max(1, m // mp)
                    if schedule != "zbv" and m % rounds:
                        continue  # torch refuses it, and so does the plan validation
                    yield schedule, mp, v, m


@pytest.mark.parametrize("schedule,mp,v,m", list(shapes()))
def test_rank_passes_equal_torch_pipeline_order(schedule, mp, v, m):
    for rank in range(mp):
        ours = [tuple(p) for p in _C.rank_passes(schedule, mp * v, m, mp, rank)]
        assert ours == torch_order(schedule, mp, v, m, rank), (schedule, mp, v, m, rank)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b", "interleaved-zb", "zbv"])
def test_stage_ranks_equal_torch_mapping(schedule):
    for mp in (1, 2, 3, 4):
        v = 1 if schedule in ("gpipe", "1f1b") else 2
        style = "v" if schedule == "zbv" else "loop"
        expected = generate_stage_to_rank_mapping(mp, mp * v, style=style)
        assert planner.stage_ranks(schedule, mp, v) == [expected[s] for s in range(mp * v)]


def test_every_pass_runs_once():
    """Each stage runs F, then B (or I and W) of every micro-batch exactly once, on its rank."""
    for schedule, mp, v, m in shapes():
        ranks = planner.stage_ranks(schedule, mp, v)
        seen = {}
        for rank in range(mp):
            for kind, mb, stage in _C.rank_passes(schedule, mp * v, m, mp, rank):
                assert ranks[stage] == rank
                seen[(kind, mb, stage)] = seen.get((kind, mb, stage), 0) + 1
        kinds = ("F", "I", "W") if schedule != "interleaved-1f1b" else ("F", "B")
        assert seen == {(k, mb, s): 1 for k in kinds for mb in range(m) for s in range(mp * v)}


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="exactly 2 stages per rank"):
        _C.rank_passes("zbv", 6, 4, 2, 0)
    with pytest.raises(ValueError, match="schedule must be"):
        _C.rank_passes("looped", 4, 4, 2, 0)
    with pytest.raises(ValueError, match="rank must be in 0..num_ranks-1"):
        _C.rank_passes("interleaved-1f1b", 4, 4, 2, 2)
