"""C++ data parallelism (hybridplan::Executor on c10d::Reducer, a pure C++ program) trains the
same as torch.nn.parallel.DistributedDataParallel in Python: same MLP, initial weights, data and
optimizer, 2 Gloo ranks, 5 steps. The programs and jobs are bench/bench_cpp_ddp.py's (which
also times them); the binary is found in $HYBRIDPLAN_BIN_DIR, else build/bin (`make build`)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_cpp_ddp as cpp_ddp  # noqa: E402

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
