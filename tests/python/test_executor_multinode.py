"""Multi-node through torchrun's rendezvous: two torchrun launches on this machine act as two
nodes (--nnodes 2 --node-rank 0/1, static rendezvous at 127.0.0.1) and train examples/train.py
under a hybrid dp=2 x mp=2 pipeline plan, one replica per node; the result must equal
single-process training with the same global batch."""

import json
import os
import subprocess
import sys

import torch

import hybridplan.models as models
from dist_harness import REPO, rank_env
from hybridplan.net import free_port

MODEL_KWARGS = {"width": 8, "image_size": 16}  # smaller GroupNorm groups are ill-conditioned
STEPS, GLOBAL_BATCH, LR, MOMENTUM = 4, 8, 0.05, 0.9


def reference_state():
    """examples/train.py's training (data seeds, SGD with momentum) on one process."""
    torch.set_num_threads(1)  # as each torchrun worker (OMP_NUM_THREADS=1)
    model = models.branchy_cnn(seed=0, **MODEL_KWARGS)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        inputs = model.example_inputs(GLOBAL_BATCH, seed=step)
        target = model.example_target(GLOBAL_BATCH, seed=10_000 + step)
        opt.zero_grad()
        model.loss(model(*inputs), target).backward()
        opt.step()
    return model.state_dict()


def test_two_torchrun_nodes_train_under_a_plan(tmp_path):
    port = free_port()
    state_path = tmp_path / "state.pt"
    train = [os.path.join(REPO, "examples", "train.py"), "--model", "branchy_cnn",
             "--model-kwargs", json.dumps(MODEL_KWARGS), "--mode", "pipeline", "--dp", "2",
             "--mp", "2", "--schedule", "gpipe", "--microbatches", "2",
             "--global-batch", str(GLOBAL_BATCH), "--steps", str(STEPS), "--warmup-steps", "1",
             "--lr", str(LR), "--momentum", str(MOMENTUM), "--timeout-s", "60",
             "--save-state", str(state_path)]
    env = rank_env(0, 1, port)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT"):
        env.pop(key)  # torchrun sets these for its workers
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
         str(node), "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
         str(port), *train], env=env, cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for node in (0, 1)]
    outputs = []
    for proc in nodes:
        try:
            outputs.append(proc.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for p in nodes:
                p.kill()
            raise AssertionError("torchrun nodes did not finish within 240 s")
    report = "\n".join(f"--- node {i}: exit {p.returncode}\n{out[-4000:]}"
                       for i, (p, out) in enumerate(zip(nodes, outputs)))
    assert all(p.returncode == 0 for p in nodes), report
    assert "world 4" in outputs[0] and "measured step time:" in outputs[0], report
    assert "predicted step time:" in outputs[0], report
    state = torch.load(state_path)
    expected = reference_state()
    assert list(state) == list(expected)
    for key in expected:
        torch.testing.assert_close(state[key], expected[key], rtol=1e-5, atol=1e-6)
