"""The plans test_trainers.py and bench/bench_trainer_parsers.py export to each trainer: the
planner's best plan of each kind a trainer names, and the degrees, schedule, batch, sharding and
recompute a trainer's file can hold, of a Plan and of a trainers.Layout, to compare the two."""

from hybridplan import planner
from hybridplan.planner import Job

JOB = Job.from_dict({"schema_version": 1, "kind": "hybridplan.job", "global_batch": 64,
                     "optimizer": "adam", "mixed_precision": True}, "job")


def _best(g, c, job, devices, **kwargs):
    return planner.search(g, c, job, devices=devices, top_k=1, **kwargs).plans[0]


def _best_pipeline(g, c, job, devices, schedule, tp):
    """The best plan with a real pipeline (mp > 1; the search also offers mp = 1)."""
    plans = planner.search(g, c, job, devices=devices, top_k=200, modes=["pipeline"],
                           schedules=[schedule], tensor_degrees=[tp]).plans
    return next(p for p in plans if p.mode == "pipeline" and p.mp > 1 and p.tp == tp)


def plan_kinds(g, c, job=JOB, devices=8) -> dict:
    """The planner's best plan of each kind a trainer names: data parallel, ZeRO-2, ZeRO-3,
    tensor parallel, each pipeline schedule, a pipeline with tensor parallelism, HSDP (shard
    groups of half the replicas), full and selective recompute."""
    def best(**kwargs):
        return _best(g, c, job, devices, **kwargs)

    plans = {
        "dp": best(modes=["placement"], dp_only=True, shardings=["none"]),
        "zero2": best(modes=["placement"], dp_only=True, shardings=["zero2"],
                      tensor_degrees=[1]),
        "zero3": best(modes=["placement"], dp_only=True, shardings=["zero3"],
                      tensor_degrees=[1]),
        "tp2": best(modes=["placement"], shardings=["none"], tensor_degrees=[2]),
    }
    for schedule in planner.SCHEDULES:
        plans[schedule] = _best_pipeline(g, c, job, devices, schedule, 1)
    plans["1f1b+tp2"] = _best_pipeline(g, c, job, devices, "1f1b", 2)
    hsdp = planner.with_sharding(plans["dp"], "zero3", g, c, job,
                                 dp_shard=max(1, plans["dp"].dp // 2))
    plans["hsdp"] = planner.Plan.from_dict(hsdp)
    plans["full"] = planner.Plan.from_dict(planner.with_recompute(plans["1f1b"], g, c, job))
    plans["selective"] = planner.Plan.from_dict(
        planner.with_recompute(plans["dp"], g, c, job, selective=True))
    return plans


def layout_of_plan(p) -> dict:
    """What a trainer's file can hold of plan `p`."""
    kinds = {"selective" if n in p.selective else "full" for n in p.recompute}
    return {"dp": p.dp, "dp_shard": p.dp_shard if p.sharding != "none" else 1, "tp": p.tp,
            "pp": p.mp if p.mode == "pipeline" else 1, "schedule": p.schedule,
            "virtual_stages": p.virtual_stages, "num_microbatches": p.num_microbatches,
            "global_batch": p.global_batch, "sharding": p.sharding,
            "recompute": kinds.pop() if kinds else "none"}


def layout_of_layout(lay) -> dict:
    """The same of a trainers.Layout (what a trainer's file holds), in the plan's terms."""
    return {"dp": lay.dp, "dp_shard": lay.dp_shard if lay.sharding != "none" else 1,
            "tp": lay.tp, "pp": lay.pp, "schedule": lay.schedule,
            "virtual_stages": lay.virtual_stages, "num_microbatches": lay.num_microbatches,
            "global_batch": lay.global_batch, "sharding": lay.sharding,
            "recompute": lay.recompute}
