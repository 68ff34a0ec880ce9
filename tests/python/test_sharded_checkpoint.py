"""Sharded checkpoints (torch.distributed.checkpoint, executor/sharded_checkpoint): every rank
writes its own part, a manifest is written last, and resuming under another plan equals
uninterrupted training; a truncated, corrupted or half-written checkpoint is refused by name
and the newest complete one is used.

Two launches of 2 Gloo ranks (as test_checkpoint, whose models, plans and one-process
reference this reuses): the first trains each scenario K1 steps under its first plan and saves
(asynchronously for some: training goes on one more step while the copy is written, and the
checkpoint must hold step K1's state), then saves step K1 + 1, then tries a save that fails on
one rank; the second resumes step K1 under the other plan, trains K2 more steps, and its
gathered state must equal one process trained K1 + K2 steps.
"""

import json
import os
import shutil

import pytest
import torch

from dist_harness import require_phase, run_phases
from test_checkpoint import K1, K2, applied, reference, train

# (model, optimizer, first plan, second plan, asynchronous save)
SCENARIOS = [
    ("branchy_cnn", "sgd", "dp", "pipe", True),
    ("branchy_cnn", "adam", "pipe", "dp", False),
    ("gpt2", "adam", "zero3", "pipe", True),
    ("gpt2", "adam", "pipe", "zero2", False),
    ("gpt2", "adam", "zbv", "dp", True),
    ("gpt2", "sgd", "dp", "interleaved", False),
]
IDS = ["-".join(map(str, s[:4])) + ("-async" if s[4] else "") for s in SCENARIOS]


def _step_dir(root, step):
    from hybridplan.executor.sharded_checkpoint import step_dir_name
    return os.path.join(root, step_dir_name(step))


# ---- rank side --------------------------------------------------------------------------------

def save_phase(out_dir):
    import torch.distributed as dist
    from hybridplan.executor import sharded_checkpoint
    torch.set_num_threads(1)
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"])
    for scenario, sid in zip(SCENARIOS, IDS):
        root = os.path.join(out_dir, sid)
        hp, batch = applied(scenario[:4], scenario[2], checkpoint_dir=root)
        train(hp, batch, 0, K1)
        hp.save_sharded(async_save=scenario[4], extra={"next_step": K1})
        train(hp, batch, K1, 1)   # an asynchronous save must hold step K1's state, not this
        done = hp.wait_checkpoint()
        assert done in (None, _step_dir(root, K1)), done
        hp.save_sharded(extra={"next_step": K1 + 1})
        hp.close()
    # a save that fails on rank 1 (its hashing: as a full disk would) leaves the others intact
    scenario = SCENARIOS[0]
    root = os.path.join(out_dir, IDS[0])
    hp, batch = applied(scenario[:4], scenario[2], checkpoint_dir=root,
                        resume_from="latest")
    train(hp, batch, hp.step_count, 1)
    real = sharded_checkpoint.sha256_file
    if rank == 1:
        def failing(path):
            raise OSError(28, "No space left on device (simulated)")
        sharded_checkpoint.sha256_file = failing
    try:
        hp.save_sharded()
        outcome = "saved"
    except RuntimeError as e:
        outcome = str(e)
    finally:
        sharded_checkpoint.sha256_file = real
    with open(os.path.join(out_dir, f"failed_save.rank{rank}.txt"), "w") as f:
        f.write(outcome)
    hp.close()
    # "latest" in an empty directory: a first run starts from the beginning
    hp, _ = applied(scenario[:4], scenario[2], checkpoint_dir=os.path.join(out_dir, "empty"),
                    resume_from="latest")
    with open(os.path.join(out_dir, f"fresh.rank{rank}.txt"), "w") as f:
        f.write(f"{hp.step_count} {hp.resumed_from!r}")
    hp.close()
    if dist.is_initialized():
        dist.destroy_process_group()


def resume_phase(out_dir):
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ["RANK"])
    for scenario, sid in zip(SCENARIOS, IDS):
        hp, batch = applied(scenario[:4], scenario[3],
                            resume_from=_step_dir(os.path.join(out_dir, sid), K1))
        resumed_at, extra = hp.step_count, hp.resumed_extra
        train(hp, batch, K1, K2)
        torch.save({"state": hp.state_dict(), "resumed_at": resumed_at, "extra": extra},
                   os.path.join(out_dir, f"{sid}.resumed.rank{rank}.pt"))
        hp.close()
    if dist.is_initialized():
        dist.destroy_process_group()


# ---- test side --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_phases("test_sharded_checkpoint", ("save_phase", "resume_phase"),
                      tmp_path_factory.mktemp("sharded_checkpoint"), timeout_s=400)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=IDS)
def test_sharded_resume_under_another_plan_equals_uninterrupted_training(runs, scenario):
    out_dir = require_phase(runs, "resume_phase")
    sid = IDS[SCENARIOS.index(scenario)]
    expected = reference(scenario[:4])
    for rank in range(2):
        got = torch.load(os.path.join(out_dir, f"{sid}.resumed.rank{rank}.pt"))
        assert got["resumed_at"] == K1
        assert got["extra"] == {"next_step": K1}
        rtol, atol = (1e-4, 1e-6) if scenario[1] == "adam" else (1e-5, 1e-6)
        for key, value in expected.items():
            torch.testing.assert_close(got["state"][key], value, rtol=rtol, atol=atol,
                                       msg=lambda m: f"{sid} rank {rank} {key}: {m}")


def test_every_rank_writes_its_part_and_the_manifest_lists_every_file(runs):
    out_dir = require_phase(runs, "save_phase")
    for sid in IDS:
        path = _step_dir(os.path.join(out_dir, sid), K1)
        with open(os.path.join(path, "manifest.json")) as f:
            manifest = json.load(f)
        on_disk = sorted(n for n in os.listdir(path) if n != "manifest.json")
        assert sorted(manifest["files"]) == on_disk
        assert manifest["step"] == K1 and manifest["world_size"] == 2
        data = [n for n in on_disk if n.endswith(".distcp")]
        writers = {n.split("_")[2] for n in data}  # __<rank>_<i>.distcp
        # replicated parameters are spread over the ranks, stages and shards written by theirs
        assert writers == {"0", "1"}, (sid, data)
        assert all(os.path.getsize(os.path.join(path, n)) > 0 for n in data)


def test_keep_and_no_partial_left(runs):
    out_dir = require_phase(runs, "save_phase")
    for sid in IDS[1:]:
        names = sorted(os.listdir(os.path.join(out_dir, sid)))
        assert names == [f"step-{K1:09d}", f"step-{K1 + 1:09d}"], names


def test_failed_save_raises_on_every_rank_and_leaves_the_previous(runs):
    out_dir = require_phase(runs, "save_phase")
    for rank in range(2):
        with open(os.path.join(out_dir, f"failed_save.rank{rank}.txt")) as f:
            text = f.read()
        assert "No space left on device (simulated)" in text and "rank 1" in text, text
        assert "previous checkpoints are unchanged" in text
    root = os.path.join(out_dir, IDS[0])
    # the failed step K1 + 2 left nothing; keep=2 kept K1 and K1 + 1
    assert sorted(os.listdir(root)) == [f"step-{K1:09d}", f"step-{K1 + 1:09d}"]


def test_latest_in_an_empty_directory_starts_from_the_beginning(runs):
    out_dir = require_phase(runs, "save_phase")
    for rank in range(2):
        with open(os.path.join(out_dir, f"fresh.rank{rank}.txt")) as f:
            assert f.read() == "0 ''"


def _copy(runs, tmp_path):
    out_dir = require_phase(runs, "save_phase")
    root = tmp_path / "ckpt"
    shutil.copytree(os.path.join(out_dir, IDS[3]), root)
    newest = _step_dir(str(root), K1 + 1)
    data = sorted(n for n in os.listdir(newest) if n.endswith(".distcp"))
    return str(root), newest, os.path.join(newest, data[-1])


@pytest.mark.parametrize("damage", ["truncated", "bit-flipped", "missing", "no manifest"])
def test_damaged_checkpoint_is_refused_by_name_and_latest_falls_back(runs, tmp_path, damage):
    from hybridplan.executor import sharded_checkpoint
    root, newest, victim = _copy(runs, tmp_path)
    if damage == "truncated":
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) // 2)
        why, named = "bytes, the manifest says", victim
    elif damage == "bit-flipped":
        with open(victim, "r+b") as f:
            f.seek(os.path.getsize(victim) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x10]))
        why, named = "sha256 differs", victim
    elif damage == "missing":
        os.remove(victim)
        why, named = "missing", victim
    else:
        os.remove(os.path.join(newest, "manifest.json"))
        why, named = "incomplete", os.path.join(newest, "manifest.json")
    with pytest.raises(ValueError) as e:
        sharded_checkpoint.resolve(newest)
    assert named in str(e.value) and why in str(e.value)
    logged = []
    found = sharded_checkpoint.find(root, None, logged.append)
    assert found == _step_dir(root, K1)
    assert len(logged) == 1 and named in logged[0] and f"step {K1 + 1}" in logged[0]
    resumed, source = sharded_checkpoint.resolve(root)
    assert source == _step_dir(root, K1) and resumed["step"] == K1


def test_sharded_checkpoint_reads_as_the_consolidated_form(runs):
    from hybridplan.executor import sharded_checkpoint
    out_dir = require_phase(runs, "save_phase")
    ckpt, _ = sharded_checkpoint.resolve(_step_dir(os.path.join(out_dir, IDS[2]), K1))  # zero3
    assert ckpt["step"] == K1 and ckpt["optimizer"]["class"] == "Adam"
    state = ckpt["optimizer"]["state"]
    assert "transformer.wte.weight" in state and "lm_head.weight" not in state  # tied: once
    assert state["transformer.wte.weight"]["exp_avg"].shape == \
        ckpt["model"]["transformer.wte.weight"].shape  # whole, from FSDP's shards
