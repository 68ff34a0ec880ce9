"""hybridplan.trainers: plans written as torchtitan / Megatron-LM / DeepSpeed / Accelerate
configurations and read back. For a GPT-2-like and a Llama-like graph (graph_from_config; the
Llama-like one has Llama's proportions: SwiGLU-wide MLP, 32k vocabulary) on dgx-h100, the
planner's plans of several kinds survive export -> parse -> plan_from with the same layout
wherever the trainer can express it, and say in words what it cannot. No trainer package is
needed (bench/bench_trainer_parsers.py loads the files with the trainers' own parsers). Megatron-
LM's published layouts (docs/megatron_reproduction.md) read from their arguments price exactly
as the reproduction prices them."""

import json
import os
import re
import subprocess
import sys

import pytest

from hybridplan import planner, trainers
from hybridplan.planner import Cluster, Graph
from hybridplan.profiler.from_config import TransformerConfig, graph_from_config
from hybridplan.trainers.cli import EXIT_NOTHING_EXPRESSED
from hybridplan.trainers.layout import layer_stages
from test_from_config import _reproduction   # reproductions/megatron2021/reproduce.py
from trainer_plans import JOB, layout_of_layout as _expected_layout, layout_of_plan as _layout, \
    plan_kinds

CONFIGS = {
    "gpt2": TransformerConfig("gpt2-like", layers=4, hidden=256, heads=8, seq_len=256,
                              vocab=1000),
    "llama": TransformerConfig("llama-like", layers=4, hidden=256, heads=8, seq_len=256,
                               vocab=32000, ffn_hidden=688),
}
DEVICES = 8


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def problem(request):
    g = Graph.from_dict(graph_from_config(CONFIGS[request.param], device="H100"),
                        request.param)
    return g, Cluster.preset("dgx-h100")


def _best(g, c, **kwargs):
    return planner.search(g, c, JOB, devices=DEVICES, top_k=1, **kwargs).plans[0]


def _kinds(g, c):
    return plan_kinds(g, c, JOB, DEVICES)


@pytest.mark.parametrize("trainer", sorted(trainers.TRAINERS))
def test_round_trip_keeps_what_the_trainer_expresses(problem, trainer):
    g, c = problem
    for kind, plan in _kinds(g, c).items():
        text, unexpressed = trainers.export(plan, trainer, g, JOB)
        back = trainers.plan_from(trainer, text, g, c, JOB, source=f"{trainer} {kind}")
        reduced = trainers.reduce(plan, trainer, g, JOB)
        assert _layout(back) == _expected_layout(reduced.layout), (kind, text)
        if not unexpressed:
            # the trainer said nothing was lost: the plan came back as it was
            assert _layout(back) == _layout(plan), (kind, text)
        assert back.predicted["step_s"] > 0


def _boundaries(plan, trainer, unexpressed):
    """`unexpressed` without its note on pipeline stage boundaries, checking that the note is
    there exactly when the trainer's split of whole layers is not the plan's."""
    order = sorted(plan.to_dict()["assignment"], key=lambda a: a["node"])
    differs = plan.mode == "pipeline" and layer_stages(
        [a["name"] for a in order], plan.num_stages,
        trainers.capabilities(trainer).stage_split) != [a["device"] for a in order]
    rest = [u for u in unexpressed if not u.startswith("pipeline stage boundaries")]
    assert (len(rest) < len(unexpressed)) == differs, (trainer, unexpressed)
    return rest


def test_torchtitan_and_megatron_express_every_searched_kind_but_their_schedules(problem):
    """...and the stage boundaries of a pipeline the planner splits inside a layer, or not as
    evenly as the trainer splits whole layers: said in words."""
    g, c = problem
    plans = _kinds(g, c)
    for kind, plan in plans.items():
        _, unexpressed = trainers.export(plan, "torchtitan", g, JOB)
        unexpressed = _boundaries(plan, "torchtitan", unexpressed)
        if plan.tp > 1:   # torchtitan always adds sequence parallelism to TP
            assert unexpressed == ["tensor parallelism without sequence parallelism: "
                                   "torchtitan always splits the norms' sequence under tensor "
                                   "parallelism"], kind
        else:
            assert unexpressed == [], kind
        _, unexpressed = trainers.export(plan, "megatron", g, JOB)
        unexpressed = _boundaries(plan, "megatron", unexpressed)
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
    unexpressed = _boundaries(plans["1f1b"], "deepspeed", unexpressed)
    zero1 = [u for u in unexpressed if u.startswith("sharding 'zero")]
    assert len(zero1) == (plans["1f1b"].sharding != "none")
    assert [u for u in unexpressed if u not in zero1] == [f"pipeline of {plans['1f1b'].mp} stages: DeepSpeed sets its stages "
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


def test_stages_split_whole_layers_as_each_trainer_does():
    """Megatron-LM: whole layers evenly, the embedding with the first stage, the final norm and
    head with the last; torchtitan (generate_llm_fqn_per_model_part) and DeepSpeed's uniform
    partition: the embedding and the output count as a layer each, the first stages one unit
    longer when the count does not divide."""
    names = ["embedding"] + [f"layers.{i}.{part}" for i in range(5) for part in ("attn", "mlp")] \
        + ["final_ln", "lm_head"]
    megatron = layer_stages(names, 5, "layers")
    assert megatron == [0] + [i for i in range(5) for _ in range(2)] + [4, 4]
    # 5 layers + 2 ends = 7 units over 2 stages: 4 (embedding, layers 0-2) and 3 (layers 3-4,
    # output), as torchtitan's generate_llm_fqn_per_model_part(2, 5) splits them
    titan = layer_stages(names, 2, "layers+ends")
    assert titan == [0] + [0] * 6 + [1] * 4 + [1, 1]
    with pytest.raises(ValueError, match=r"^args.txt: a pipeline of 6 stages needs at least as "
                                         r"many layers to split: the graph has 5 layers "
                                         r"\(got 6 stages\)"):
        layer_stages(names, 6, "layers", source="args.txt")
    assert layer_stages(["conv1", "fc"], 2) is None   # no named layers: the caller splits nodes


def test_world_size_is_taken_from_the_launch_line_or_checked():
    args = "--tensor-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 32"
    launch = f"torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py {args}"
    assert trainers.parse("megatron", launch).dp == 8
    assert trainers.parse("megatron", args, world_size=4).dp == 2
    with pytest.raises(ValueError, match=r"torchrun's --nproc-per-node must be an integer >= 1"):
        trainers.parse("megatron", "--nproc-per-node gpu " + args)
    with pytest.raises(ValueError, match=r"^a.txt: --num-layers must be the graph's layer count"):
        g = Graph.from_dict(graph_from_config(CONFIGS["gpt2"], device="H100"), "g")
        trainers.parse("megatron", args + " --num-layers 6", g, source="a.txt", world_size=4)
    toml = "[parallelism]\ndata_parallel_shard_degree = 4\ntensor_parallel_degree = 2\n"
    assert trainers.parse("torchtitan", toml, world_size=8).world_size == 8
    with pytest.raises(ValueError, match=r"^t.toml: the configuration runs on 8 devices .* it "
                                         r"must match the world size \(got 16\)"):
        trainers.parse("torchtitan", toml, source="t.toml", world_size=16)


# ---- Megatron-LM's published layouts (docs/megatron_reproduction.md, Table 1) -------------------

def _megatron_launch(rep, row) -> str:
    """The launch line of a Table 1 run, as a Megatron-LM user writes it: their (t, p), micro-
    batch 1, the global batch, full recompute, fp16."""
    return (f"torchrun --nnodes {row.gpus // 8} --nproc-per-node 8 pretrain_gpt.py \\\n"
            f"  --num-layers {row.layers} --hidden-size {row.hidden} "
            f"--num-attention-heads {row.heads} --seq-length {rep.SEQ} "
            f"--max-position-embeddings {rep.SEQ} \\\n"
            f"  --tensor-model-parallel-size {row.t} --pipeline-model-parallel-size {row.p} "
            f"--micro-batch-size 1 --global-batch-size {row.batch} \\\n"
            f"  --recompute-granularity full --recompute-method uniform "
            f"--recompute-num-layers 1 --fp16\n")


def _table1_plan(rep, g, cluster, row) -> dict:
    """The reproduction's plan of a Table 1 row as Megatron-LM runs the launch line: a p = 1
    row's global / d samples a replica as global / d accumulated micro-batches of 1 (Megatron's
    num_microbatches_calculator, which the reader recovers as accumulation steps; the
    reproduction prices one batch of global / d a replica, docs/megatron_reproduction.md)."""
    plan = rep.megatron_plan(g, cluster, row.t, row.p, row.d, row.batch)
    if row.p == 1:
        plan = dict(plan, per_replica_batch=1, accumulation_steps=row.batch // row.d)
    return plan


@pytest.mark.parametrize("label", ["1.7B", "18.4B", "39.1B", "145.6B"])
def test_megatron_table1_layouts_price_as_the_reproduction(label):
    """evaluate-config's reading of a Table 1 launch line is the plan the reproduction prices
    for the same row: the same stages, ranks and recompute, so the same step, memory and
    TFLOP/s per GPU (p = 1 rows and pipelines of 2 and 8 stages)."""
    rep = _reproduction()
    row = next(r for r in rep.TABLE1 if r.label == label)
    g, cluster, job = rep.graph_for(row), rep.cluster_for(row.gpus), rep.job_for(row.batch)
    theirs = rep.price(g, cluster, _table1_plan(rep, g, cluster, row), job)
    ours = trainers.plan_from("megatron", _megatron_launch(rep, row), g, cluster, job).predicted
    assert (ours["step_s"], ours["memory_bytes"]) == (theirs["step_s"], theirs["memory_bytes"])
    assert rep.tflops(row, row.batch, row.gpus, ours["step_s"]) == \
        rep.tflops(row, row.batch, row.gpus, theirs["step_s"])


def test_cli_evaluate_config_prices_a_table1_launch_line(tmp_path):
    """The command a user runs on their own launch line prints the reproduction's step."""
    rep = _reproduction()
    row = next(r for r in rep.TABLE1 if r.label == "1.7B")
    g, cluster, job = rep.graph_for(row), rep.cluster_for(row.gpus), rep.job_for(row.batch)
    theirs = rep.price(g, cluster, _table1_plan(rep, g, cluster, row), job)
    (tmp_path / "g.json").write_text(g.to_json())
    (tmp_path / "c.json").write_text(cluster.to_json())
    (tmp_path / "j.json").write_text(job.to_json())
    (tmp_path / "launch.sh").write_text(_megatron_launch(rep, row))
    r = _cli("evaluate-config", "--from", "megatron", str(tmp_path / "launch.sh"), "--graph",
             str(tmp_path / "g.json"), "--cluster", str(tmp_path / "c.json"), "--job",
             str(tmp_path / "j.json"))
    assert r.returncode == 0, r.stderr
    assert "your Megatron-LM configuration (32 devices): dp 32, tp 1, recompute full" in r.stdout
    step = next(line for line in r.stdout.splitlines() if line.startswith("| step_s |"))
    assert step.split("|")[2].strip() == f"{theirs['step_s']:.4g}"


# ---- python -m hybridplan plan [--for TRAINER] -------------------------------------------------

def test_cli_plan_for_a_trainer(tmp_path, problem):
    g, c = problem
    (tmp_path / "g.json").write_text(g.to_json())
    (tmp_path / "j.json").write_text(JOB.to_json())
    common = ["plan", "--graph", str(tmp_path / "g.json"), "--cluster", "dgx-h100", "--job",
              str(tmp_path / "j.json"), "--devices", str(DEVICES)]
    r = _cli(*common, "--for", "megatron", "--out", str(tmp_path / "p.json"),
             "--config-out", str(tmp_path / "args.txt"))
    assert r.returncode == 0, r.stderr
    plan = planner.Plan.load(tmp_path / "p.json")
    want, text = trainers.best_for("megatron", g, c, JOB, devices=DEVICES)
    assert plan.predicted["step_s"] == want.predicted["step_s"]
    assert (tmp_path / "args.txt").read_text() == text
    assert r.stdout.startswith(f"best Megatron-LM can run on {DEVICES} devices: ")
    # Accelerate runs no pipeline: its best is a placement plan, its YAML on stdout
    r = _cli(*common, "--for", "accelerate")
    assert r.returncode == 0, r.stderr
    assert "distributed_type:" in r.stdout and "pp " not in r.stdout.splitlines()[0]
    # without --for: the planner's own best, which no trainer limits
    r = _cli(*common, "--out", str(tmp_path / "free.json"))
    assert r.returncode == 0, r.stderr
    free = planner.Plan.load(tmp_path / "free.json")
    assert free.predicted["step_s"] == _best(g, c).predicted["step_s"]
    r = _cli(*common, "--config-out", str(tmp_path / "x"))
    assert r.returncode == 2 and "--config-out needs --for TRAINER" in r.stderr


def test_the_built_cli_plans_for_a_trainer_through_python(tmp_path, problem, hybridplan_cli):
    """`hybridplan plan --for TRAINER` (C++) runs `python3 -m hybridplan plan --for TRAINER`:
    what a trainer runs is defined once, in Python; the search's own flags are refused."""
    g, _ = problem
    (tmp_path / "g.json").write_text(g.to_json())
    (tmp_path / "j.json").write_text(JOB.to_json())
    common = ["plan", "--graph", str(tmp_path / "g.json"), "--cluster", "dgx-h100", "--job",
              str(tmp_path / "j.json"), "--devices", str(DEVICES), "--for", "deepspeed"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = ["--out", str(tmp_path / "p.json")]
    built = subprocess.run([hybridplan_cli, *common, *out], capture_output=True, text=True,
                           env=env, timeout=300)
    assert built.returncode == 0, built.stderr
    from_cpp = planner.Plan.load(tmp_path / "p.json").to_json()
    python = _cli(*common, *out)
    assert python.returncode == 0, python.stderr
    assert built.stdout == python.stdout
    assert from_cpp == planner.Plan.load(tmp_path / "p.json").to_json()
    refused = subprocess.run([hybridplan_cli, *common, "--schedules", "1f1b"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert refused.returncode == 2
    assert "--schedules cannot be combined with it" in refused.stderr
    unknown = subprocess.run([hybridplan_cli, *common[:-1], "nemo"], capture_output=True,
                             text=True, env=env, timeout=300)
    assert unknown.returncode != 0 and "nemo" in unknown.stderr


def test_accelerate_batch_comes_from_the_job_when_the_file_has_none(problem):
    """A user's own Accelerate YAML has no batch (the script sets it): the Job says it."""
    g, c = problem
    yaml = ("distributed_type: FSDP\nmixed_precision: bf16\nnum_processes: 8\n"
            "fsdp_config:\n  fsdp_version: 2\n  fsdp_reshard_after_forward: true\n")
    plan = trainers.plan_from("accelerate", yaml, g, c, JOB)
    assert (plan.dp, plan.global_batch, plan.sharding) == (8, 64, "zero3")
    with pytest.raises(ValueError, match=r"^a.yaml: an Accelerate configuration holds no batch"):
        trainers.plan_from("accelerate", yaml, g, c, None, source="a.yaml")


def test_export_keeps_to_what_the_trainers_own_parsers_accept(problem):
    """What the trainers' own parsers refused (bench/bench_trainer_parsers.py): Accelerate's
    ParallelismConfig takes tensor parallelism only beside sharded data parallelism (it refuses
    dp_replicate > 1 with dp_shard 1), DeepSpeed 0.19.8 refuses MiCS's mics_shard_size, and
    Megatron-LM's validate_args takes Megatron-FSDP only with the fsdp_dtensor checkpoint
    format and CUDA_DEVICE_MAX_CONNECTIONS not 1 (with tensor parallelism otherwise: 1)."""
    g, c = problem
    plans = _kinds(g, c)
    tp2 = plans["tp2"]
    assert tp2.dp > 1 and tp2.sharding == "none"
    text, unexpressed = trainers.export(tp2, "accelerate", g, JOB)
    assert unexpressed == [f"tensor parallelism with unsharded data parallelism: Accelerate "
                           f"composes tensor parallelism with sharded data parallelism only; "
                           f"wrote 'zero2' over the {tp2.dp} replicas"]
    assert "parallelism_config_dp_replicate_size: 1\n" in text
    assert f"parallelism_config_dp_shard_size: {tp2.dp}\n" in text
    hsdp = plans["hsdp"]
    text, unexpressed = trainers.export(hsdp, "deepspeed", g, JOB)
    assert "mics_shard_size" not in text and '"stage": 3' in text
    assert unexpressed == [f"hybrid sharding (shard groups of {hsdp.dp_shard} of {hsdp.dp} "
                           f"replicas): DeepSpeed lacks it; wrote one shard group of {hsdp.dp}"]
    text, _ = trainers.export(plans["zero3"], "megatron", g, JOB)
    assert "--use-megatron-fsdp" in text and "--ckpt-format fsdp_dtensor" in text
    assert "CUDA_DEVICE_MAX_CONNECTIONS unset or above 1" in text
    text, _ = trainers.export(tp2, "megatron", g, JOB)
    assert "launch with CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    # DeepSpeed's pipeline engine asserts ZeRO stage < 2: a sharded pipeline is written as
    # ZeRO-1, said in words
    piped = planner.Plan.from_dict(planner.with_sharding(plans["1f1b"], "zero2", g, c, JOB))
    text, unexpressed = trainers.export(piped, "deepspeed", g, JOB)
    assert '"stage": 1' in text
    assert any(u.startswith("sharding 'zero2' under a pipeline: DeepSpeed's pipeline engine "
                            "refuses ZeRO-2 and ZeRO-3") for u in unexpressed)
    # older DeepSpeed configurations with MiCS still read as hybrid sharding
    old = json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8,
                      "zero_optimization": {"stage": 3, "mics_shard_size": 4}})
    assert (trainers.parse("deepspeed", old).dp_shard, trainers.parse("deepspeed", old).dp) \
        == (4, 8)


# ---- gradient accumulation and precision in every trainer's file --------------------------------

K = 4


def _job(precision, accumulation_steps=K):
    return planner.Job.from_dict({"schema_version": 1, "kind": "hybridplan.job",
                                  "global_batch": 64, "optimizer": "adam",
                                  "precision": precision,
                                  "accumulation_steps": accumulation_steps}, "job")


def _arithmetic(trainer, text, plan):
    """What `trainer` computes from its own keys in `text` (read here as the trainer reads
    them, not through trainers.parse): (micro-batch, accumulation steps, micro-batches per
    pipeline schedule, data-parallel size, global batch, precision). Each trainer's own
    divisibility rule is checked where it has one."""
    import shlex
    import tomllib

    import yaml
    if trainer == "torchtitan":
        d = tomllib.loads(text)
        train, par = d["training"], d["parallelism"]
        dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
        local, glob = train["local_batch_size"], train["global_batch_size"]
        # torchtitan's Trainer: global % (local x dp) == 0, K = global / (local x dp); each
        # step runs local / pipeline_parallel_microbatch_size micro-batches
        assert glob % (local * dp) == 0, text
        micro = par.get("pipeline_parallel_microbatch_size", local) \
            if par.get("pipeline_parallel_degree", 1) > 1 else local
        precision = {"bfloat16": "bf16", "float32": "fp32"}[train["mixed_precision_param"]]
        return micro, glob // (local * dp), local // micro, dp, glob, precision
    if trainer == "megatron":
        words = shlex.split(" ".join(ln.split("#", 1)[0].rstrip().rstrip("\\")
                                     for ln in text.splitlines()))
        value = {w: words[i + 1] for i, w in enumerate(words[:-1]) if w.startswith("--")}
        micro, glob = int(value["--micro-batch-size"]), int(value["--global-batch-size"])
        dp = plan.world_size // (int(value["--tensor-model-parallel-size"]) *
                                 int(value["--pipeline-model-parallel-size"]))
        # num_microbatches_calculator: global % (micro x dp) == 0, global / (micro x dp)
        # micro-batches a step: accumulated without a pipeline, one schedule under one
        assert glob % (micro * dp) == 0, text
        count = glob // (micro * dp)
        precision = "bf16" if "--bf16" in words else "fp16" if "--fp16" in words else "fp32"
        assert not ("--bf16" in words and "--fp16" in words), text
        if int(value["--pipeline-model-parallel-size"]) == 1:
            return micro, count, 1, dp, glob, precision
        return micro, 1, count, dp, glob, precision
    if trainer == "deepspeed":
        d = json.loads(text)
        micro, steps = d["train_micro_batch_size_per_gpu"], d["gradient_accumulation_steps"]
        dp = plan.world_size // (d.get("tensor_parallel", {}).get("autotp_size", 1) *
                                 d.get("hybridplan_pipeline", {}).get("num_stages", 1))
        # DeepSpeed's config check: train_batch_size = micro x gradient_accumulation x dp
        assert d["train_batch_size"] == micro * steps * dp, text
        assert not (d["bf16"]["enabled"] and d["fp16"]["enabled"]), text
        precision = "bf16" if d["bf16"]["enabled"] else "fp16" if d["fp16"]["enabled"] \
            else "fp32"
        if "hybridplan_pipeline" not in d:
            return micro, steps, 1, dp, d["train_batch_size"], precision
        return micro, 1, steps, dp, d["train_batch_size"], precision
    d = yaml.safe_load(text)   # accelerate: the Accelerator's steps from the launch's env
    steps = int(re.search(r"ACCELERATE_GRADIENT_ACCUMULATION_STEPS=(\d+)", text).group(1)) \
        if "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" in text else 1
    per = int(re.search(r"# per-process batch (\d+)", text).group(1))
    dp = d["num_processes"] // (d.get("parallelism_config") or {}).get(
        "parallelism_config_tp_size", 1)
    precision = {"bf16": "bf16", "fp16": "fp16", "no": "fp32"}[d["mixed_precision"]]
    return per, steps, 1, dp, per * steps * dp, precision


@pytest.mark.parametrize("trainer", sorted(trainers.TRAINERS))
def test_exports_carry_the_accumulation_steps_and_precision(problem, trainer):
    """A plan with K = 4 accumulation steps in bf16, of every kind: each trainer's file, read
    by the trainer's own rule, runs the plan's global batch as micro-batch x K x dp, with the
    plan's micro-batch per forward, its K (under a pipeline, Megatron-LM and DeepSpeed run the
    K x micro-batches in one schedule, said in words) and --bf16 / bf16.enabled /
    mixed_precision bf16; reading it back gives the same K where the trainer's reading holds
    it."""
    g, c = problem
    job = _job("bf16")
    caps = trainers.capabilities(trainer)
    for kind, plan in plan_kinds(g, c, job, DEVICES).items():
        assert (plan.accumulation_steps, plan.precision) == (K, "bf16"), kind
        text, unexpressed = trainers.export(plan, trainer, g, job)
        pp = plan.mp if plan.mode == "pipeline" else 1
        if trainer == "accelerate" and pp > 1:
            continue   # Accelerate runs no pipeline (test_what_deepspeed_and_accelerate...)
        micro, steps, microbatches, dp, glob, precision = _arithmetic(trainer, text, plan)
        assert micro * steps * microbatches * dp == glob == plan.global_batch, (kind, text)
        assert dp == plan.dp and precision == "bf16", (kind, text)
        piped = pp > 1 and caps.pipeline_accumulates
        assert micro == plan.per_replica_batch // plan.num_microbatches, (kind, text)
        assert (steps, microbatches) == ((1, K * plan.num_microbatches) if piped
                                         else (K, plan.num_microbatches)), (kind, text)
        notes = [u for u in unexpressed if "gradient-accumulation steps" in u]
        assert len(notes) == (piped or bool(caps.accumulation_note)), (kind, unexpressed)
        layout = trainers.parse(trainer, text, g, world_size=plan.world_size)
        assert layout.global_batch == plan.global_batch, (kind, text)
        assert layout.accumulation_steps == (1 if piped else K), kind
        back = trainers.plan_from(trainer, text, g, c, job)
        assert back.accumulation_steps == layout.accumulation_steps
        assert back.global_batch == plan.global_batch


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_megatron_reads_back_the_accumulation_steps_and_precision(problem, precision):
    """Megatron-LM's reader recovers K by Megatron's own rule (num_microbatches_calculator:
    global / (micro x dp) micro-batches a step, accumulated one after another without a
    pipeline) and the precision from --bf16 / --fp16: a plan of K = 4 steps, exported and read
    back, is the same plan (under a pipeline the K x micro-batches come back as one schedule,
    as export says in words)."""
    g, c = problem
    job = _job(precision)
    for kind, plan in plan_kinds(g, c, job, DEVICES).items():
        text, unexpressed = trainers.export(plan, "megatron", g, job)
        back = trainers.plan_from("megatron", text, g, c, job, source=f"megatron {kind}")
        assert back.precision == plan.precision == precision, (kind, text)
        assert back.global_batch == plan.global_batch, (kind, text)
        if plan.mode == "pipeline":
            assert (back.accumulation_steps, back.num_microbatches) == \
                (1, K * plan.num_microbatches), (kind, text)
            continue
        assert (back.accumulation_steps, back.per_replica_batch) == \
            (K, plan.per_replica_batch), (kind, text)
        if not _boundaries(plan, "megatron", unexpressed):
            assert _layout(back) == _layout(plan), (kind, text)


def test_megatron_refuses_what_megatron_refuses():
    """A global batch that micro-batch x dp does not divide, and --bf16 with --fp16, name the
    flags (Megatron's num_microbatches_calculator and validate_args refuse them)."""
    args = "--micro-batch-size 2 --global-batch-size {} --tensor-model-parallel-size 2"
    assert trainers.parse("megatron", args.format(24), world_size=8).accumulation_steps == 3
    with pytest.raises(ValueError, match=r"^a.txt: --global-batch-size must be a multiple of "
                                         r"--micro-batch-size 2 x the data-parallel size 4 "
                                         r".*got 20\)"):
        trainers.parse("megatron", args.format(20), source="a.txt", world_size=8)
    with pytest.raises(ValueError, match=r"^a.txt: --bf16 and --fp16 must not both be given"):
        trainers.parse("megatron", args.format(8) + " --bf16 --fp16", source="a.txt",
                       world_size=8)


def test_the_micro_batch_each_trainer_writes_for_accumulation(problem):
    """The samples one forward takes per rank are the plan's per-replica batch (a micro-batch
    of it under a pipeline), not the replica's share of the global batch, which is K times
    more."""
    g, c = problem
    job = _job("bf16")
    plans = plan_kinds(g, c, job, DEVICES)
    dp, piped = plans["dp"], plans["1f1b"]
    assert dp.per_replica_batch * K * dp.dp == 64
    for trainer in sorted(trainers.TRAINERS):
        text, _ = trainers.export(dp, trainer, g, job)
        assert _arithmetic(trainer, text, dp)[:2] == (dp.per_replica_batch, K), trainer
    micro = piped.per_replica_batch // piped.num_microbatches
    text, _ = trainers.export(piped, "torchtitan", g, job)
    assert (f"local_batch_size = {piped.per_replica_batch}\n" in text and
            f"pipeline_parallel_microbatch_size = {micro}\n" in text), text
    text, _ = trainers.export(piped, "megatron", g, job)
    assert f"--micro-batch-size {micro}" in text and "--global-batch-size 64" in text
    text, _ = trainers.export(piped, "deepspeed", g, job)
    assert json.loads(text)["gradient_accumulation_steps"] == K * piped.num_microbatches


def test_fp16_is_written_where_the_trainer_has_it(problem):
    """fp16 plans: Megatron-LM's --fp16, DeepSpeed's fp16.enabled (its loss scaler),
    Accelerate's mixed_precision fp16; torchtitan's mixed_precision_param has no float16: bf16
    written, said in words. Each reads back as fp16 where written."""
    g, c = problem
    job = _job("fp16", 1)
    plan = plan_kinds(g, c, job, DEVICES)["zero3"]
    assert plan.precision == "fp16"
    for trainer in sorted(trainers.TRAINERS):
        text, unexpressed = trainers.export(plan, trainer, g, job)
        precision = _arithmetic(trainer, text, plan)[5]
        said = [u for u in unexpressed if u.startswith("precision 'fp16'")]
        if trainer == "torchtitan":
            assert precision == "bf16" and said == [
                "precision 'fp16': torchtitan's file sets fp32 or bf16 only; wrote 'bf16'"]
        else:
            assert precision == "fp16" and not said, (trainer, text)
        assert trainers.parse(trainer, text, g, world_size=plan.world_size).precision == \
            precision
