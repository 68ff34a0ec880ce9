"""Python twins of the C++ built-in models (csrc/models, builtin_models.cc): the same layers,
qualified names, shapes and state_dict keys, so that the C++ profiler and executor can be held
against the Python ones on the same model. Shared by the tests and the benchmarks that compare
the two languages (bench/bench_profile_agreement.py, bench/bench_cpp_ddp.py).

    model = mlp([256, 1024, 1024, 256])                 # models::mlp(widths)
    model, inputs = TWINS["small_cnn"](batch=32)         # a twin and its example inputs
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[2]

MLP_WIDTHS = (1024, 2048, 2048, 1024)  # builtin_models.cc's "mlp"


def mlp(widths: Sequence[int]) -> nn.Sequential:
    """csrc/models/mlp.h mlp(widths): Linear, ReLU, ..., Linear."""
    layers: List[nn.Module] = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def small_cnn() -> nn.Sequential:
    """csrc/models/small_cnn.h small_cnn() with its default options."""
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(32 * 8 * 8, 10))


def _mlp_twin(batch: int) -> Tuple[nn.Module, Tuple[torch.Tensor, ...]]:
    return mlp(MLP_WIDTHS), (torch.randn(batch, MLP_WIDTHS[0]),)


def _small_cnn_twin(batch: int) -> Tuple[nn.Module, Tuple[torch.Tensor, ...]]:
    return small_cnn(), (torch.randn(batch, 3, 32, 32),)


def _biglstm_twin(batch: int) -> Tuple[nn.Module, Tuple[torch.Tensor, ...]]:
    """hybridplan.models.biglstm, whose C++ twin is csrc/models/biglstm.h."""
    from hybridplan import models

    model = models.biglstm()
    return model, model.example_inputs(batch)


# C++ built-in model name -> builds its Python twin and example inputs at a batch size.
TWINS: Dict[str, Callable[[int], Tuple[nn.Module, Tuple[torch.Tensor, ...]]]] = {
    "mlp": _mlp_twin, "small_cnn": _small_cnn_twin, "biglstm": _biglstm_twin}


def bin_dir() -> Path:
    """Where the C++ example programs are (profile_model, train_mlp): $HYBRIDPLAN_BIN_DIR, else
    build/bin."""
    return Path(os.environ.get("HYBRIDPLAN_BIN_DIR", ROOT / "build" / "bin"))
