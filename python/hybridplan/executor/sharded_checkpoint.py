"""Sharded checkpoints on torch.distributed.checkpoint (DCP), with a manifest written last.

    hp = hybridplan.apply(plan, model, ..., checkpoint_dir="ckpt", resume_from="latest")
    for inputs, target in batches(start=hp.step_count):
        hp.step(*hp.shard(inputs, target))
        if hp.step_count % 100 == 0:
            hp.save_sharded(async_save=True)       # every rank writes its own part

Layout (docs/checkpoints.md): `<checkpoint_dir>/step-<step, 9 digits>/` holds DCP's files
(`.metadata`, `__<rank>_<i>.distcp`) and `manifest.json`, written last, which lists every file
with its size and sha256. A directory is a checkpoint only once it has its manifest and its
final name: it is written as `step-<N>.partial` and renamed after the manifest, so a writer
killed at any point leaves the previous checkpoints as they were and a `.partial` directory
that resuming ignores (and the next save removes).

What each rank writes (DCP's keys, flat, "/" between the parts, which no parameter name holds):
  model/<key>         the original module's state_dict key: a sharded plan's DTensor shard, a
                      pipeline stage's parameters on the ranks holding it, a replicated
                      parameter once, by the replica a hash of its key picks (so the writes,
                      and an asynchronous save's copies, are spread over the replicas and
                      nothing is copied twice); buffers from replica 0 only, as in the
                      consolidated file (a pipeline's replicas each normalise their own
                      micro-batches, so their BatchNorm statistics differ)
  optim/<name>/<key>  the optimizer state of the parameter whose canonical name is <name>
                      (tied names -> the first, checkpoint.parameter_aliases), sharded as the
                      parameter is
  hybridplan/meta     format, version, step, plan, graph hash, optimizer class and param_groups
                      (merged over the ranks), the LR scheduler's state (checkpoint.
                      scheduler_state; None without one), fp16's loss scale and growth tracker
                      (checkpoint.scaler_state; None without fp16), the caller's `extra`

Loading (apply(resume_from=...)) reads the whole model and optimizer state on every rank into
the consolidated form (checkpoint.build's dict) with DCP's load (no_dist: each rank alone, no
collective before the ranks have agreed), resharding whatever layout wrote it: apply() builds
the whole module on every rank before it places, cuts or shards it, so each rank holds the
whole model once anyway. It verifies the manifest first: a missing file, another size or
another sha256 is refused with the file's name; "latest" skips such checkpoints (logged) and
takes the newest complete one.

Asynchronous saving (async_save=True): DCP copies the state to CPU memory (its staging) and
writes from a thread on a Gloo group of its own (the training's collectives never interleave
with it); the rank then hashes its files in that thread. The checkpoint is finalised (the
ranks' hashes gathered, the manifest written, the directory renamed) by the next save, by
wait() or by close(), on the training thread: until then it is not complete and resuming does
not use it. Why not DCP's own: DCP has no notion of a complete checkpoint beyond its
.metadata, which the coordinator writes before every rank's data is known to be durable and
which says nothing of the data files' integrity.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import warnings
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from .. import files
from . import checkpoint, sharding
from .rank_agreement import rank_zero_acts, rank_zero_error

kFormat = "hybridplan.sharded-checkpoint"
kVersion = 1
MANIFEST = "manifest.json"
LATEST = "latest"
_STEP_DIR = re.compile(r"^step-(\d{9})$")
_META_KEY = "hybridplan/meta"
_HASH_CHUNK = 1 << 22


def step_dir_name(step: int) -> str:
    return f"step-{int(step):09d}"


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_HASH_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _file_entries(folder: str, names: List[str]) -> Dict[str, Dict[str, Any]]:
    return {n: {"bytes": os.path.getsize(os.path.join(folder, n)),
                "sha256": sha256_file(os.path.join(folder, n))} for n in names}


def _own_files(folder: str, rank: int) -> List[str]:
    """The data files DCP's FileSystemWriter wrote for `rank` (its prefix `__<rank>_`)."""
    prefix = f"__{rank}_"
    return sorted(n for n in os.listdir(folder) if n.startswith(prefix))


# ---- what a rank saves ----------------------------------------------------------------------
def local_state(hp: Any) -> Dict[str, Any]:
    """This rank's DCP state (flat keys, see the module doc). Tensors are the live ones (DCP
    reads them during a synchronous save; an asynchronous save copies them first)."""
    state: Dict[str, Any] = {}
    replica0 = hp.replica == 0
    if hp.plan.mode == "placement":
        modules = [("", hp.original)]
    else:
        modules = [("stage", m) for m in hp._runner.modules]
    from ..profiler.stage_split import original_name

    dp, replica = hp.plan.dp, hp.replica

    def mine(key: str, value: Any) -> bool:
        """A value every replica holds alike is written by one of them, the keys spread over
        the replicas by a hash of the key (the same on every replica): each rank then stages
        (async_save copies what it is given) and writes only its share. A DTensor shard is
        always its rank's own."""
        if dp == 1 or not isinstance(value, torch.Tensor) or sharding.is_sharded(value):
            return True
        return zlib.crc32(key.encode()) % dp == replica

    for kind, module in modules:
        buffers = {id(b) for b in module.buffers()}
        for key, value in module.state_dict(keep_vars=True).items():
            name = original_name(key) if kind == "stage" else key
            if id(value) in buffers:
                if not replica0:
                    continue  # a buffer: replica 0's (see the module doc)
            elif not mine(f"model/{name}", value):
                continue
            state.setdefault(f"model/{name}", value.detach())
    names = hp._param_names()
    for p, s in hp.optimizer.state.items():
        name = names.get(id(p))
        if name is None:
            continue
        for k, v in s.items():
            if mine(f"optim/{name}/{k}", v):
                state.setdefault(f"optim/{name}/{k}", v.detach() if isinstance(v, torch.Tensor)
                                 else v)
    return state


def _groups_by_name(hp: Any) -> Dict[str, Any]:
    """This rank's optimizer class and param_groups (hyperparameters, parameters by name)."""
    return checkpoint.optimizer_groups_by_name(hp.optimizer, hp._param_names())


class PendingSave:
    """A save in flight: DCP's future and this rank's file hashes, computed in the writer's
    thread once DCP is done."""

    def __init__(self, root: str, step: int, partial: str, meta: Dict[str, Any]):
        self.root, self.step, self.partial, self.meta = root, step, partial, meta
        self.hashes: Optional[Dict[str, Dict[str, Any]]] = None
        self.error: Optional[str] = None
        self.done = threading.Event()
        self.stall_s = 0.0  # how long save_sharded held the training thread

    def attach(self, future: Any, rank: int) -> None:
        def finished(f: Any) -> None:
            try:
                f.result()
                self.hashes = _file_entries(self.partial, _own_files(self.partial, rank))
            except BaseException as e:  # reported by finalize on the training thread
                self.error = f"{type(e).__name__}: {e}"
            finally:
                self.done.set()
        future.add_done_callback(finished)


def begin(hp: Any, root: str, group: Any, async_save: bool, extra: Any) -> PendingSave:
    """Starts writing hp's state to `<root>/step-<N>.partial` (collective over `group`)."""
    import torch.distributed.checkpoint as dcp

    rank = dist.get_rank()
    step = hp.step_count
    partial = os.path.join(root, step_dir_name(step) + ".partial")

    def clear() -> None:  # rank 0: a partial directory a killed writer left goes
        os.makedirs(root, exist_ok=True)
        if os.path.exists(partial):
            shutil.rmtree(partial)
        os.makedirs(partial)
    rank_zero_acts(clear, rank_zero_error(
        lambda why: f"{partial}: checkpoint not started (rank 0: {why})"), group=group)
    groups = [None] * dist.get_world_size()
    dist.all_gather_object(groups, _groups_by_name(hp), group=group)
    merged = checkpoint.merge_optimizer_states(groups)
    meta = {"format": kFormat, "version": kVersion, "step": int(step),
            "plan": hp.plan.to_json(), "graph_sha256": hp.plan.graph_sha256,
            "optimizer_class": merged["class"], "param_groups": merged["param_groups"],
            "lr_scheduler": checkpoint.scheduler_state(hp._scheduler),
            "grad_scaler": checkpoint.scaler_state(hp._scaler), "extra": extra}
    state = local_state(hp)
    state[_META_KEY] = _encode(meta)
    pending = PendingSave(root, step, partial, meta)
    if async_save:
        future = dcp.async_save(state, checkpoint_id=partial, process_group=group)
        # AsyncSaveResponse when staging is itself asynchronous; a Future otherwise
        future = getattr(future, "upload_completion", future)
    else:
        future = concurrent.futures.Future()
        try:
            dcp.save(state, checkpoint_id=partial, process_group=group)
            future.set_result(None)
        except BaseException as e:
            future.set_exception(e)
    pending.attach(future, rank)
    return pending


def _encode(meta: Dict[str, Any]) -> bytes:
    """The meta entry as bytes (torch.save of plain containers): DCP stores an object as one
    item, where a dict would be flattened into keys of its own."""
    import io

    buffer = io.BytesIO()
    torch.save(meta, buffer)
    return buffer.getvalue()


def _decode(blob: Any, where: str) -> Dict[str, Any]:
    import io

    try:
        meta = torch.load(io.BytesIO(blob), weights_only=True)
    except Exception as e:
        raise ValueError(f"{where}: {_META_KEY} cannot be read ({type(e).__name__}: {e})") \
            from None
    if not isinstance(meta, dict) or meta.get("format") != kFormat:
        raise ValueError(f"{where}: {_META_KEY}.format must be {kFormat!r}")
    if meta.get("version") != kVersion:
        raise ValueError(f"{where}: {_META_KEY}.version must be {kVersion} (got "
                         f"{meta.get('version')!r})")
    return meta


def finalize(pending: PendingSave, group: Any, keep: int,
             on_complete: Optional[Callable[[str], None]] = None) -> str:
    """Waits for every rank's part, then rank 0 writes the manifest (every file, its size and
    sha256; written last), renames the directory to its final name and keeps the newest `keep`
    checkpoints. Collective over `group`; raises on every rank if any rank's write failed."""
    pending.done.wait()
    rank = dist.get_rank()
    mine = {"error": pending.error, "files": pending.hashes}
    parts: Optional[List[Any]] = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(mine, parts, dst=0, group=group)
    final = os.path.join(pending.root, step_dir_name(pending.step))

    def complete() -> None:  # rank 0
        try:
            errors = [f"rank {r}: {p['error']}" for r, p in enumerate(parts) if p["error"]]
            if errors:
                raise RuntimeError("; ".join(errors))
            entries: Dict[str, Dict[str, Any]] = {}
            for p in parts:
                entries.update(p["files"])
            entries.update(_file_entries(pending.partial, [".metadata"]))
            manifest = {"format": kFormat, "version": kVersion, "step": pending.step,
                        "plan": pending.meta["plan"], "world_size": len(parts),
                        "files": dict(sorted(entries.items()))}
            files.write_text_atomic(os.path.join(pending.partial, MANIFEST),
                                    json.dumps(manifest, indent=1) + "\n")
            # a complete checkpoint of the same step already there (a run resumed before it
            # and saved it again) is replaced, put back if the rename fails
            files.replace_dir(pending.partial, final)
            _prune(pending.root, keep)
        except BaseException:
            shutil.rmtree(pending.partial, ignore_errors=True)
            raise
    rank_zero_acts(complete, rank_zero_error(
        lambda why: f"{final}: checkpoint not written ({why}); the previous checkpoints are "
                    f"unchanged"), group=group, catch=BaseException)
    if on_complete is not None:
        on_complete(final)
    return final


def complete_steps(root: str) -> List[Tuple[int, str]]:
    """(step, path) of the directories named as complete checkpoints under `root`, newest
    first (their manifests not yet verified)."""
    if not os.path.isdir(root):
        return []
    found = []
    for n in os.listdir(root):
        m = _STEP_DIR.match(n)
        if m and os.path.isdir(os.path.join(root, n)):
            found.append((int(m.group(1)), os.path.join(root, n)))
    return sorted(found, reverse=True)


def _prune(root: str, keep: int) -> None:
    if keep <= 0:
        return
    for _, path in complete_steps(root)[keep:]:
        shutil.rmtree(path, ignore_errors=True)


# ---- reading --------------------------------------------------------------------------------
def is_checkpoint_dir(path: str) -> bool:
    """A directory DCP wrote (a .metadata), complete or not."""
    return os.path.isfile(os.path.join(path, ".metadata")) or \
        os.path.isfile(os.path.join(path, MANIFEST))


def verify(path: str) -> Dict[str, Any]:
    """The manifest of the checkpoint at `path`, every file checked against it; ValueError
    naming the file and what is wrong."""
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise ValueError(f"{manifest_path}: missing: the checkpoint is incomplete (its write "
                         f"did not finish; the manifest is written last)")
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{manifest_path}: cannot be read as JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != kFormat:
        raise ValueError(f"{manifest_path}: format must be {kFormat!r}")
    if manifest.get("version") != kVersion:
        raise ValueError(f"{manifest_path}: version must be {kVersion} (got "
                         f"{manifest.get('version')!r})")
    entries = manifest.get("files")
    if not isinstance(entries, dict) or ".metadata" not in entries:
        raise ValueError(f"{manifest_path}: files must list every file, .metadata included")
    for name, entry in entries.items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise ValueError(f"{file}: missing (the manifest lists it)")
        size = os.path.getsize(file)
        if size != entry.get("bytes"):
            raise ValueError(f"{file}: {size} bytes, the manifest says {entry.get('bytes')} "
                             f"(truncated or rewritten)")
        if sha256_file(file) != entry.get("sha256"):
            raise ValueError(f"{file}: sha256 differs from the manifest's (corrupted)")
    return manifest


def find(resume_from: str, checkpoint_dir: Optional[str],
         log: Callable[[str], None]) -> Optional[str]:
    """The sharded checkpoint `resume_from` names, verified: a checkpoint directory itself
    (refused if incomplete or corrupted), or a directory of them (or "latest": checkpoint_dir)
    whose newest complete one is taken, those that fail verification skipped and logged. None:
    "latest" and no complete checkpoint yet (a first run). ValueError otherwise."""
    if resume_from == LATEST:
        if checkpoint_dir is None:
            raise ValueError('resume_from="latest" needs checkpoint_dir (the directory the '
                             'checkpoints are saved in)')
        root, required = os.fspath(checkpoint_dir), False
    else:
        root, required = os.fspath(resume_from), True
        if is_checkpoint_dir(root):
            verify(root)
            return root
    reasons = []
    for step, path in complete_steps(root):
        try:
            verify(path)
        except ValueError as e:
            reasons.append(str(e))
            log(f"hybridplan: skipping the checkpoint at step {step}: {e}")
            continue
        return path
    if required:
        why = f" ({'; '.join(reasons)})" if reasons else ""
        raise ValueError(f"{root}: resume_from must be a checkpoint or a directory holding a "
                         f"complete one (step-<N>/ with its manifest.json){why}")
    log(f"hybridplan: no complete checkpoint in {root}{' (' + '; '.join(reasons) + ')' if reasons else ''}; starting from the beginning")
    return None


def read(path: str) -> Dict[str, Any]:
    """The checkpoint at `path` (verified) in the consolidated form (checkpoint.build's dict,
    plus "extra"), read on this rank alone."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = dcp.FileSystemReader(path).read_metadata()
    target: Dict[str, Any] = {}
    for key, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            target[key] = torch.empty(md.size, dtype=md.properties.dtype)
        else:
            target[key] = None
    with warnings.catch_warnings():  # "assuming ... a single process": meant, see the doc
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(target, checkpoint_id=path, no_dist=True)
    if _META_KEY not in target:
        raise ValueError(f"{path}: {_META_KEY} missing: not a hybridplan checkpoint")
    meta = _decode(target.pop(_META_KEY), path)
    model: Dict[str, Any] = {}
    state: Dict[str, Dict[str, Any]] = {}
    for key, value in target.items():
        kind, _, rest = key.partition("/")
        if kind == "model":
            model[rest] = value
        elif kind == "optim":
            name, _, k = rest.partition("/")
            state.setdefault(name, {})[k] = value
    optimizer = {"class": meta["optimizer_class"], "state": state,
                 "param_groups": meta["param_groups"]}
    ckpt = checkpoint.build(model, optimizer, meta["step"], meta["plan"], meta["graph_sha256"],
                            meta.get("lr_scheduler"), meta.get("grad_scaler"))
    ckpt["extra"] = meta.get("extra")
    return ckpt


def log_rank0(line: str) -> None:
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(line, file=sys.stderr, flush=True)


def resolve(resume_from: Any, checkpoint_dir: Any = None
            ) -> Tuple[Optional[Dict[str, Any]], str]:
    """apply(resume_from=...)'s one entry: (the checkpoint dict, where it came from, for
    messages). `resume_from` is a consolidated checkpoint's path, or such a dict in memory
    (AppliedPlan.consolidated_state(): a plan switch), checked as a file's envelope is; or a
    sharded checkpoint, a directory of them, or "latest" (find): read into
    the same form. (None, "") when "latest" finds no complete checkpoint (a first run)."""
    if isinstance(resume_from, dict):
        where = "resume_from (in memory)"
        return checkpoint.check_envelope(resume_from, where), where
    path = os.fspath(resume_from)
    if path == LATEST or os.path.isdir(path):
        found = find(path, checkpoint_dir, log_rank0)
        if found is None:
            return None, ""
        return checkpoint.check_envelope(read(found), found), found
    return checkpoint.load(path), path
