"""Real data that every machine with the test dependencies has, with no download.

    data = hybridplan.datasets.digits()        # scikit-learn's bundled handwritten digits
    data.train_inputs, data.train_targets      # (1437, 1, 8, 8) float32 in [0, 1], int64 labels
    data.eval_inputs, data.eval_targets        # the held-out 360

The digits are UCI's optical recognition of handwritten digits (1,797 8x8 images of 10 classes,
https://archive.ics.uci.edu/dataset/80), shipped inside scikit-learn
(`sklearn.datasets.load_digits`, read from the package's own files). The split is fixed: a
permutation drawn from torch.Generator seed 0, the first 80 % for training.
"""

from __future__ import annotations

import dataclasses

import torch

__all__ = ["Dataset", "digits"]


@dataclasses.dataclass(frozen=True)
class Dataset:
    name: str
    train_inputs: torch.Tensor
    train_targets: torch.Tensor
    eval_inputs: torch.Tensor
    eval_targets: torch.Tensor

    @property
    def num_train(self) -> int:
        return int(self.train_targets.shape[0])


def digits(eval_fraction: float = 0.2) -> Dataset:
    """scikit-learn's handwritten digits as (N, 1, 8, 8) float32 images in [0, 1] and int64 labels,
    split into training and held-out parts by a fixed permutation."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:  # a clear message, not a bare traceback
        raise ImportError("hybridplan.datasets.digits needs scikit-learn (pip install "
                          "scikit-learn; `make test` installs it)") from e
    if not 0 < eval_fraction < 1:
        raise ValueError(f"digits: eval_fraction must be in (0, 1) (got {eval_fraction!r})")
    raw = load_digits()
    images = torch.tensor(raw.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    labels = torch.tensor(raw.target, dtype=torch.int64)
    order = torch.randperm(labels.shape[0], generator=torch.Generator().manual_seed(0))
    n_train = int(round(labels.shape[0] * (1 - eval_fraction)))
    train, held = order[:n_train], order[n_train:]
    return Dataset("digits", images[train].contiguous(), labels[train].contiguous(),
                   images[held].contiguous(), labels[held].contiguous())
