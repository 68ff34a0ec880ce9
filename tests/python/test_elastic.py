"""Surviving a lost rank (docs/checkpoints.md "Surviving a lost rank, and restarting smaller"):
examples/elastic_train.py under torchrun, a rank killed with SIGKILL mid-run.

  - torchrun --max-restarts 2, 2 processes: torchrun starts every rank again, parallelize
    plans, apply resumes from the newest complete sharded checkpoint; the job exits 0, its
    final weights equal one-process training of the same steps, the steps redone are fewer
    than one checkpoint interval (two with asynchronous saves, whose checkpoint is complete
    only at the next save), and the attempts log shows the restart.
  - a job that loses half its ranks: 2 processes without restarts, one killed (the job fails),
    then the same job launched on 1 process: parallelize plans for the smaller world, resumes
    the newest complete checkpoint and finishes with the weights of uninterrupted training
    (the job fixes the global batch, so dp only splits it).

No TORCH_DISABLE_SHARE_RDZV_TCP_STORE here: the restarted workers share torchrun's agent
store with the killed ones, which the executor's restart prefix keeps apart.
"""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
import torch

pytest.importorskip("hybridplan.planner", reason="needs the compiled planner hybridplan._C "
                                                 "(make build)")

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(REPO, "examples", "elastic_train.py")
STEPS, EVERY, GLOBAL_BATCH = 12, 3, 8


def _example():
    spec = importlib.util.spec_from_file_location("elastic_train_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(p for p in (os.path.join(REPO, "python"),
                                                      os.environ.get("PYTHONPATH", "")) if p))
    env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
    return env


def _torchrun(nproc, max_restarts, args, timeout_s=90):
    launcher = ([shutil.which("torchrun")] if shutil.which("torchrun")
                else [sys.executable, "-m", "torch.distributed.run"])
    cmd = launcher + ["--standalone", "--nproc-per-node", str(nproc), "--max-restarts",
                      str(max_restarts), "--monitor-interval", "0.1", EXAMPLE, *args]
    try:
        done = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True,
                              timeout=timeout_s, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or "")
        raise AssertionError(f"torchrun did not finish within {timeout_s} s:\n{out[-4000:]}")
    return done.returncode, done.stdout + done.stderr


def _assert_equal_to_reference(final_path, steps=STEPS):
    expected = _example().reference_state(steps, GLOBAL_BATCH)
    got = torch.load(final_path)
    assert list(got) == list(expected)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6,
                                   msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_killed_rank_restarts_and_finishes_as_uninterrupted_training(tmp_path, async_save):
    ckpt, final = tmp_path / "ckpt", tmp_path / "final.pt"
    kill_step = 8  # two steps after the checkpoint of step 6
    args = ["--dir", str(ckpt), "--steps", str(STEPS), "--every", str(EVERY),
            "--global-batch", str(GLOBAL_BATCH), "--kill", f"1:{kill_step}",
            "--final", str(final)] + (["--async-save"] if async_save else [])
    rc, text = _torchrun(2, 2, args)
    assert rc == 0, text[-6000:]
    assert f"rank 1 kills itself (SIGKILL) at step {kill_step}" in text, text[-4000:]
    example = _example()
    attempts = example.read_attempts(str(ckpt))
    assert [(a["restart"], a["world_size"]) for a in attempts] == [(0, 2), (1, 2)], attempts
    assert attempts[0]["started_from"] == 0 and attempts[0]["resumed_from"] == ""
    # the newest complete checkpoint when rank 1 died: step 6's when synchronous; an
    # asynchronous one is complete only once the next save starts, so step 3's (step 6's was
    # still step-6.partial, which resuming ignores)
    resumed = attempts[1]["started_from"]
    assert resumed == (3 if async_save else 6), attempts
    assert attempts[1]["resumed_from"].endswith(f"step-{resumed:09d}")
    assert attempts[1]["resumed_extra"] == {"next_step": resumed}
    (_, reached, start, redone), = example.work_lost(str(ckpt))
    assert reached == kill_step and start == resumed
    assert redone <= (EVERY if not async_save else 2 * EVERY) - 1, (reached, start)
    _assert_equal_to_reference(final)


def test_job_losing_half_its_ranks_finishes_on_a_new_plan(tmp_path):
    ckpt, final = tmp_path / "ckpt", tmp_path / "final.pt"
    common = ["--dir", str(ckpt), "--steps", str(STEPS), "--every", str(EVERY),
              "--global-batch", str(GLOBAL_BATCH), "--final", str(final)]
    # world 2, no restarts: rank 1 killed at step 7 fails the job
    rc, text = _torchrun(2, 0, common + ["--kill", "1:7"])
    assert rc != 0, text[-4000:]
    assert not final.exists()
    # the same job on half the processes
    rc, text = _torchrun(1, 0, common)
    assert rc == 0, text[-6000:]
    example = _example()
    attempts = example.read_attempts(str(ckpt))
    assert [a["world_size"] for a in attempts] == [2, 1], attempts
    assert [a["started_from"] for a in attempts] == [0, 6], attempts
    first, second = attempts
    assert second["plan"].startswith("dp=1 mp=1 placement b=8"), attempts  # planned for 1
    assert first["plan"] != second["plan"], attempts
    assert "hybridplan: dp=1 mp=1 placement b=8" in text, text[-4000:]
    (_, reached, start, redone), = example.work_lost(str(ckpt))
    assert (reached, start) == (7, 6) and redone < EVERY
    _assert_equal_to_reference(final)
