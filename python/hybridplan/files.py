"""One way to write a file so that a reader never sees half of it and a failed write leaves the
previous file intact: plans and graphs, clusters, checkpoints and measurement records."""

from __future__ import annotations

import os
from typing import IO, Any, Callable, Union

__all__ = ["write_atomic", "write_text_atomic"]

PathLike = Union[str, "os.PathLike[str]"]


def write_atomic(path: PathLike, write: Callable[[IO[Any]], None], binary: bool = False) -> None:
    """Calls write(f) on `<path>.tmp-<pid>`, flushes and fsyncs it, renames it over `path` and
    fsyncs the directory. On any failure the temporary file is removed and `path` keeps its
    previous content."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "wb" if binary else "w", **({} if binary else {"encoding": "utf-8"})) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_text_atomic(path: PathLike, text: str) -> None:
    """write_atomic of a text (UTF-8)."""
    write_atomic(path, lambda f: f.write(text))
