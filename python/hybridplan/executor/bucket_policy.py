"""The gradient bucket policy of both executors and the cost model, defined once in the core
(csrc/planner/costs/bucket_policy.h) and read here through hybridplan._C: DDP's first bucket of 1 MiB,
then 25 MiB, packed in the order backward produces gradients."""

from __future__ import annotations

from typing import Any, Dict

from .. import _C

_BYTES_PER_MIB = 1024 * 1024


def ddp_bucket_kwargs() -> Dict[str, Any]:
    """DistributedDataParallel arguments for the policy. Not bucket_cap_mb: given alone, DDP makes
    its first bucket as large as the others; bucket_cap_mb_list gives [first, later] caps (MiB)."""
    caps = (_C.kDefaultFirstBucketCapBytes, _C.kDefaultBucketCapBytes)
    assert all(c % _BYTES_PER_MIB == 0 for c in caps), caps  # DDP takes whole MiB
    return {"bucket_cap_mb_list": [c // _BYTES_PER_MIB for c in caps]}
