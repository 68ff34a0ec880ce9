"""Callables named on a command line as MODULE:NAME (a model factory, a dataset, a loss): one
loader for every command and worker, so none of them imports another command's module."""

from __future__ import annotations

import importlib
from typing import Any, Callable

__all__ = ["load_factory"]


def load_factory(spec: str, command: str = "profile", what: str = "factory") -> Callable[..., Any]:
    """The callable named by MODULE:NAME (NAME may be dotted); errors name `command` and the
    argument `what`."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{command}: {what} must be MODULE:{what.lstrip('-').upper()} "
                         f"(got {spec!r})")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{command}: cannot import {module_name!r} ({exc})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{command}: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{command}: {spec} is not callable")
    return obj
