"""Hands autograd.recompute's names on to code that still imports them from here; delete this
file once nothing does (recompute moved below the executor and the profiler, which both use it)."""

from ..autograd.recompute import (FULL, KINDS, RUNNING_STATS, SAVED_OPS, SELECTIVE, recompute,
                                  saves)

__all__ = ["FULL", "SELECTIVE", "KINDS", "RUNNING_STATS", "SAVED_OPS", "recompute", "saves"]
