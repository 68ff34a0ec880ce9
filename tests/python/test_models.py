"""The built-in models: train, are deterministic, trace with torch.fx, and hold nothing that would
make split training differ from single-process training (BatchNorm, dropout)."""

import pytest
import torch
import torch.fx
from torch import nn

from hybridplan import models

NAMES = sorted(models.MODELS)


@pytest.mark.parametrize("name", NAMES)
def test_trains_one_step(name):
    model = models.get(name)
    inputs, target = model.example_inputs(4), model.example_target(4)
    assert all(x.shape[0] == 4 for x in inputs)
    loss = model.loss(model(*inputs), target)
    assert torch.isfinite(loss)
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == [], f"parameters without gradient: {missing}"


@pytest.mark.parametrize("name", NAMES)
def test_factory_is_deterministic_and_leaves_global_rng_alone(name):
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = models.get(name), models.get(name)
    after = torch.rand(1)
    assert torch.equal(before, after), "the factory consumed the global RNG"
    for (na, pa), (nb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert na == nb and torch.equal(pa, pb), na
    x = a.example_inputs(2)
    assert torch.equal(a(*x), a(*x))
    assert not torch.equal(models.get(name, seed=1).state_dict()[na], pa)


# Hugging Face modules are not torch.fx symbolic_trace-able (the profiler takes their edges from
# hooks, see hybridplan.models' docstring)
@pytest.mark.parametrize("name", sorted(set(NAMES) - {"llama_lm"}))
def test_symbolic_trace_matches_eager(name):
    model = models.get(name)
    traced = torch.fx.symbolic_trace(model)
    x = model.example_inputs(3)
    torch.testing.assert_close(traced(*x), model(*x), rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_no_batchnorm_no_dropout(name):
    """No BatchNorm, and no dropout that drops anything (torch's transformer layers hold
    Dropout modules; transformer_lm builds them with p=0, which draws no random numbers)."""
    bad = [n for n, m in models.get(name).named_modules()
           if isinstance(m, nn.modules.batchnorm._BatchNorm)
           or (isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0)]
    assert bad == []


def test_biglstm_softmax_dominates_parameters():
    model = models.biglstm()
    softmax = sum(p.numel() for p in model.softmax.parameters())
    lstms = sum(p.numel() for m in (model.lstm0, model.lstm1) for p in m.parameters())
    assert softmax > lstms  # BigLSTM's defining shape: the softmax layer is the largest
    assert model.lstm0.proj_size > 0


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match=r"unknown model 'resnet' \(expected one of"):
        models.get("resnet")
