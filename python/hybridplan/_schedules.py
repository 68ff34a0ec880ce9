"""Pipeline schedules as pure functions: the ordered forward (F) and backward (B) micro-batch
actions one stage runs in a training step. No process group needed, so they are testable alone.

GPipe (https://arxiv.org/abs/1811.06965): all forwards, then all backwards.
    stage 0: F0 F1 F2 F3 .  .  .  B0 B1 B2 B3
    stage 1:    F0 F1 F2 F3 .  B0 B1 B2 B3
1F1B (PipeDream-flush, https://arxiv.org/abs/2006.09503): stage s runs
warmup = min(stages - s - 1, m) forwards, then alternates one forward and one backward, then
drains the remaining backwards; at most stages - s micro-batches are in flight per stage.
    stage 0: F0 F1 .  B0 F2 B1 F3 B2 .  B3
    stage 1:    F0 B0 F1 B1 F2 B2 F3 B3

Both schedules process forwards and backwards in micro-batch order on every stage, which is what
lets p2p messages between a pair of stages match without tags (see _p2p). Deadlock freedom with
asynchronous sends and blocking receives: stage s's B_i waits for B_i of a later stage c, which
comes after F_{i + warmup_c} there; F_{i + warmup_c} needs F_{i + warmup_c} of s, which s runs
before B_i because warmup_s >= warmup_c.
"""

from typing import List, Tuple

Action = Tuple[str, int]  # ("F" | "B", micro-batch index)
SCHEDULES = ("gpipe", "1f1b")


def gpipe(num_stages: int, stage: int, num_microbatches: int) -> List[Action]:
    m = num_microbatches
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def one_f_one_b(num_stages: int, stage: int, num_microbatches: int) -> List[Action]:
    m = num_microbatches
    warmup = min(num_stages - stage - 1, m)
    actions: List[Action] = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        actions += [("F", warmup + i), ("B", i)]
    actions += [("B", i) for i in range(m - warmup, m)]
    return actions


def actions(schedule: str, num_stages: int, stage: int, num_microbatches: int) -> List[Action]:
    if schedule == "gpipe":
        return gpipe(num_stages, stage, num_microbatches)
    if schedule == "1f1b":
        return one_f_one_b(num_stages, stage, num_microbatches)
    raise ValueError(f"plan: schedule must be one of {list(SCHEDULES)} (got {schedule!r})")
