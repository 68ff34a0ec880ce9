"""C++ data parallelism (hybridplan::Executor on c10d::Reducer, a pure C++ program) trains the
same as torch.nn.parallel.DistributedDataParallel in Python: same MLP, initial weights, data and
optimizer, 2 Gloo ranks, 5 steps. The programs and jobs are cpp_ddp.py's (bench/bench_cpp_ddp.py
also times them); the binary is found in $HYBRIDPLAN_BIN_DIR, else build/bin (`make build`)."""

import pytest

import cpp_ddp
from twins import mlp

WIDTHS = [16, 32, 32, 8]
GLOBAL_BATCH = 16
STEPS = 5

pytestmark = pytest.mark.skipif(
    not (cpp_ddp.bin_dir() / "train_mlp").exists(),
    reason=f"{cpp_ddp.bin_dir() / 'train_mlp'} is not built (make build, or set "
           "HYBRIDPLAN_BIN_DIR to the folder holding train_mlp)")


def test_cpp_dp_trains_like_torch_ddp(tmp_path):
    paths = cpp_ddp.prepare(tmp_path, WIDTHS, GLOBAL_BATCH)
    cpp_ddp.run_cpp(paths, WIDTHS, STEPS, str(tmp_path / "cpp"))
    cpp_ddp.run_ddp(paths, WIDTHS, GLOBAL_BATCH, STEPS, str(tmp_path / "ddp"))
    for rank in (0, 1):
        cpp, ddp = tmp_path / f"cpp.rank{rank}.json", tmp_path / f"ddp.rank{rank}.json"
        # Same kernels, same Gloo sum of two ranks, same division: equal up to float rounding
        # (they came out bit-identical when this test was written).
        assert cpp_ddp.max_relative_difference(str(cpp), str(ddp)) <= 1e-5, rank
    # ...and training moved the weights (a no-op on both sides would also be "equal").
    assert cpp_ddp.max_relative_difference(paths["init"], str(tmp_path / "ddp.rank0.json")) > 1e-3


# ---- checkpoints between the C++ and the Python executor -----------------------------------
# The same MLP on both sides (models::mlp and torch.nn.Sequential of the same layers share their
# state_dict keys), train_mlp's data (the batch of step k from seed * 100003 + 1 + k). K1 steps on
# one side, a checkpoint, K2 steps on the other: the weights must equal train_mlp --reference's
# K1 + K2 uninterrupted steps. Python's Adam and LibTorch's compute the same update in another
# order of float operations (lerp vs mul/add), hence Adam's looser tolerance.

K1, K2 = 3, 2
OPTIMIZERS = {"sgd": ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"],
              "adam": ["--optimizer", "adam", "--lr", "0.01"]}
RTOL = {"sgd": 1e-5, "adam": 1e-4}


def python_optimizer(kind, params):
    import torch
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def python_steps(model, opt, first, steps):
    import torch
    for step in range(first, first + steps):
        torch.manual_seed(cpp_ddp.SEED * 100003 + 1 + step)  # train_mlp's batch_at
        x, y = torch.randn(GLOBAL_BATCH, WIDTHS[0]), torch.randn(GLOBAL_BATCH, WIDTHS[-1])
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def cpp_reference(tmp_path, kind):
    import json
    import subprocess
    out = tmp_path / f"reference_{kind}.json"
    subprocess.run([str(cpp_ddp.bin_dir() / "train_mlp"), "--widths", ",".join(map(str, WIDTHS)),
                    "--reference", "--global-batch", str(GLOBAL_BATCH), "--steps", str(K1 + K2),
                    "--seed", str(cpp_ddp.SEED), "--out", str(out), *OPTIMIZERS[kind]],
                   check=True, capture_output=True, timeout=120)
    return json.loads(out.read_text())["params"]


def assert_params_close(params, reference, rtol, what):
    assert params.keys() == reference.keys(), what
    for key in reference:
        for a, b in zip(params[key], reference[key]):
            assert abs(a - b) <= 1e-6 + rtol * abs(b), f"{what} {key}: {a} vs {b}"


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_python_reads_and_resumes_a_cpp_checkpoint(tmp_path, kind):
    """C++ (2 ranks, DP) trains K1 steps and saves; torch.load(weights_only=True) reads the file
    with the Python module's keys and Python's optimizer state names; Python resumes it."""
    import torch
    from hybridplan.executor import checkpoint
    paths = cpp_ddp.prepare(tmp_path, WIDTHS, GLOBAL_BATCH)
    path = tmp_path / "cpp.pt"
    cpp_ddp.run_cpp(paths, WIDTHS, K1, str(tmp_path / "cpp"),
                    [*OPTIMIZERS[kind], "--checkpoint", str(path)])
    ckpt = torch.load(path, weights_only=True)  # plain containers only
    model = mlp(WIDTHS)
    assert ckpt["format"] == "hybridplan.checkpoint" and ckpt["version"] == 1
    assert ckpt["step"] == K1 and ckpt["plan"].startswith("{") and len(ckpt["graph_sha256"]) == 64
    assert list(ckpt["model"]) == list(model.state_dict())
    named = [n for n, _ in model.named_parameters()]
    opt_state = ckpt["optimizer"]
    assert opt_state["class"] == {"sgd": "SGD", "adam": "Adam"}[kind]
    assert list(opt_state["state"]) == named
    assert [g["params"] for g in opt_state["param_groups"]] == [named]
    if kind == "sgd":
        assert all(list(s) == ["momentum_buffer"] for s in opt_state["state"].values())
        assert opt_state["param_groups"][0]["momentum"] == 0.9
    else:
        for s in opt_state["state"].values():
            assert list(s) == ["step", "exp_avg", "exp_avg_sq"]
            assert s["step"].dtype == torch.float32 and s["step"].item() == K1
        assert opt_state["param_groups"][0]["betas"] == (0.9, 0.999)
    assert checkpoint.load(path)["step"] == K1  # the Python executor's own reader accepts it

    checkpoint.check_model(ckpt, model, str(path))
    model.load_state_dict(ckpt["model"])
    opt = python_optimizer(kind, model.parameters())
    opt.param_groups[0]["lr"] = 123.0  # the checkpoint's hyperparameters win
    checkpoint.load_optimizer_state(opt, {id(p): n for n, p in model.named_parameters()},
                                    ckpt["optimizer"], str(path))
    python_steps(model, opt, K1, K2)
    params = {k: v.detach().double().reshape(-1).tolist() for k, v in model.named_parameters()}
    assert_params_close(params, cpp_reference(tmp_path, kind), RTOL[kind], f"Python after C++ {kind}")


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_cpp_resumes_a_python_checkpoint(tmp_path, kind):
    """Python trains K1 steps from train_mlp's initial weights and writes the checkpoint as the
    Python executor does; C++ (2 ranks, DP) resumes it and trains K2 more."""
    import json
    import torch
    from hybridplan.executor import checkpoint
    paths = cpp_ddp.prepare(tmp_path, WIDTHS, GLOBAL_BATCH)
    model = mlp(WIDTHS)
    init = json.loads(open(paths["init"]).read())["params"]
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.tensor(init[name], dtype=torch.float64).view_as(p))
    opt = python_optimizer(kind, model.parameters())
    python_steps(model, opt, 0, K1)
    names = {id(p): n for n, p in model.named_parameters()}
    path = tmp_path / "python.pt"
    checkpoint.write_atomic(checkpoint.build(model.state_dict(),
                                             checkpoint.optimizer_state_by_name(opt, names), K1,
                                             open(paths["plan"]).read(), "0" * 64), str(path))
    cpp_ddp.run_cpp(paths, WIDTHS, K2, str(tmp_path / "resumed"),
                    [*OPTIMIZERS[kind], "--resume-from", str(path)])
    reference = cpp_reference(tmp_path, kind)
    for rank in (0, 1):
        params = json.loads((tmp_path / f"resumed.rank{rank}.json").read_text())["params"]
        assert_params_close(params, reference, RTOL[kind], f"C++ rank {rank} after Python {kind}")
