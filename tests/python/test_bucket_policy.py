"""Defaults the Python side shares with C++ are the core's (csrc/planner/costs/bucket_policy.h,
csrc/common/profile_defaults.h, read through hybridplan._C), and the bucket policy is what the
installed torch's DistributedDataParallel does."""

import inspect
import json

import pytest
import torch.distributed as dist
from torch.nn.parallel import distributed as torch_ddp

from dist_harness import format_results, run_ranks
from hybridplan import _C, profiler
from hybridplan.executor.bucket_policy import ddp_bucket_kwargs
from hybridplan.executor import destroy_groups

MIB = 1024 * 1024
LAYERS = 30  # Linear(512, 512): 1 MiB weight + 2 KiB bias each, 31.5 MiB in all


def test_caps_are_ddps_defaults():
    assert _C.kDefaultFirstBucketCapBytes == dist._DEFAULT_FIRST_BUCKET_BYTES
    assert _C.kDefaultBucketCapBytes == torch_ddp._DEFAULT_BUCKET_CAP_MB * MIB
    assert ddp_bucket_kwargs() == {"bucket_cap_mb_list": [1, 25]}


def test_bucket_bytes_closes_a_bucket_once_it_reaches_its_cap():
    # caps 1000 then 5000: 32 + 1024 = 1056 >= 1000 closes the first bucket; 128 + 4096 + 128 +
    # 2048 = 6400 the second (a bucket may pass its cap by its last gradient).
    assert _C.bucket_bytes([32, 1024, 128, 4096, 128, 2048], 1000, 5000) == [1056, 6400]
    assert _C.bucket_bytes([10, 10], 100, 100) == [20]
    assert _C.bucket_bytes([500, 500, 1], 1000, 1000) == [1000, 1]  # reaching the cap closes it
    assert _C.bucket_bytes([]) == []
    with pytest.raises(ValueError, match=r"bucket caps must be >= 1 byte \(got 0, 1\)"):
        _C.bucket_bytes([1], 0, 1)
    with pytest.raises(ValueError, match=r"grad_bytes\[1\] must be >= 0 \(got -1\)"):
        _C.bucket_bytes([1, -1])


def ddp_buckets_rank(out: str) -> None:
    """One process: the buckets DDP settles on (after its first-iteration rebuild), with its
    default arguments and with the Python executor's (ddp_bucket_kwargs)."""
    import torch
    from torch import nn

    dist.init_process_group("gloo")
    sizes = {}
    for label, kwargs in (("default", {}), ("executor", ddp_bucket_kwargs())):
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(LAYERS)])
        ddp = torch_ddp.DistributedDataParallel(model, **kwargs)
        for _ in range(3):  # DDP rebuilds in the 2nd forward and logs it in the 3rd
            ddp(torch.randn(2, 512)).sum().backward()
        rebuilt = ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"]
        sizes[label] = [int(s) for s in rebuilt.split(", ")]
        del ddp  # then collect and destroy while Python is alive (destroy_groups says why)
    with open(out, "w") as f:
        json.dump(sizes, f)
    destroy_groups()


def test_ddp_builds_the_policys_buckets(tmp_path):
    out = tmp_path / "sizes.json"
    results = run_ranks("test_bucket_policy:ddp_buckets_rank", 1, {"out": str(out)})
    assert all(r.returncode == 0 for r in results), format_results(results)
    # Gradients become ready last layer first, bias before weight.
    ready = [2048, MIB] * LAYERS
    expected = _C.bucket_bytes(ready)
    # 1 MiB + 2 KiB closes the first bucket; 25 more layers pass 25 MiB; 4 layers are left.
    assert expected == [MIB + 2048, 25 * (MIB + 2048), 4 * (MIB + 2048)]
    assert json.loads(out.read_text()) == {"default": expected, "executor": expected}


def test_profiler_defaults_are_the_cores():
    for fn in (profiler.profile, profiler.profile_dict):
        params = inspect.signature(fn).parameters
        assert params["warmup"].default == _C.kDefaultProfileWarmup == 3
        assert params["repeats"].default == _C.kDefaultProfileRepeats == 11
