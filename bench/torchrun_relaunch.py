"""The two-rank benchmarks' launcher: a script run as `python bench/<script>.py` starts itself
again under torchrun (shared here so that each benchmark does not carry its own copy)."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]


def relaunch(script: str, argv: Sequence[str], ranks: int = 2) -> Optional[int]:
    """Outside torchrun: runs `script` with `argv` under torchrun (--standalone, `ranks` local
    processes, one intra-op thread each unless OMP_NUM_THREADS says otherwise, this checkout's
    python/ first on PYTHONPATH) and returns its exit status. Under torchrun (RANK set): None,
    and the caller goes on as a rank."""
    if "RANK" in os.environ:
        return None
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT / "python"),
                                                      os.environ.get("PYTHONPATH", "")) if p))
    return subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc-per-node", str(ranks), os.path.abspath(script),
                            *argv], env=env)
