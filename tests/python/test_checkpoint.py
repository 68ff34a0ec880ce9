"""Checkpoints that move between plans (a job re-planned mid-run must not lose its training):
save under one plan, resume under another, and the result equals uninterrupted one-process
training.

Two launches of 2 Gloo ranks (dist_harness): the first trains every scenario K1 steps under its
first plan and saves a checkpoint (then tries a second save whose torch.save dies mid-write),
the second resumes each checkpoint under the other plan and trains K2 more steps. The gathered
state_dict must equal one process trained K1 + K2 steps on the same global batches (SGD with
momentum and Adam; rtol 1e-5 / 1e-4, atol 1e-6 absorb float reassociation). GPT-2 (tied wte /
lm_head, the copies on different pipeline stages) checks that a tied weight's optimizer state is
saved once and given to every copy. Sharded DP plans ("sharding" zero2 / zero3: FSDP2 holds
each parameter and its Adam moments as DTensor shards) save the same consolidated file, every
rank gathering its shards, and resume with each rank taking its shard of the saved state.
Multi-stage pipeline plans (interleaved-1f1b and zbv, two stages per rank; zbv holds both of
GPT-2's tied copies on rank 0, each with its own optimizer state) save and resume the same way.
"""

import os

import pytest
import torch

import hybridplan.models as models
from dist_harness import require_phase, run_phases
from plan_builders import pipeline_plan, placement_plan

K1, K2 = 3, 2
GLOBAL_BATCH = 8
# (model, optimizer, first plan, second plan); plans: "pipe" = pipeline 1x2 GPipe with 2
# micro-batches, "dp" = placement 2x1 (DDP), "zero2" / "zero3" = placement 2x1 sharded (FSDP2),
# "interleaved" / "zbv" = pipeline 1x2 with 4 stages (virtual_stages 2) and 2 micro-batches
SCENARIOS = [
    ("branchy_cnn", "sgd", "pipe", "dp"),
    ("branchy_cnn", "sgd", "dp", "pipe"),
    ("branchy_cnn", "adam", "pipe", "dp"),
    ("branchy_cnn", "adam", "dp", "pipe"),
    ("gpt2", "adam", "pipe", "dp"),
    ("gpt2", "sgd", "dp", "pipe"),
    ("gpt2", "adam", "zero3", "pipe"),
    ("gpt2", "adam", "pipe", "zero2"),
    ("gpt2", "adam", "interleaved", "pipe"),
    ("gpt2", "sgd", "dp", "interleaved"),
    ("gpt2", "adam", "zbv", "dp"),
]
IDS = ["-".join(s) for s in SCENARIOS]


def make(name):
    """(model, batch(n, seed) -> (inputs, target), loss_fn), the same on every call."""
    if name == "gpt2":
        from user_models import gpt2
        return gpt2()
    model = models.get(name, seed=0, width=8, image_size=16)
    return (model, lambda n, seed: (model.example_inputs(n, seed=100 + seed),
                                    model.example_target(n, seed=200 + seed)), model.loss)


def optimizer(kind, model_name):
    if kind == "sgd":
        return lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9)
    # GPT-2's attention key bias has a zero gradient in exact arithmetic (softmax ignores a
    # per-query constant), so its float gradient is rounding noise that Adam would scale up to
    # lr-sized steps: a larger eps keeps such noise from moving it (real gradients are ~1e-2)
    eps = 1e-3 if model_name == "gpt2" else 1e-8
    return lambda params: torch.optim.Adam(params, lr=0.01, eps=eps)


def plan_of(model, kind):
    if kind == "pipe":
        return pipeline_plan(model, dp=1, mp=2, schedule="gpipe", num_microbatches=2,
                             per_replica_batch=GLOBAL_BATCH)
    if kind in ("interleaved", "zbv"):
        return pipeline_plan(model, dp=1, mp=2, num_microbatches=2,
                             schedule="interleaved-1f1b" if kind == "interleaved" else "zbv",
                             per_replica_batch=GLOBAL_BATCH, virtual_stages=2)
    plan = placement_plan(model, dp=2, mp=1, per_replica_batch=GLOBAL_BATCH // 2)
    return plan if kind == "dp" else dict(plan, sharding=kind)


def as_call(inputs):
    return ((), inputs) if isinstance(inputs, dict) else (tuple(inputs), {})


def applied(scenario, plan_kind, **kw):
    import hybridplan
    name, opt, _, _ = scenario
    model, batch, loss_fn = make(name)
    plan = plan_of(model, plan_kind)
    inputs = batch(plan["per_replica_batch"], 0)[0]
    example = dict(inputs) if isinstance(inputs, dict) else tuple(inputs)
    hp = hybridplan.apply(plan, model, loss_fn=loss_fn, optimizer=optimizer(opt, name),
                          timeout_s=60, example_inputs=example, **kw)
    return hp, batch


def train(hp, batch, first_step, steps):
    for step in range(first_step, first_step + steps):
        inputs, target = batch(GLOBAL_BATCH, step)
        hp.step(*hp.shard(inputs, target))


# ---- rank side --------------------------------------------------------------------------------

def save_phase(out_dir):
    """K1 steps under each scenario's first plan, then save; then a save that dies mid-write."""
    import torch.distributed as dist
    from hybridplan.executor import checkpoint
    torch.set_num_threads(1)
    for scenario, sid in zip(SCENARIOS, IDS):
        hp, batch = applied(scenario, scenario[2])
        train(hp, batch, 0, K1)
        path = os.path.join(out_dir, f"{sid}.pt")
        hp.save_checkpoint(path)
        train(hp, batch, K1, 1)  # the state moves on; the next save must not land
        real_save = checkpoint._save

        def dying_save(obj, f):
            f.write(b"PK\x03\x04 half a checkpoint")
            raise OSError("simulated crash in the middle of torch.save")
        checkpoint._save = dying_save
        try:
            hp.save_checkpoint(path)
            outcome = "saved"
        except RuntimeError as e:
            outcome = str(e)
        finally:
            checkpoint._save = real_save
        with open(os.path.join(out_dir, f"{sid}.interrupted.rank{dist.get_rank()}.txt"),
                  "w") as f:
            f.write(outcome)
    dist.destroy_process_group()


def resume_phase(out_dir):
    """Each checkpoint resumed under the scenario's second plan, K2 more steps; then a
    checkpoint of another model, which apply() must refuse."""
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"])
    for scenario, sid in zip(SCENARIOS, IDS):
        hp, batch = applied(scenario, scenario[3],
                            resume_from=os.path.join(out_dir, f"{sid}.pt"))
        resumed_at = hp.step_count
        train(hp, batch, K1, K2)
        torch.save({"state": hp.state_dict(), "resumed_at": resumed_at,
                    "step_count": hp.step_count},
                   os.path.join(out_dir, f"{sid}.resumed.rank{rank}.pt"))
    import hybridplan
    other = models.get("branchy_cnn", seed=0, width=12, image_size=16)  # wider: other shapes
    try:
        hybridplan.apply(plan_of(other, "dp"), other, timeout_s=60,
                         resume_from=os.path.join(out_dir, f"{IDS[0]}.pt"))
        message = "accepted"
    except ValueError as e:
        message = str(e)
    with open(os.path.join(out_dir, f"other_model.rank{rank}.txt"), "w") as f:
        f.write(message)
    dist.destroy_process_group()


# ---- test side --------------------------------------------------------------------------------

def reference(scenario):
    """One process, K1 + K2 steps on the global batches."""
    torch.set_num_threads(1)
    model, batch, loss_fn = make(scenario[0])
    opt = optimizer(scenario[1], scenario[0])(model.parameters())
    for step in range(K1 + K2):
        inputs, target = batch(GLOBAL_BATCH, step)
        args, kwargs = as_call(inputs)
        opt.zero_grad()
        loss_fn(model(*args, **kwargs), target).backward()
        opt.step()
    return model.state_dict()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_phases("test_checkpoint", ("save_phase", "resume_phase"),
                      tmp_path_factory.mktemp("checkpoint"), timeout_s=300)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_resume_under_another_plan_equals_uninterrupted_training(runs, scenario):
    out_dir = require_phase(runs, "resume_phase")
    sid = IDS[SCENARIOS.index(scenario)]
    expected = reference(scenario)
    initial = make(scenario[0])[0].state_dict()
    assert any(not torch.equal(expected[k], initial[k]) for k in expected)
    tol = dict(rtol=1e-5, atol=1e-6) if scenario[1] == "sgd" else dict(rtol=1e-4, atol=1e-5)
    for rank in range(2):
        out = torch.load(out_dir / f"{sid}.resumed.rank{rank}.pt")
        assert out["resumed_at"] == K1 and out["step_count"] == K1 + K2
        assert list(out["state"]) == list(expected)
        for key in expected:
            torch.testing.assert_close(out["state"][key], expected[key], **tol,
                                       msg=lambda m, k=key: f"{sid} rank {rank} {k}: {m}")


def test_checkpoint_file_is_plain_and_complete(runs):
    """The format docs/formats.md describes: plain containers (weights_only loads it), the
    original module's keys, optimizer state by parameter name (a tied weight once)."""
    out_dir = require_phase(runs, "save_phase")
    from hybridplan.executor import checkpoint
    ckpt = torch.load(out_dir / "gpt2-adam-pipe-dp.pt", weights_only=True)
    assert ckpt["format"] == "hybridplan.checkpoint" and ckpt["version"] == 1
    assert ckpt["step"] == K1 and ckpt["plan"].startswith("{")
    model = make("gpt2")[0]
    assert list(ckpt["model"]) == list(model.state_dict())
    assert torch.equal(ckpt["model"]["lm_head.weight"], ckpt["model"]["transformer.wte.weight"])
    named = [n for n, _ in model.named_parameters()]
    assert sorted(ckpt["optimizer"]["state"]) == sorted(named)  # lm_head.weight: an alias
    assert ckpt["optimizer"]["class"] == "Adam"
    assert int(ckpt["optimizer"]["state"]["transformer.wte.weight"]["step"]) == K1
    assert checkpoint.load(out_dir / "gpt2-adam-pipe-dp.pt")["graph_sha256"]


def test_multi_stage_checkpoint_holds_each_parameter_once(runs):
    """Saved under zbv, rank 0 holds GPT-2's wte (stage 0) and its tied lm_head copy (stage 3)
    with an optimizer state each: the file holds the weight and its state once, and every
    parameter once in the optimizer's groups."""
    out_dir = require_phase(runs, "save_phase")
    ckpt = torch.load(out_dir / "gpt2-adam-zbv-dp.pt", weights_only=True)
    model = make("gpt2")[0]
    assert list(ckpt["model"]) == list(model.state_dict())
    assert torch.equal(ckpt["model"]["lm_head.weight"], ckpt["model"]["transformer.wte.weight"])
    named = sorted(n for n, _ in model.named_parameters())
    assert sorted(ckpt["optimizer"]["state"]) == named
    assert sorted(n for g in ckpt["optimizer"]["param_groups"] for n in g["params"]) == named
    assert int(ckpt["optimizer"]["state"]["transformer.wte.weight"]["step"]) == K1
    assert '"virtual_stages":2' in ckpt["plan"] and '"schedule":"zbv"' in ckpt["plan"]


def test_sharded_checkpoint_holds_whole_tensors(runs):
    """A sharded plan's file is the consolidated one: every model tensor and Adam moment at the
    parameter's full shape (gathered from the ranks' shards), a tied weight's state once."""
    out_dir = require_phase(runs, "save_phase")
    ckpt = torch.load(out_dir / "gpt2-adam-zero3-pipe.pt", weights_only=True)
    model = make("gpt2")[0]
    assert {k: v.shape for k, v in ckpt["model"].items()} == \
        {k: v.shape for k, v in model.state_dict().items()}
    assert torch.equal(ckpt["model"]["lm_head.weight"], ckpt["model"]["transformer.wte.weight"])
    params = dict(model.named_parameters())
    assert sorted(ckpt["optimizer"]["state"]) == sorted(params)
    for name, state in ckpt["optimizer"]["state"].items():
        assert state["exp_avg"].shape == state["exp_avg_sq"].shape == params[name].shape, name
        assert int(state["step"]) == K1
    assert "zero3" in ckpt["plan"]


def test_interrupted_write_leaves_previous_checkpoint(runs):
    out_dir = require_phase(runs, "save_phase")
    for sid in IDS:
        for rank in range(2):
            text = (out_dir / f"{sid}.interrupted.rank{rank}.txt").read_text()
            assert "checkpoint not written" in text and "simulated crash" in text, text
        assert torch.load(out_dir / f"{sid}.pt", weights_only=True)["step"] == K1
    leftovers = [p.name for p in out_dir.iterdir() if ".tmp-" in p.name]
    assert leftovers == []


def test_checkpoint_of_another_model_is_refused(runs):
    out_dir = require_phase(runs, "resume_phase")
    for rank in range(2):
        text = (out_dir / f"other_model.rank{rank}.txt").read_text()
        assert f"{IDS[0]}.pt" in text, text
        assert "must be torch.float32[" in text and "another model" in text, text


def _reader():
    bin_dir = os.environ.get("HYBRIDPLAN_BIN_DIR") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
        "build", "bin")
    return os.path.join(bin_dir, "read_checkpoint")


@pytest.mark.skipif(not os.path.exists(_reader()),
                    reason=f"{_reader()} is not built (make build, or set HYBRIDPLAN_BIN_DIR)")
def test_cpp_reads_the_checkpoint(runs):
    """LibTorch alone (torch::pickle_load, examples/cpp/read_checkpoint.cc) reads the file
    Python wrote: every model tensor (shape and sum) and the optimizer state by name."""
    import subprocess
    out_dir = require_phase(runs, "save_phase")
    path = out_dir / "gpt2-adam-pipe-dp.pt"
    proc = subprocess.run([_reader(), str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    ckpt = torch.load(path, weights_only=True)
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["format hybridplan.checkpoint", f"step {K1}"]
    tensors = {ln.split()[1]: ln for ln in lines if ln.startswith("tensor ")}
    assert list(tensors) == list(ckpt["model"])
    for key, t in ckpt["model"].items():
        total = float(tensors[key].rsplit(" ", 1)[1])
        assert abs(total - t.double().sum().item()) <= 1e-6 * max(1.0, abs(total)), tensors[key]
    states = {ln.split()[1]: ln.split()[2:] for ln in lines if ln.startswith("state ")}
    assert states == {k: list(v) for k, v in ckpt["optimizer"]["state"].items()}
    assert f"optimizer Adam {len(states)}" in lines
    bad = out_dir / "not_a_checkpoint.pt"
    bad.write_bytes(b"not a zip")
    proc = subprocess.run([_reader(), str(bad)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and f"{bad}: checkpoint must be a torch.save file" in proc.stderr
