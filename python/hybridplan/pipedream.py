"""PipeDream's published layer profiles as hybridplan Graphs.

    from hybridplan import pipedream
    graph = pipedream.load("inception_v3")                  # from the profiles folder
    graph = pipedream.import_profile("path/to/graph.txt", batch_size=64)

The profiles (msr-fiddle/pipedream, profiler/*/profiles/<model>/graph.txt, MIT License) are
inputs, never part of this repository: the folder comes from $HYBRIDPLAN_PIPEDREAM_PROFILES, by
default ../shared/data/pipedream-profiles beside the repository root.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

from . import _C
from .planner import Graph

ENV_VAR = "HYBRIDPLAN_PIPEDREAM_PROFILES"
DEFAULT_BATCH_SIZE = _C.PIPEDREAM_DEFAULT_BATCH_SIZE  # the image profiles' batch (its README)
_REPO_ROOT = Path(__file__).resolve().parents[2]
WHERE_FROM = ("PipeDream's layer profiles come from its repository "
              "(https://github.com/msr-fiddle/pipedream, profiler/*/profiles/<model>/graph.txt); "
              f"put them, named <model>.graph.txt, in a folder and point ${ENV_VAR} at it")


def profiles_dir() -> Path:
    """The folder holding <model>.graph.txt files (it may not exist; see available())."""
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else (_REPO_ROOT / ".." / "shared" / "data" / "pipedream-profiles")


def available() -> list:
    """Model names with a profile in profiles_dir(), sorted; [] when the folder is absent."""
    folder = profiles_dir()
    if not folder.is_dir():
        return []
    return sorted(p.name[: -len(".graph.txt")] for p in folder.glob("*.graph.txt"))


def import_profile(path: Union[str, os.PathLike], batch_size: int = DEFAULT_BATCH_SIZE,
                   name: Optional[str] = None) -> Graph:
    """The PipeDream graph.txt at `path` as a Graph whose times are for `batch_size` samples
    (PipeDream's GNMT profiles do not state theirs: pass it). ValueError names file and line."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1 (got {batch_size!r})")
    text = _C.import_pipedream(os.fspath(path), batch_size, name or "")
    return Graph.from_json(text, os.fspath(path))


def load(model: str, batch_size: int = DEFAULT_BATCH_SIZE) -> Graph:
    """The profile of `model` (e.g. "inception_v3", "gnmt") from profiles_dir().
    FileNotFoundError, saying where profiles come from, when it is not there."""
    path = profiles_dir() / f"{model}.graph.txt"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no PipeDream profile for {model!r}. {WHERE_FROM}")
    return import_profile(path, batch_size, model)
