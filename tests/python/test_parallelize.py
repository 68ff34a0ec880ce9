"""hybridplan.parallelize, the front door (python/hybridplan/front_door.py, docs/front_door.md).

End to end: examples/train_parallelize.py (a GPT-2 built from a config) launched by
`python -m hybridplan run --nproc-per-node 2` (torchrun --standalone: loopback, Gloo) with a
fresh cache directory: rank 0 profiles, plans and logs the plan in two lines; the losses rank 0
prints equal one-process training on the same global batches (its replica's share: the loss
hp.step returns) and decrease; a second launch takes the graph from the cache (its log line
says so, and the cache file is not rewritten) and chooses the same plan.

Units, in this process (no process group): the error messages (no torchrun, a GPU cluster on
a machine without one, a model that cannot be cut into pipeline stages, nothing fits in
memory), where the cluster and the job come from, the cache key, the `run` command line.
"""

import importlib.util
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

pytest.importorskip("hybridplan.planner", reason="needs the compiled planner hybridplan._C "
                                                 "(make build)")

import hybridplan  # noqa: E402
from hybridplan import front_door  # noqa: E402
from hybridplan.__main__ import main as cli_main, torchrun_command  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(REPO, "examples", "train_parallelize.py")
STEPS = 6
PLAN_LINE = re.compile(r"hybridplan: dp=(\d+) mp=(\d+) (placement|pipeline) .*b=(\d+) on "
                       r"(\S+): \d+ samples/s predicted, [\d.]+ MiB per device")


# ---- end to end: the example under torchrun, twice -------------------------------------------

def _launch(cache_dir, steps):
    env = dict(os.environ, HYBRIDPLAN_CACHE_DIR=str(cache_dir), OMP_NUM_THREADS="1",
               CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=os.pathsep.join(p for p in (os.path.join(REPO, "python"),
                                                      os.environ.get("PYTHONPATH", "")) if p))
    done = subprocess.run([sys.executable, "-m", "hybridplan", "run", "--nproc-per-node", "2",
                           EXAMPLE, str(steps)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=240)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-6000:]
    return text


def _example():
    spec = importlib.util.spec_from_file_location("train_parallelize_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the model, data and loss; trains only as __main__
    return module


def _reference_losses(dp, global_batch, steps):
    """One process on the global batch; at each step the loss of replica 0's share before the
    update (what hp.step returns on rank 0)."""
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    example = _example()
    torch.set_num_threads(1)
    model = example.build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        inputs, target = example.batch(global_batch, step)
        with torch.no_grad():
            share = {k: torch.tensor_split(v, dp)[0] for k, v in inputs.items()}
            losses.append(example.loss_fn(model(**share), torch.tensor_split(target, dp)[0]))
        opt.zero_grad()
        example.loss_fn(model(**inputs), target).backward()
        opt.step()
    return [float(x) for x in losses]


def test_example_trains_on_two_ranks_and_a_restart_uses_the_cache(tmp_path):
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    cache = tmp_path / "cache"
    first = _launch(cache, STEPS)
    assert "hybridplan: profiled GPT2LMHeadModel" in first, first[-4000:]
    assert "no GPU and no calibration of this host" in first  # the cluster's log line
    plan = PLAN_LINE.search(first)
    assert plan, first[-4000:]
    assert re.search(r"hybridplan: chosen for samples/s over \d+ candidates?; ", first)
    dp, mp, mode, b, cluster = plan.groups()
    assert cluster == "localhost-cpu" and int(dp) * int(mp) == 2
    losses = [float(x) for x in re.findall(r"^step \d+ loss ([\d.]+)$", first, re.M)]
    assert len(losses) == STEPS
    assert losses[-1] < losses[0] - 0.05, losses  # it trains
    want = _reference_losses(int(dp), int(dp) * int(b), STEPS)
    assert losses == pytest.approx(want, rel=1e-4, abs=1e-5), (losses, want)

    graphs = list((cache / "graphs").iterdir())
    assert len(graphs) == 1 and graphs[0].suffix == ".json"
    written = graphs[0].stat().st_mtime_ns
    second = _launch(cache, 1)
    assert "from the cache" in second and "hybridplan: profiled" not in second, second[-4000:]
    assert graphs[0].stat().st_mtime_ns == written
    assert PLAN_LINE.search(second).group(0) == plan.group(0)  # the same plan


# ---- the error messages ------------------------------------------------------------------------

def test_without_torchrun_a_bigger_job_says_how_to_launch(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError) as e:
        hybridplan.parallelize(nn.Linear(4, 2), torch.randn(8, 4), world_size=2)
    assert "not started by torchrun" in str(e.value)
    assert "torchrun --nproc-per-node 2" in str(e.value)
    assert "python -m hybridplan run --nproc-per-node 2" in str(e.value)


def test_a_gpu_cluster_without_a_gpu_names_the_cpu_preset(tmp_path):
    with pytest.raises(ValueError) as e:
        front_door.resolve_cluster("dgx1-v100", str(tmp_path), 2, 2, cuda=False)
    assert "no GPU" in str(e.value) and "cluster='localhost-cpu'" in str(e.value)
    assert "hybridplan calibrate --out" in str(e.value)


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        return y * 2 if y.sum() > 0 else y  # data-dependent: torch.export cannot cut through it


class Gated(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.gate, self.b = nn.Linear(8, 8), Gate(), nn.Linear(8, 4)

    def forward(self, x):
        return self.b(self.gate(self.a(x)))


@pytest.fixture(scope="module")
def gated_graph():
    torch.manual_seed(0)
    with warnings.catch_warnings():  # a busy CPU: these tests read no times
        warnings.simplefilter("ignore")
        return hybridplan.profile(Gated(), torch.randn(8, 8), warmup=0, repeats=1,
                                  batch_sizes=[], verbose=False)


def _job(batch=8):
    return front_door.resolve_job(None, batch, None)


def test_a_model_that_cannot_be_cut_is_planned_without_pipelines(gated_graph):
    cluster = hybridplan.Cluster.preset("localhost-cpu")
    choice = front_door.choose_plan(gated_graph, cluster, _job(), 2)
    assert (choice.plan.mode, choice.plan.dp, choice.plan.mp) == ("placement", 2, 1)
    assert choice.runner_up is None and choice.fallback is None
    why = choice.no_plan["pipeline"]
    assert "'gate'" in why and "cannot be cut" in why  # which module, and why
    lines = front_door.plan_lines(choice, cluster)
    assert len(lines) == 2
    assert lines[0].startswith("hybridplan: dp=2 mp=1 placement b=8 on localhost-cpu: ")
    assert "no pipeline: " in lines[1] and "'gate'" in lines[1]
    # asked for pipelines only, it still falls back to data parallelism and says why
    only = front_door.choose_plan(gated_graph, cluster, _job(), 2, modes=["pipeline"])
    assert only.plan.mode == "placement" and "'gate'" in only.no_plan["pipeline"]


def test_nothing_fits_keeps_the_search_message_and_adds_a_hint(gated_graph):
    small = hybridplan.Cluster.preset("localhost-cpu").to_dict()
    small["device"]["memory_bytes"] = 1000
    with pytest.raises(hybridplan.InfeasibleError) as e:
        front_door.choose_plan(gated_graph, hybridplan.Cluster.from_dict(small), _job(), 2)
    text = str(e.value)
    assert "no plan fits on 2 devices" in text and "over by" in text  # the search's own words
    assert "hint: a smaller per-replica batch" in text and "per_replica_batch" in text


# ---- cluster, job, cache key, command line ---------------------------------------------------

def test_cluster_defaults_to_the_cpu_preset_or_this_hosts_calibration(tmp_path):
    c, line = front_door.resolve_cluster(None, str(tmp_path), 2, 2, cuda=False)
    assert c.name == "localhost-cpu" and "no GPU and no calibration of this host" in line
    four, line = front_door.resolve_cluster(None, str(tmp_path), 4, 4, cuda=False)
    assert (four.num_nodes, four.devices_per_node) == (1, 4) and "4 CPU ranks" in line
    calibrated = c.to_dict()
    calibrated["name"] = "measured-here"
    hybridplan.Cluster.from_dict(calibrated).save(front_door.calibration_path(str(tmp_path)))
    c, line = front_door.resolve_cluster(None, str(tmp_path), 2, 2, cuda=False)
    assert c.name == "measured-here" and "this host's calibration" in line
    given, line = front_door.resolve_cluster("localhost-cpu", str(tmp_path), 2, 2, cuda=False)
    assert given.name == "localhost-cpu" and line == ""
    # with a GPU and no calibration: the preset of its machine, or an error naming the presets
    gpu, line = front_door.resolve_cluster(None, str(tmp_path / "none"), 2, 2, cuda=True,
                                           gpu_name="NVIDIA H100 80GB HBM3")
    assert gpu.name == "dgx-h100" and "preset for NVIDIA H100" in line
    with pytest.raises(ValueError, match="no preset for its GPU .*dgx-h100"):
        front_door.resolve_cluster(None, str(tmp_path / "none"), 2, 2, cuda=True,
                                   gpu_name="NVIDIA L4")


def test_default_job_is_the_example_batch_with_the_optimizers_state():
    adamw = front_door.resolve_job(None, 8, lambda p: torch.optim.AdamW(p, lr=1e-3)).to_dict()
    assert adamw["per_replica_batch"] == 8 and adamw["optimizer"] == "adam"
    assert "convergence" not in adamw  # samples/s
    sgd = front_door.resolve_job({"per_replica_batch": [4, 8]}, 8,
                                 lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)).to_dict()
    assert sgd["optimizer"] == "sgd_momentum" and sgd["per_replica_batch"] == [4, 8]


def test_cache_key_is_the_structure_and_the_shapes_not_the_weights():
    torch.manual_seed(0)
    a, b = Gated(), Gated()
    x = torch.randn(8, 8)
    key = front_door.graph_cache_key(a, x)[0]
    assert front_door.graph_cache_key(b, torch.randn(8, 8))[0] == key  # other weights, values
    assert front_door.graph_cache_key(a, torch.randn(4, 8))[0] != key  # another batch
    b.b = nn.Linear(8, 5)
    assert front_door.graph_cache_key(b, x)[0] != key  # another shape
    assert front_door.graph_cache_key(a, x, loss_fn=nn.functional.mse_loss)[0] != key


def test_run_launches_torchrun():
    cmd = torchrun_command(2, "train.py", ["--steps", "3"])
    assert cmd[-6:] == ["--standalone", "--nproc-per-node", "2", "train.py", "--steps", "3"]
    nodes = torchrun_command(4, "train.py", [], nnodes=2, node_rank=1, master_addr="h0")
    assert nodes[-11:] == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "h0",
                           "--master-port", "29500", "--nproc-per-node", "4", "train.py"]
    with pytest.raises(ValueError, match="--master-addr"):
        torchrun_command(2, "train.py", nnodes=2)
    elastic = torchrun_command(2, "train.py", [], nnodes="1:2", master_addr="h0",
                               max_restarts=3)
    assert elastic[-11:] == ["--nnodes", "1:2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                             "h0:29500", "--max-restarts", "3", "--nproc-per-node", "2",
                             "train.py"]
    assert torchrun_command(2, "t.py", max_restarts=2)[-6:] == [
        "--standalone", "--max-restarts", "2", "--nproc-per-node", "2", "t.py"]
    assert cli_main(["run", "--nproc-per-node", "2", "no-such-script.py"]) == 2
