"""Least-squares fits of measured times, shared by the link probe and the calibration, with the
residuals reported and an explicit verdict where the data cannot support the fit (rather than an
exception that fails a run on a noisy machine).

    fit = fit_line(sizes_bytes, times_s)   # times = alpha + beta * sizes
    fit.alpha, fit.beta, fit.rmse_s, fit.r2, fit.resolved, fit.note
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import List, Sequence, Tuple

__all__ = ["LineFit", "fit_line", "fit_alpha_beta", "fit_through_origin", "fit_two_through_origin"]


@dataclasses.dataclass
class LineFit:
    """times ~ alpha + beta * x, fitted by least squares over `points` (x, t)."""
    alpha: float
    beta: float
    points: List[List[float]]
    rmse_s: float          # root mean square residual, seconds
    r2: float              # coefficient of determination (1 - SS_res / SS_tot); 0 when flat
    resolved: bool         # False: the slope could not be measured (see note)
    note: str = ""
    worst_relative_error: float = 0.0  # max over points of |fit - t| / t

    def predict(self, x: float) -> float:
        return self.alpha + self.beta * x

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _residual_stats(xs, ts, alpha, beta):
    residuals = [t - (alpha + beta * x) for x, t in zip(xs, ts)]
    ss_res = sum(r * r for r in residuals)
    mean_t = statistics.fmean(ts)
    ss_tot = sum((t - mean_t) ** 2 for t in ts)
    rmse = (ss_res / len(ts)) ** 0.5
    return rmse, (1.0 - ss_res / ss_tot) if ss_tot > 0 else 0.0


def _worst_relative_error(xs, ts, alpha, beta):
    return max((abs(alpha + beta * x - t) / t for x, t in zip(xs, ts) if t > 0), default=0.0)


def fit_through_origin(xs: Sequence[float], ts: Sequence[float]) -> float:
    """The slope of t = beta * x by least squares."""
    denominator = sum(x * x for x in xs)
    return sum(x * t for x, t in zip(xs, ts)) / denominator if denominator > 0 else 0.0


def fit_two_through_origin(x1: Sequence[float], x2: Sequence[float], ts: Sequence[float],
                           ws: Sequence[float]) -> Tuple[float, float]:
    """(a, b) >= 0 minimising sum w (a x1 + b x2 - t)^2 (the 2x2 normal equations); where the
    minimum has a negative coefficient, the best fit with that one at 0 (through the origin on
    the other regressor), and (0, 0) where neither helps."""
    s11 = sum(w * u * u for w, u in zip(ws, x1))
    s22 = sum(w * v * v for w, v in zip(ws, x2))
    s12 = sum(w * u * v for w, u, v in zip(ws, x1, x2))
    s1t = sum(w * u * t for w, u, t in zip(ws, x1, ts))
    s2t = sum(w * v * t for w, v, t in zip(ws, x2, ts))
    det = s11 * s22 - s12 * s12
    if det > 1e-12 * max(s11 * s22, 1e-300):
        a, b = (s1t * s22 - s2t * s12) / det, (s2t * s11 - s1t * s12) / det
        if a >= 0 and b >= 0:
            return a, b
    candidates = [(max(0.0, s1t / s11) if s11 > 0 else 0.0, 0.0),
                  (0.0, max(0.0, s2t / s22) if s22 > 0 else 0.0)]

    def loss(ab):
        return sum(w * (ab[0] * u + ab[1] * v - t) ** 2 for w, u, v, t in zip(ws, x1, x2, ts))
    return min(candidates, key=loss)


def _weighted_line(xs, ts, ws):
    """(alpha, beta) minimising sum w (alpha + beta x - t)^2 (the normal equations)."""
    sw = sum(ws)
    mean_x = sum(w * x for w, x in zip(ws, xs)) / sw
    mean_t = sum(w * t for w, t in zip(ws, ts)) / sw
    sxx = sum(w * (x - mean_x) ** 2 for w, x in zip(ws, xs))
    beta = sum(w * (x - mean_x) * (t - mean_t) for w, x, t in zip(ws, xs, ts)) / sxx
    return mean_t - beta * mean_x, beta


def fit_line(xs: Sequence[float], ts: Sequence[float], relative: bool = True) -> LineFit:
    """Least squares t = alpha + beta * x with alpha >= 0 (a negative intercept is noise: refit
    through the origin). `relative`: minimise the squared RELATIVE residuals (weights 1/t^2), so
    that a fit over sizes spanning orders of magnitude predicts small messages (latency) as
    well as large ones (bandwidth); else plain least squares. When the times do not grow with x
    (beta <= 0: latency and noise swamp the per-byte cost at these sizes) the fit is
    `resolved=False`, with alpha the median time and beta the largest x's time spread over it
    (an upper bound of the per-byte cost the data allow), and `note` says so. ValueError only for
    unusable input (fewer than two distinct x)."""
    xs = [float(x) for x in xs]
    ts = [float(t) for t in ts]
    if len(xs) != len(ts) or len(set(xs)) < 2:
        raise ValueError(f"fit: need at least two distinct message sizes with one time each "
                         f"(got sizes {xs} and {len(ts)} times)")
    weights = [1.0 / (t * t) if relative and t > 0 else 1.0 for t in ts]
    alpha, beta = _weighted_line(xs, ts, weights)
    if alpha < 0:
        alpha = 0.0
        denominator = sum(w * x * x for w, x in zip(weights, xs))
        beta = sum(w * x * t for w, x, t in zip(weights, xs, ts)) / denominator if denominator else 0.0
    points = [[x, t] for x, t in zip(xs, ts)]
    if beta <= 0:
        largest = max(range(len(xs)), key=lambda i: xs[i])
        alpha = statistics.median(ts)
        beta = ts[largest] / xs[largest] if xs[largest] > 0 else 0.0
        rmse, r2 = _residual_stats(xs, ts, alpha, beta)
        return LineFit(alpha, beta, points, rmse, r2, False,
                       "times do not grow with size at these sizes (latency or noise dominate): "
                       "alpha is the median time, beta the largest size's time per byte, an "
                       "upper bound; measure larger sizes on a quieter machine to resolve it",
                       _worst_relative_error(xs, ts, alpha, beta))
    rmse, r2 = _residual_stats(xs, ts, alpha, beta)
    return LineFit(alpha, beta, points, rmse, r2, True, "",
                   _worst_relative_error(xs, ts, alpha, beta))


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float],
                   relative: bool = True) -> tuple:
    """(alpha_s, beta_s_per_byte) of fit_line; ValueError when the slope is not resolved (for
    callers that need a measured bandwidth and have no fallback)."""
    fit = fit_line(sizes_bytes, times_s, relative)
    if not fit.resolved:
        raise ValueError(f"probe: times do not grow with message size; cannot fit a bandwidth "
                         f"(sizes {list(sizes_bytes)}, times {list(times_s)})")
    return fit.alpha, fit.beta
