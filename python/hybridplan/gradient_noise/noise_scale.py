"""The gradient noise scale B_simple = tr(Sigma) / |G|^2, measured from the gradients.

McCandlish et al., "An Empirical Model of Large-Batch Training" (https://arxiv.org/abs/1812.06162)
show that the critical batch (beyond which a bigger batch buys little) is close to B_simple,
where G is the true gradient and Sigma the per-sample gradient covariance. A gradient averaged
over B samples has E|G_B|^2 = |G|^2 + tr(Sigma) / B, so squared norms at two batch sizes
b < B give unbiased estimates of both (their appendix A):

    |G|^2    ~ (B |G_B|^2 - b |G_b|^2) / (B - b)
    tr(Sigma) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B)

    est = noise_scale(module, data, loss_fn, small_batch=8, big_batch=128, steps=50)
    est.b_simple, est.stderr, est.g_squared, est.trace_sigma

`estimate_from_norms` is the same math as a pure function of per-step squared norms: the
online estimator (executor/noise.py: a replica's local gradient at b against the all-reduced
one at dp * b, every N steps of training) feeds it the same way, with exponentially decaying
step weights.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, List, Optional, Sequence, Tuple

# torch is imported inside the functions that measure: the estimator (estimate_from_norms) and
# the Jobs made from it work where torch is not installed.


@dataclasses.dataclass(frozen=True)
class NoiseScale:
    """B_simple with its ingredients. `g_squared_samples` and `trace_sigma_samples` are the
    per-step unbiased estimates; the headline figures are ratios of their means."""

    small_batch: int
    big_batch: int
    small_sq_norms: Tuple[float, ...]   # |G_b|^2 per step
    big_sq_norms: Tuple[float, ...]     # |G_B|^2 per step
    g_squared_samples: Tuple[float, ...]
    trace_sigma_samples: Tuple[float, ...]
    g_squared: float          # estimate of |G|^2 (mean over steps)
    g_squared_stderr: float
    trace_sigma: float        # estimate of tr(Sigma) (mean over steps)
    trace_sigma_stderr: float
    b_simple: float           # trace_sigma / g_squared; inf when g_squared <= 0
    stderr: float             # of b_simple, delta method (see estimate_from_norms)
    effective_steps: float = 0.0   # 1 / sum(w^2) of the step weights: steps with equal weights

    @property
    def steps(self) -> int:
        return len(self.small_sq_norms)


def _mean(xs: Sequence[float]) -> float:
    return math.fsum(xs) / len(xs)


def _sample_variance(xs: Sequence[float]) -> float:
    m = _mean(xs)
    return math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def _weighted_mean(xs: Sequence[float], w: Optional[Sequence[float]]) -> float:
    if w is None:
        return _mean(xs)
    return math.fsum(wi * x for wi, x in zip(w, xs))


def _variance_of_mean(xs: Sequence[float], w: Optional[Sequence[float]]) -> float:
    """Variance of the (weighted) mean of xs. Equal weights: sample variance / n. Normalised
    weights w: sum(w^2) * s^2 with the unbiased weighted variance
    s^2 = sum w (x - m)^2 / (1 - sum w^2) (reliability weights), which is the same figure when
    every w is 1/n."""
    if w is None:
        return _sample_variance(xs) / len(xs)
    m = _weighted_mean(xs, w)
    w2 = math.fsum(wi * wi for wi in w)
    return w2 * math.fsum(wi * (x - m) ** 2 for wi, x in zip(w, xs)) / (1 - w2)


def unbiased_estimates(small_batch: int, big_batch: int, small_sq_norm: float,
                       big_sq_norm: float) -> Tuple[float, float]:
    """(|G|^2, tr(Sigma)) estimated from one step's |G_b|^2 and |G_B|^2 (appendix A of
    McCandlish et al.; each unbiased, since E|G_b|^2 = |G|^2 + tr(Sigma) / b)."""
    b, B = small_batch, big_batch
    return ((B * big_sq_norm - b * small_sq_norm) / (B - b),
            (small_sq_norm - big_sq_norm) / (1 / b - 1 / B))


def estimate_from_norms(small_batch: int, big_batch: int, small_sq_norms: Sequence[float],
                        big_sq_norms: Sequence[float],
                        weights: Optional[Sequence[float]] = None) -> NoiseScale:
    """B_simple from per-step squared gradient norms at `small_batch` and `big_batch`.

    Numerator and denominator are averaged over steps separately and divided once: the mean of
    per-step ratios is biased (a ratio of noisy estimates is not the ratio of their means).
    The standard error is the delta method for a ratio of means, R = mean(s) / mean(g):
        Var(R) ~ Var(mean of (s_i - R g_i)) / mean(g)^2
    with the sample variance over the n steps (Var(mean) = sample variance / n), which accounts
    for the covariance of s_i and g_i within a step (they share |G_b|^2 and |G_B|^2). When
    mean(g) <= 0 the noise swamps the signal at these batches and step count: b_simple and
    stderr are inf.

    `weights` (one per step, >= 0, not all 0; normalised here) make every mean a weighted mean:
    the online estimator's exponential moving average (executor.noise) passes decay^age, so
    numerator and denominator are each an EMA, as the paper smooths them. The variance of a
    weighted mean is sum(w^2) times the weighted variance (see _variance_of_mean), and
    `effective_steps` is 1 / sum(w^2) (n with equal weights).
    """
    _check_batches(small_batch, big_batch)
    small, big = [float(x) for x in small_sq_norms], [float(x) for x in big_sq_norms]
    if len(small) != len(big):
        raise ValueError(f"noise_scale: small_sq_norms and big_sq_norms must have one entry per "
                         f"step each (got {len(small)} and {len(big)})")
    _check_steps(len(small))
    w = _normalised_weights(weights, len(small))
    b, B = small_batch, big_batch
    g, s = zip(*(unbiased_estimates(b, B, ns, nb) for ns, nb in zip(small, big)))
    g_mean, s_mean = _weighted_mean(g, w), _weighted_mean(s, w)
    if g_mean > 0:
        ratio = s_mean / g_mean
        residual = [si - ratio * gi for si, gi in zip(s, g)]
        stderr = math.sqrt(_variance_of_mean(residual, w)) / g_mean
    else:
        ratio = stderr = math.inf
    effective = len(small) if w is None else 1 / math.fsum(wi * wi for wi in w)
    return NoiseScale(small_batch=b, big_batch=B, small_sq_norms=tuple(small),
                      big_sq_norms=tuple(big), g_squared_samples=tuple(g),
                      trace_sigma_samples=tuple(s), g_squared=g_mean,
                      g_squared_stderr=math.sqrt(_variance_of_mean(g, w)),
                      trace_sigma=s_mean, trace_sigma_stderr=math.sqrt(_variance_of_mean(s, w)),
                      b_simple=ratio, stderr=stderr, effective_steps=effective)


def _normalised_weights(weights: Optional[Sequence[float]], n: int) -> Optional[List[float]]:
    if weights is None:
        return None
    w = [float(x) for x in weights]
    if len(w) != n:
        raise ValueError(f"noise_scale: weights must have one entry per step (got {len(w)} "
                         f"for {n} steps)")
    if any(not math.isfinite(x) or x < 0 for x in w) or math.fsum(w) <= 0:
        raise ValueError("noise_scale: weights must be finite, >= 0 and not all 0")
    total = math.fsum(w)
    w = [x / total for x in w]
    if math.fsum(x * x for x in w) >= 1:
        raise ValueError("noise_scale: weights must give at least two steps a weight > 0 "
                         "for a standard error")
    return w


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_batches(small_batch: Any, big_batch: Any) -> None:
    if not _is_int(small_batch) or small_batch < 1:
        raise ValueError(f"noise_scale: small_batch must be an integer >= 1 (got {small_batch!r})")
    if not _is_int(big_batch) or big_batch <= small_batch:
        raise ValueError(f"noise_scale: big_batch must be an integer > small_batch "
                         f"{small_batch} (got {big_batch!r})")


def _check_steps(steps: Any) -> None:
    if not _is_int(steps) or steps < 2:
        raise ValueError(f"noise_scale: steps must be an integer >= 2 for a standard error "
                         f"(got {steps!r})")


def noise_scale(module, data: Callable[[int, int], Tuple[Any, Any]],
                loss_fn: Callable[[Any, Any], Any], small_batch: int, big_batch: int,
                steps: int) -> NoiseScale:
    """Measures B_simple of `module` on `data` (see the module docstring).

    Each of the `steps` steps calls `data(small_batch, step)` and `data(big_batch, step)`, each
    returning `(inputs, target)` (`inputs` a tensor or a tuple of positional inputs), and takes
    the gradient of `loss_fn(module(*inputs), target)` with respect to every parameter that
    requires grad. `loss_fn` must average over the batch (reduction "mean"), as E|G_B|^2 =
    |G|^2 + tr(Sigma)/B assumes. Gradients are taken in training mode; the module's parameters,
    buffers (e.g. BatchNorm running statistics), `.grad` and train/eval flags are as before
    on return. Bad arguments raise ValueError naming the argument.
    """
    _check_arguments(module, data, loss_fn, small_batch, big_batch, steps)
    small, big = [], []
    with _training_mode(module):
        for step in range(steps):
            small.append(_squared_grad_norm(module, data, loss_fn, small_batch, step))
            big.append(_squared_grad_norm(module, data, loss_fn, big_batch, step))
    return estimate_from_norms(small_batch, big_batch, small, big)


def _check_arguments(module, data, loss_fn, small_batch, big_batch, steps) -> None:
    from torch import nn

    if not isinstance(module, nn.Module):
        raise ValueError(f"noise_scale: module must be a torch.nn.Module "
                         f"(got {type(module).__name__})")
    if not any(p.requires_grad for p in module.parameters()):
        raise ValueError("noise_scale: module must have a parameter that requires grad (got none)")
    for name, fn in (("data", data), ("loss_fn", loss_fn)):
        if not callable(fn):
            raise ValueError(f"noise_scale: {name} must be callable (got {type(fn).__name__})")
    _check_batches(small_batch, big_batch)
    _check_steps(steps)


class _training_mode:
    """Puts every submodule in training mode and restores each one's flag on exit."""

    def __init__(self, module):
        self._flags = [(m, m.training) for m in module.modules()]
        self._module = module

    def __enter__(self):
        self._module.train()

    def __exit__(self, *exc):
        for m, training in self._flags:
            m.training = training


def _squared_grad_norm(module, data, loss_fn, batch_size: int, step: int) -> float:
    """|grad of the mean loss over one batch|^2, in float64.

    torch.func.functional_call runs the module with its own parameters (autograd.grad returns
    their gradients without accumulating into .grad) and with clones of its buffers, so a
    forward in training mode cannot move running statistics."""
    import torch
    from torch.func import functional_call

    inputs, target = data(batch_size, step)
    inputs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    params = {n: p for n, p in module.named_parameters() if p.requires_grad}
    state = dict(module.named_parameters())
    state.update({n: b.clone() for n, b in module.named_buffers()})
    loss = loss_fn(functional_call(module, state, tuple(inputs)), target)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"noise_scale: loss_fn must return a scalar tensor (got {got})")
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    return float(sum(g.double().pow(2).sum() for g in grads if g is not None))
