"""hybridplan.trainers: plans written as torchtitan / Megatron-LM / DeepSpeed / Accelerate
configurations and read back. For a GPT-2-like and a Llama-like graph (graph_from_config; the
Llama-like one has Llama's proportions: SwiGLU-wide MLP, 32k vocabulary) on dgx-h100, the
planner's plans of several kinds survive export -> parse -> plan_from with the same layout
wherever the trainer can express it, and say in words what it cannot. No trainer package is
needed (bench/bench_trainer_configs.py loads the files with the trainers' own parsers)."""

import json
import subprocess
import sys

import pytest

from hybridplan import planner, trainers
from hybridplan.planner import Cluster, Graph, Job
from hybridplan.profiler.from_config import TransformerConfig, graph_from_config
from hybridplan.trainers.cli import EXIT_NOTHING_EXPRESSED

CONFIGS = {
    "gpt2": TransformerConfig("gpt2-like", layers=4, hidden=256, heads=8, seq_len=256,
                              vocab=1000),
    "llama": TransformerConfig("llama-like", layers=4, hidden=256, heads=8, seq_len=256,
                               vocab=32000, ffn_hidden=688),
}
JOB = Job.from_dict({"schema_version": 1, "kind": "hybridplan.job", "global_batch": 64,
                     "optimizer": "adam", "mixed_precision": True}, "job")
DEVICES = 8


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def problem(request):
    g = Graph.from_dict(graph_from_config(CONFIGS[request.param], device="H100"),
                        request.param)
    return g, Cluster.preset("dgx-h100")


def _best(g, c, **kwargs):
    return planner.search(g, c, JOB, devices=DEVICES, top_k=1, **kwargs).plans[0]


def _best_pipeline(g, c, schedule, tp):
    """The best plan with a real pipeline (mp > 1; the search also offers mp = 1)."""
    plans = planner.search(g, c, JOB, devices=DEVICES, top_k=200, modes=["pipeline"],
                           schedules=[schedule], tensor_degrees=[tp]).plans
    return next(p for p in plans if p.mode == "pipeline" and p.mp > 1 and p.tp == tp)


def _kinds(g, c):
    """The planner's best plan of each kind a trainer names."""
    plans = {
        "dp": _best(g, c, modes=["placement"], dp_only=True, shardings=["none"]),
        "zero2": _best(g, c, modes=["placement"], dp_only=True, shardings=["zero2"],
                       tensor_degrees=[1]),
        "zero3": _best(g, c, modes=["placement"], dp_only=True, shardings=["zero3"],
                       tensor_degrees=[1]),
        "tp2": _best(g, c, modes=["placement"], shardings=["none"], tensor_degrees=[2]),
    }
    for schedule in planner.SCHEDULES:
        plans[schedule] = _best_pipeline(g, c, schedule, 1)
    plans["1f1b+tp2"] = _best_pipeline(g, c, "1f1b", 2)
    hsdp = planner.with_sharding(plans["dp"], "zero3", g, c, JOB, dp_shard=4)
    plans["hsdp"] = planner.Plan.from_dict(hsdp)
    plans["full"] = planner.Plan.from_dict(planner.with_recompute(plans["1f1b"], g, c, JOB))
    plans["selective"] = planner.Plan.from_dict(
        planner.with_recompute(plans["dp"], g, c, JOB, selective=True))
    return plans


def _layout(p):
    kinds = {"selective" if n in p.selective else "full" for n in p.recompute}
    return {"dp": p.dp, "dp_shard": p.dp_shard if p.sharding != "none" else 1, "tp": p.tp,
            "pp": p.mp if p.mode == "pipeline" else 1, "schedule": p.schedule,
            "virtual_stages": p.virtual_stages, "num_microbatches": p.num_microbatches,
            "global_batch": p.global_batch, "sharding": p.sharding,
            "recompute": kinds.pop() if kinds else "none"}


def _expected(reduced):
    """What the trainer's file holds: the reduced layout in the plan's terms."""
    lay = reduced.layout
    return {"dp": lay.dp, "dp_shard": lay.dp_shard if lay.sharding != "none" else 1,
            "tp": lay.tp, "pp": lay.pp, "schedule": lay.schedule,
            "virtual_stages": lay.virtual_stages, "num_microbatches": lay.num_microbatches,
            "global_batch": lay.global_batch, "sharding": lay.sharding,
            "recompute": lay.recompute}


@pytest.mark.parametrize("trainer", sorted(trainers.TRAINERS))
def test_round_trip_keeps_what_the_trainer_expresses(problem, trainer):
    g, c = problem
    for kind, plan in _kinds(g, c).items():
        text, unexpressed = trainers.export(plan, trainer, g, JOB)
        back = trainers.plan_from(trainer, text, g, c, JOB, source=f"{trainer} {kind}")
        reduced = trainers.reduce(plan, trainer, g, JOB)
        assert _layout(back) == _expected(reduced), (kind, text)
        if not unexpressed:
            # the trainer said nothing was lost: the plan came back as it was
            assert _layout(back) == _layout(plan), (kind, text)
        assert back.predicted["step_s"] > 0


def test_torchtitan_and_megatron_express_every_searched_kind_but_their_schedules(problem):
    g, c = problem
    plans = _kinds(g, c)
    for kind, plan in plans.items():
        _, unexpressed = trainers.export(plan, "torchtitan", g, JOB)
        if plan.tp > 1:   # torchtitan always adds sequence parallelism to TP
            assert unexpressed == ["tensor parallelism without sequence parallelism: "
                                   "torchtitan always splits the norms' sequence under tensor "
                                   "parallelism"], kind
        else:
            assert unexpressed == [], kind
        _, unexpressed = trainers.export(plan, "megatron", g, JOB)
        lacks = {"gpipe": "'1f1b'", "interleaved-zb": "'interleaved-1f1b'",
                 "zbv": "'interleaved-1f1b'"}
        if kind in lacks:
            assert unexpressed == [f"schedule {kind!r}: Megatron-LM lacks it; wrote "
                                   f"{lacks[kind]}"]
        else:
            assert unexpressed == [], kind


def test_what_deepspeed_and_accelerate_cannot_say(problem):
    g, c = problem
    plans = _kinds(g, c)
    _, unexpressed = trainers.export(plans["1f1b"], "accelerate", g, JOB)
    assert unexpressed == [f"pipeline of {plans['1f1b'].mp} stages (1f1b): Accelerate sets no "
                           f"pipeline in its configuration; wrote none"]
    _, unexpressed = trainers.export(plans["selective"], "deepspeed", g, JOB)
    assert unexpressed == ["recompute 'selective': DeepSpeed has no such mode; wrote 'full'"]
    _, unexpressed = trainers.export(plans["1f1b"], "deepspeed", g, JOB)
    assert unexpressed == [f"pipeline of {plans['1f1b'].mp} stages: DeepSpeed sets its stages "
                           f"in code (deepspeed.pipe.PipelineModule(layers, num_stages=N)); "
                           f"written under hybridplan_pipeline for the reader, with the "
                           f"micro-batches as gradient_accumulation_steps"]


def test_placement_and_partial_recompute_are_said_in_words(problem):
    g, c = problem
    d = _kinds(g, c)["dp"].to_dict()
    # a 2-device placement of the same nodes, the second half recomputed
    names = [a["name"] for a in d["assignment"]]
    half = len(names) // 2
    d.update(dp=4, mp=2, per_replica_batch=16, mesh=[[2 * r, 2 * r + 1] for r in range(4)])
    d["assignment"] = [dict(a, device=int(i >= half), **({"recompute": True} if i >= half
                                                          else {}))
                       for i, a in enumerate(d["assignment"])]
    d.pop("predicted")
    plan = planner.Plan.from_dict(d).validate(g, c)
    text, unexpressed = trainers.export(plan, "torchtitan", g, JOB)
    assert unexpressed == [
        "placement of each replica's nodes on 2 devices (branches running concurrently): "
        "torchtitan has no such mode; wrote a 2-stage pipeline of one micro-batch",
        f"recompute differs between nodes ({half} none, {len(names) - half} full of "
        f"{len(names)}): torchtitan applies one mode to every layer; wrote 'full'"]
    back = trainers.plan_from("torchtitan", text, g, c, JOB)
    assert (back.mode, back.mp, back.schedule, back.num_microbatches) == \
        ("pipeline", 2, "gpipe", 1)
    assert back.recompute == frozenset(names)


def test_parse_reports_bad_configurations():
    with pytest.raises(ValueError, match=r"^t.toml: parallelism.data_parallel_shard_degree "
                                         r"must be given and >= 1.*\(got -1\)"):
        trainers.parse("torchtitan", "[parallelism]\ndata_parallel_shard_degree = -1\n",
                       source="t.toml")
    with pytest.raises(ValueError, match=r"^a.txt: the world size must be given"):
        trainers.parse("megatron", "--micro-batch-size 2", source="a.txt")
    with pytest.raises(ValueError, match=r"train_batch_size must be a multiple of .* = 6 "
                                         r"\(got 16\)"):
        trainers.parse("deepspeed", json.dumps({"train_batch_size": 16,
                                                "train_micro_batch_size_per_gpu": 3,
                                                "gradient_accumulation_steps": 2}))
    with pytest.raises(ValueError, match=r"trainer must be among .* \(got 'nemo'\)"):
        trainers.parse("nemo", "")


def test_best_for_runs_only_what_the_trainer_expresses(problem):
    g, c = problem
    plan, text = trainers.best_for("accelerate", g, c, JOB, devices=DEVICES)
    assert plan.mode == "placement" and plan.mp == 1
    assert trainers.export(plan, "accelerate", g, JOB) == (text, [])
    plan, text = trainers.best_for("megatron", g, c, JOB, devices=DEVICES)
    assert plan.schedule in ("none", "1f1b", "interleaved-1f1b")
    assert plan.world_size == DEVICES


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "hybridplan", *args], capture_output=True,
                          text=True, timeout=120)


def test_cli_export_and_evaluate_config(tmp_path, problem):
    g, c = problem
    plans = _kinds(g, c)
    (tmp_path / "g.json").write_text(g.to_json())
    (tmp_path / "j.json").write_text(JOB.to_json())
    plans["zbv"].save(tmp_path / "p.json")
    out = tmp_path / "args.txt"
    r = _cli("export", str(tmp_path / "p.json"), "--to", "megatron", "--graph",
             str(tmp_path / "g.json"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "warning: schedule 'zbv': Megatron-LM lacks it" in r.stderr
    assert "--pipeline-model-parallel-size 2" in out.read_text()
    r = _cli("evaluate-config", "--from", "megatron", str(out), "--graph",
             str(tmp_path / "g.json"), "--cluster", "dgx-h100", "--job",
             str(tmp_path / "j.json"))
    assert r.returncode == 0, r.stderr
    assert "your Megatron-LM configuration (8 devices)" in r.stdout
    assert "| step_s |" in r.stdout and "samples/s (" in r.stdout
    # a pure pipeline, one replica: Accelerate can run none of it
    one = next(p for p in planner.search(g, c, JOB, devices=2, top_k=50,
                                         modes=["pipeline"]).plans if p.mp == 2)
    assert one.dp == 1
    one.save(tmp_path / "one.json")
    r = _cli("export", str(tmp_path / "one.json"), "--to", "accelerate")
    assert r.returncode == EXIT_NOTHING_EXPRESSED
    assert "Accelerate can run none of the plan's parallelism (mp)" in r.stderr


def test_torchtitan_default_reshard_is_zero2_under_a_pipeline():
    """torchtitan's "default" keeps parameters gathered across a pipeline's micro-batches."""
    text = ("[training]\nlocal_batch_size = 8\n[parallelism]\ndata_parallel_shard_degree = 2\n"
            "pipeline_parallel_degree = {pp}\npipeline_parallel_microbatch_size = 2\n")
    assert trainers.parse("torchtitan", text.format(pp=2)).sharding == "zero2"
    assert trainers.parse("torchtitan", text.format(pp=1)).sharding == "zero3"
