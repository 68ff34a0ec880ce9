"""Least-squares fits of measured times, shared by the link probe and the calibration, with the
residuals reported and an explicit verdict where the data cannot support the fit (rather than an
exception that fails a run on a noisy machine).

    fit = fit_line(sizes_bytes, times_s)   # times = alpha + beta * sizes
    fit.alpha, fit.beta, fit.rmse_s, fit.r2, fit.resolved, fit.note
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import List, Sequence

__all__ = ["LineFit", "fit_line", "fit_alpha_beta", "fit_through_origin"]


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


def fit_through_origin(xs: Sequence[float], ts: Sequence[float]) -> float:
    """The slope of t = beta * x by least squares."""
    denominator = sum(x * x for x in xs)
    return sum(x * t for x, t in zip(xs, ts)) / denominator if denominator > 0 else 0.0


def fit_line(xs: Sequence[float], ts: Sequence[float]) -> LineFit:
    """Least squares t = alpha + beta * x with alpha >= 0 (a negative intercept is noise: refit
    through the origin). When the times do not grow with x (beta <= 0: latency and noise swamp
    the per-byte cost at these sizes) the fit is `resolved=False`, with alpha the median time and
    beta the largest x's time spread over it (an upper bound of the per-byte cost the data allow),
    and `note` says so. ValueError only for unusable input (fewer than two distinct x)."""
    xs = [float(x) for x in xs]
    ts = [float(t) for t in ts]
    if len(xs) != len(ts) or len(set(xs)) < 2:
        raise ValueError(f"fit: need at least two distinct message sizes with one time each "
                         f"(got sizes {xs} and {len(ts)} times)")
    mean_x, mean_t = statistics.fmean(xs), statistics.fmean(ts)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    beta = sum((x - mean_x) * (t - mean_t) for x, t in zip(xs, ts)) / sxx
    alpha = mean_t - beta * mean_x
    if alpha < 0:
        alpha, beta = 0.0, fit_through_origin(xs, ts)
    points = [[x, t] for x, t in zip(xs, ts)]
    if beta <= 0:
        largest = max(range(len(xs)), key=lambda i: xs[i])
        alpha = statistics.median(ts)
        beta = ts[largest] / xs[largest] if xs[largest] > 0 else 0.0
        rmse, r2 = _residual_stats(xs, ts, alpha, beta)
        return LineFit(alpha, beta, points, rmse, r2, False,
                       "times do not grow with size at these sizes (latency or noise dominate): "
                       "alpha is the median time, beta the largest size's time per byte, an "
                       "upper bound; measure larger sizes on a quieter machine to resolve it")
    rmse, r2 = _residual_stats(xs, ts, alpha, beta)
    return LineFit(alpha, beta, points, rmse, r2, True)


def fit_alpha_beta(sizes_bytes: Sequence[float], times_s: Sequence[float]) -> tuple:
    """(alpha_s, beta_s_per_byte) of fit_line; ValueError when the slope is not resolved (for
    callers that need a measured bandwidth and have no fallback)."""
    fit = fit_line(sizes_bytes, times_s)
    if not fit.resolved:
        raise ValueError(f"probe: times do not grow with message size; cannot fit a bandwidth "
                         f"(sizes {list(sizes_bytes)}, times {list(times_s)})")
    return fit.alpha, fit.beta
