"""One way to write a file so that a reader never sees half of it and a failed write leaves the
previous file intact: plans and graphs, clusters, checkpoints and measurement records."""

from __future__ import annotations

import os
import shutil
from typing import IO, Any, Callable, Union

__all__ = ["write_atomic", "write_text_atomic", "fsync_path", "replace_dir"]

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
    fsync_path(folder)


def fsync_path(path: PathLike) -> None:
    """fsync of a file or a directory (a directory's entries: a rename in it is durable)."""
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_dir(src: PathLike, dst: PathLike) -> None:
    """Renames the directory `src` (its files already durable) to `dst`. A previous `dst` is
    moved aside to `<dst>.old-<pid>` first and removed after; if the rename fails it is put
    back. The renames are made durable (fsync of `src` and of the parent directory)."""
    src, dst = os.fspath(src), os.path.abspath(os.fspath(dst))
    fsync_path(src)
    old = f"{dst}.old-{os.getpid()}"
    had_previous = os.path.exists(dst)
    if had_previous:
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dst, old)
    try:
        os.replace(src, dst)
    except BaseException:
        if had_previous:
            os.replace(old, dst)  # put the previous one back
        raise
    fsync_path(os.path.dirname(dst))
    if had_previous:
        shutil.rmtree(old, ignore_errors=True)


def write_text_atomic(path: PathLike, text: str) -> None:
    """write_atomic of a text (UTF-8)."""
    write_atomic(path, lambda f: f.write(text))
