"""AppliedPlan.export_pretrained (executor/hf_export.py): a Hugging Face GPT-2 built from a
small config (no download) trained under a plan, exported as config.json + model.safetensors,
loads with GPT2LMHeadModel.from_pretrained in this process and gives the logits of the trained
state.

One launch of 2 Gloo ranks (dist_harness): a pipeline plan (mp=2, GPipe, 2 micro-batches:
wte on stage 0, its tied lm_head copy on stage 1) trains K steps and exports; one more step,
then an export whose save_pretrained dies mid-write (the previous export must stay, every rank
must raise), then an export over the previous one. A zero3 data-parallel plan (dp=2, FSDP2:
the original module holds DTensor shards) trains K steps and exports. A plain nn.Module's
export is refused with a ValueError on every rank. Rank 0 saves hp.state_dict() after each
export: the loaded model's weights equal it exactly and its logits match a fresh model loaded
with it within 1e-6 (and one-process training within the float-reassociation tolerance of
test_checkpoint).
"""

import json
import os

import pytest
import torch
from torch import nn

from dist_harness import format_results, run_ranks
from plan_builders import pipeline_plan, placement_plan

K = 3
GLOBAL_BATCH = 8


def sgd(params):
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def applied(kind):
    import hybridplan
    from user_models import gpt2
    model, batch, loss_fn = gpt2()
    if kind == "pipe":
        plan = pipeline_plan(model, dp=1, mp=2, schedule="gpipe", num_microbatches=2,
                             per_replica_batch=GLOBAL_BATCH)
    else:
        plan = dict(placement_plan(model, dp=2, mp=1, per_replica_batch=GLOBAL_BATCH // 2),
                    sharding="zero3")
    example = dict(batch(plan["per_replica_batch"], 0)[0])
    hp = hybridplan.apply(plan, model, loss_fn=loss_fn, optimizer=sgd, timeout_s=60,
                          example_inputs=example)
    return hp, batch


def train(hp, batch, first_step, steps):
    for step in range(first_step, first_step + steps):
        inputs, target = batch(GLOBAL_BATCH, step)
        hp.step(*hp.shard(inputs, target))


# ---- rank side --------------------------------------------------------------------------------

def export_rank(out_dir):
    import shutil

    import torch.distributed as dist
    from hybridplan.executor import hf_export
    torch.set_num_threads(1)

    def keep_state(hp, name):
        state = hp.state_dict()  # collective
        if dist.get_rank() == 0:
            torch.save(state, os.path.join(out_dir, f"{name}.state.pt"))

    def record(name, text):
        with open(os.path.join(out_dir, f"{name}.rank{dist.get_rank()}.txt"), "w") as f:
            f.write(text)

    hp, batch = applied("pipe")
    train(hp, batch, 0, K)
    hp.export_pretrained(os.path.join(out_dir, "pipe"))
    keep_state(hp, "pipe_first")
    train(hp, batch, K, 1)
    real = hf_export._save_pretrained

    def dying(module, folder, state, *args):
        with open(os.path.join(folder, "model.safetensors"), "wb") as f:
            f.write(b"half an export")
        raise OSError("simulated crash in the middle of save_pretrained")
    hf_export._save_pretrained = dying
    try:
        hp.export_pretrained(os.path.join(out_dir, "pipe"))
        record("interrupted", "exported")
    except RuntimeError as e:
        record("interrupted", str(e))
    finally:
        hf_export._save_pretrained = real
    dist.barrier()
    if dist.get_rank() == 0:  # what the interrupted export left, before it is replaced
        shutil.copytree(os.path.join(out_dir, "pipe"), os.path.join(out_dir, "pipe_interrupted"))
    hp.export_pretrained(os.path.join(out_dir, "pipe"))  # over the previous export
    keep_state(hp, "pipe")
    hp.close()

    hp, batch = applied("zero3")
    train(hp, batch, 0, K)
    hp.export_pretrained(os.path.join(out_dir, "zero3"))
    keep_state(hp, "zero3")
    hp.close()

    import hybridplan
    plain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    hp = hybridplan.apply(placement_plan(plain, dp=2, mp=1, per_replica_batch=2), plain,
                          loss_fn=nn.functional.mse_loss, timeout_s=60,
                          example_inputs=(torch.randn(2, 4),))
    try:
        hp.export_pretrained(os.path.join(out_dir, "plain"))
        record("plain", "exported")
    except ValueError as e:
        record("plain", str(e))
    hp.close()  # the last open plan: it destroys the default group apply() created


# ---- test side --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out_dir = tmp_path_factory.mktemp("hf_export")
    results = run_ranks("test_hf_export:export_rank", 2, {"out_dir": str(out_dir)},
                        timeout_s=120)
    if not all(r.returncode == 0 for r in results):
        pytest.fail(format_results(results))
    return out_dir


def fixed_input():
    from user_models import SEQ, VOCAB
    g = torch.Generator().manual_seed(1234)
    return torch.randint(0, VOCAB, (3, SEQ), generator=g)


def logits(model):
    model.eval()
    with torch.no_grad():
        return model(input_ids=fixed_input()).logits


def fresh_with(state):
    from user_models import gpt2
    model = gpt2()[0]
    model.load_state_dict(state)
    return model


def one_process(steps):
    from user_models import gpt2
    torch.set_num_threads(1)
    model, batch, loss_fn = gpt2()
    opt = sgd(model.parameters())
    for step in range(steps):
        inputs, target = batch(GLOBAL_BATCH, step)
        opt.zero_grad()
        loss_fn(model(**inputs), target).backward()
        opt.step()
    return model


def check_export(directory, state):
    from safetensors import safe_open
    from transformers import GPT2LMHeadModel
    assert os.path.exists(directory / "config.json")
    assert json.loads((directory / "config.json").read_text())["architectures"] == \
        ["GPT2LMHeadModel"]
    with safe_open(str(directory / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
    assert "lm_head.weight" not in keys and "transformer.wte.weight" in keys  # tied: once
    loaded = GPT2LMHeadModel.from_pretrained(str(directory))
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    got = loaded.state_dict()
    for key, value in state.items():
        assert torch.equal(got[key], value), key
    torch.testing.assert_close(logits(loaded), logits(fresh_with(state)), rtol=0, atol=1e-6)
    return loaded


@pytest.mark.parametrize("kind, steps", [("pipe", K + 1), ("zero3", K)])
def test_export_loads_with_from_pretrained(exported, kind, steps):
    state = torch.load(exported / f"{kind}.state.pt")
    initial = fresh_with(one_process(0).state_dict())
    assert not torch.allclose(logits(initial), logits(fresh_with(state)))  # it trained
    loaded = check_export(exported / kind, state)
    torch.testing.assert_close(logits(loaded), logits(one_process(steps)), rtol=1e-5,
                               atol=1e-5)


def test_interrupted_export_leaves_previous(exported):
    for rank in range(2):
        text = (exported / f"interrupted.rank{rank}.txt").read_text()
        assert "export not written" in text and "simulated crash" in text, text
    check_export(exported / "pipe_interrupted", torch.load(exported / "pipe_first.state.pt"))
    leftovers = [p.name for p in exported.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    assert leftovers == []


def test_plain_module_is_refused(exported):
    for rank in range(2):
        text = (exported / f"plain.rank{rank}.txt").read_text()
        assert "transformers.PreTrainedModel" in text and "save_checkpoint" in text, text
    assert not (exported / "plain").exists()


def test_unrelated_directory_is_not_replaced(tmp_path):
    from hybridplan.executor import hf_export
    from user_models import gpt2
    model = gpt2()[0]
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a previous export"):
        hf_export.write_atomic(model, str(tmp_path / "mine"), model.state_dict())
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def test_live_module_untouched_and_tied_copies_checked(tmp_path):
    """save_pretrained runs on a view: the live module's config keeps its fields (dtype and
    architectures are set on the view's copy); tied copies that differ are refused."""
    from hybridplan.executor import hf_export
    from user_models import gpt2
    model = gpt2()[0]
    before = model.config.to_dict()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}  # as gathered
    aliases = {"lm_head.weight": "transformer.wte.weight"}
    hf_export.write_atomic(model, str(tmp_path / "out"), hf_export.retie(state, aliases))
    assert model.config.to_dict() == before
    assert json.loads((tmp_path / "out" / "config.json").read_text())["architectures"] == \
        ["GPT2LMHeadModel"]
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    with pytest.raises(ValueError, match="lm_head.weight is tied to transformer.wte.weight"):
        hf_export.retie(state, aliases)
