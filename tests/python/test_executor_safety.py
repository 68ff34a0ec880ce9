"""A job whose ranks disagree fails on EVERY rank, promptly, with a message naming the problem
(and the disagreeing ranks), instead of hanging in a collective."""

import copy
import os
import time

import hybridplan.models as models
from dist_harness import format_results, run_ranks
from plan_builders import pipeline_plan

APPLY_TIMEOUT_S = 20   # collectives inside apply(); the checks must fail long before
HARNESS_TIMEOUT_S = 120  # generous: torch imports on a loaded 2-core machine take a while
SMALL = {"width": 4, "image_size": 8}


def apply_rank(plans: list, model_kwargs: list) -> None:
    """Rank r applies plans[r] to a branchy_cnn built with model_kwargs[r]."""
    import hybridplan
    rank = int(os.environ["RANK"])
    model = models.branchy_cnn(seed=0, **model_kwargs[rank])
    started = time.monotonic()
    try:
        hybridplan.apply(plans[rank], model, timeout_s=APPLY_TIMEOUT_S,
                         example_inputs=model.example_inputs(plans[rank]["per_replica_batch"]))
    finally:
        print(f"apply returned or raised after {time.monotonic() - started:.1f}s", flush=True)
    print("applied", flush=True)


def _plan(**kw):
    return pipeline_plan(models.branchy_cnn(seed=0, **SMALL), dp=1, mp=2, schedule="1f1b",
                         num_microbatches=2, **kw)


def _assert_all_fail(results, *needles):
    text = format_results(results)
    for r in results:
        assert not r.timed_out, text
        assert r.returncode != 0, text
        assert "ValueError" in r.stderr, text
        for needle in needles:
            assert needle in r.stderr, f"{needle!r} missing on rank {r.rank}:\n{text}"
        assert "applied" not in r.stdout, text
        # failed in the agreement step, not by waiting out a collective timeout
        seconds = float(r.stdout.split("after ")[1].split("s")[0])
        assert seconds < APPLY_TIMEOUT_S, text


def test_ranks_holding_different_plans_all_fail_naming_both_ranks():
    plan = _plan()
    other = copy.deepcopy(plan)
    other["num_microbatches"] = 4
    results = run_ranks("test_executor_safety:apply_rank", 2,
                        {"plans": [plan, other], "model_kwargs": [SMALL, SMALL]},
                        timeout_s=HARNESS_TIMEOUT_S)
    _assert_all_fail(results, "rank 0 and rank 1 hold different plans")


def test_wrong_world_size_fails_on_every_rank():
    plan = _plan()  # pipeline dp=1 x mp=2 needs 2 processes; launch 3
    results = run_ranks("test_executor_safety:apply_rank", 3,
                        {"plans": [plan] * 3, "model_kwargs": [SMALL] * 3},
                        timeout_s=HARNESS_TIMEOUT_S)
    _assert_all_fail(results, "pipeline plan needs world size 2",
                     "(got world size 3)", "ranks 0, 1, 2")


def test_ranks_holding_different_parameter_shapes_all_fail():
    plan = _plan()
    wider = dict(SMALL, num_classes=12)  # fc.weight [12, 16] instead of [10, 16]
    results = run_ranks("test_executor_safety:apply_rank", 2,
                        {"plans": [plan, plan], "model_kwargs": [SMALL, wider]},
                        timeout_s=HARNESS_TIMEOUT_S)
    _assert_all_fail(results, "rank 0 and rank 1 hold different models", "'fc.weight'",
                     "[10, 16] on rank 0", "[12, 16] on rank 1")
