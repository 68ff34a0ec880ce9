"""Consolidated checkpoints (docs/formats.md "Checkpoint"): one file that holds the whole model
under the original module's state_dict keys and the optimizer state keyed by parameter name, so
that a job saved under one plan resumes under any other (dp, mp, mode).

    hp.save_checkpoint("ckpt.pt")                                   # every rank calls it
    hp = hybridplan.apply(other_plan, model, ..., resume_from="ckpt.pt")

Why one torch.save file and not torch.distributed.checkpoint (DCP): DCP writes a directory of
per-rank shards plus metadata, keyed by the names the saving ranks hold, and reads it back
through its planner in Python; the contract here is one consolidated file that LibTorch's
torch::pickle_load reads from C++ (the C++ executor), so the file is torch.save of plain
containers (dict of str -> tensor / int / float / str / list / tuple / bool / None). The models
this executor trains fit one host's memory (each rank builds the whole module in apply()), so
gathering the state onto rank 0 costs no more than a DCP write would hold per host. A sharded
plan's parameters and optimizer state are DTensors (sharding): every rank gathers them whole,
in the same order, and the file is the same as an unsharded plan's; resuming into a sharded
plan loads the whole model before fully_shard splits it, and gives each rank its shard of the
optimizer state.

Atomicity: rank 0 gathers every part (gather_object: each rank has contributed once it
returns), writes `<path>.tmp-<pid>`, flushes and fsyncs it, renames it over `path` and fsyncs
the directory; then it tells every rank whether the write succeeded (broadcast), so all ranks
return or all raise. A write interrupted before the rename leaves the previous file at `path`
untouched and removes its temporary file.
"""

from __future__ import annotations

import copy
import os
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from . import sharding
from .. import files

kFormat = "hybridplan.checkpoint"
kVersion = 1

OptimizerByName = Dict[str, Any]  # {"class", "state": {name: {..}}, "param_groups": [...]}


def parameter_aliases(module: nn.Module) -> Dict[str, str]:
    """Every parameter name of `module` (tied names included) -> its canonical name: the first
    name of the same tensor in named_parameters() order (GPT-2: lm_head.weight ->
    transformer.wte.weight). The optimizer state of a tied weight is stored once, under it."""
    first: Dict[int, str] = {}
    return {name: first.setdefault(id(p), name)
            for name, p in module.named_parameters(remove_duplicate=False)}


def _cpu(value: Any) -> Any:
    """CPU copies of the tensors in `value`; a DTensor (a sharded plan's optimizer state) is
    gathered whole first, which is collective over its mesh."""
    if isinstance(value, torch.Tensor):
        return sharding.full(value.detach()).cpu().clone()
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cpu(v) for v in value)
    return value


def _names_of(optimizer: torch.optim.Optimizer, names: Dict[int, str]
              ) -> Tuple[Dict[str, Any], Dict[int, Optional[str]]]:
    """optimizer.state_dict() and its parameter index -> canonical name (None: unnamed)."""
    sd = optimizer.state_dict()
    name_of: Dict[int, Optional[str]] = {}
    for group_sd, group in zip(sd["param_groups"], optimizer.param_groups):
        for index, p in zip(group_sd["params"], group["params"]):
            name_of[index] = names.get(id(p))
    return sd, name_of


def optimizer_groups_by_name(optimizer: torch.optim.Optimizer, names: Dict[int, str]
                             ) -> OptimizerByName:
    """The optimizer's class and param_groups (hyperparameters, parameters by canonical name),
    without its state: local, no communication."""
    sd, name_of = _names_of(optimizer, names)
    groups = [dict({k: _cpu(v) for k, v in g.items() if k != "params"},
                   params=[name_of[i] for i in g["params"] if name_of.get(i)])
              for g in sd["param_groups"]]
    return {"class": type(optimizer).__name__, "state": {}, "param_groups": groups}


def optimizer_state_by_name(optimizer: torch.optim.Optimizer, names: Dict[int, str]
                            ) -> OptimizerByName:
    """optimizer.state_dict() with parameter indices replaced by canonical names (`names`:
    id(parameter) -> name). Parameters without a name (a parameter-free stage's placeholder)
    are left out. Tensors are CPU copies, a sharded parameter's state gathered whole: every
    rank of its mesh must call this (the parameters' order is the same on each)."""
    sd, name_of = _names_of(optimizer, names)
    out = optimizer_groups_by_name(optimizer, names)
    out["state"] = {name_of[i]: _cpu(s) for i, s in sorted(sd["state"].items())
                    if name_of.get(i)}
    return out


def merge_optimizer_states(parts: List[OptimizerByName]) -> OptimizerByName:
    """One optimizer state from the stages' (a tied weight's copies hold the same state: the
    first stage's is kept). Group i of the result holds group i of every stage."""
    merged: OptimizerByName = {"class": parts[0]["class"], "state": {}, "param_groups": []}
    for part in parts:
        if part["class"] != merged["class"]:
            raise ValueError(f"checkpoint: every stage must use the same optimizer class (got "
                             f"{merged['class']} and {part['class']})")
        for name, s in part["state"].items():
            merged["state"].setdefault(name, s)
        for i, group in enumerate(part["param_groups"]):
            if i == len(merged["param_groups"]):
                merged["param_groups"].append(dict(group, params=[]))
            params = merged["param_groups"][i]["params"]
            params.extend(n for n in group["params"] if n not in params)
    return merged


def build(model: Dict[str, torch.Tensor], optimizer: OptimizerByName, step: int,
          plan_json: str, graph_sha256: str, lr_scheduler: Optional[Dict[str, Any]] = None,
          grad_scaler: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    ckpt = {"format": kFormat, "version": kVersion, "model": dict(model),  # plain, ordered
            "optimizer": optimizer, "step": int(step), "plan": plan_json,
            "graph_sha256": graph_sha256}
    if lr_scheduler is not None:  # optional: a run without a scheduler has none
        ckpt["lr_scheduler"] = lr_scheduler
    if grad_scaler is not None:  # optional: fp16 runs only (their loss scaler)
        ckpt["grad_scaler"] = grad_scaler
    return ckpt


_SCALER_FIELDS = (("scale", float), ("growth_factor", float), ("backoff_factor", float),
                  ("growth_interval", int), ("_growth_tracker", int))


def optional_state(ckpt: Dict[str, Any], field: str, path: str, absent: Any) -> Any:
    """The checkpoint's optional state field `field` (grad_scaler, lr_scheduler: saved by the
    runs that have one), or None where it holds none; rank 0 then notes on stderr that
    `path` holds no `absent()` (what is missing and where the resumed state starts instead) at
    the checkpoint's step."""
    saved = ckpt.get(field)
    if saved is None:
        import sys
        import torch.distributed as dist

        if not dist.is_initialized() or dist.get_rank() == 0:
            print(f"hybridplan: {path} holds no {absent()} at step {ckpt.get('step')}",
                  file=sys.stderr, flush=True)
    return saved


def scaler_state(scaler: Any) -> Optional[Dict[str, Any]]:
    """fp16's loss scaler's state as the checkpoints hold it: GradScaler.state_dict(), plain
    numbers (the scale, its growth and backoff factors, the growth interval and the count of
    clean steps since the scale last changed; the same on every rank: the scaler reduces its
    inf check over the job), or None without a scaler (fp32, bf16)."""
    if scaler is None:
        return None
    state = scaler.state_dict()
    return {name: kind(state[name]) for name, kind in _SCALER_FIELDS}


def load_scaler_state(scaler: Any, ckpt: Dict[str, Any], path: str) -> None:
    """Restores fp16's loss scaler from the checkpoint's grad_scaler, so that the resumed run
    scales, skips and grows as the uninterrupted one would (a scaler restarted at 2^16 skips
    the steps that overflow until it has halved back down). A checkpoint without one (saved in
    fp32 or bf16) leaves the scaler at its initial scale, which rank 0 notes; a plan without a
    scaler ignores the field. ValueError naming the file when the field is malformed."""
    if scaler is None:
        return
    saved = optional_state(ckpt, "grad_scaler", path,
                           lambda: f"loss scale (saved without fp16): the fp16 loss scaler "
                                   f"starts at its initial scale {scaler.get_scale():g}")
    if saved is not None:
        scaler.load_state_dict(check_scaler_state(saved, path))


def check_scaler_state(saved: Any, path: str) -> Dict[str, Any]:
    """The grad_scaler field's fields and types; ValueError naming `path` and the field."""
    if not isinstance(saved, dict):
        raise ValueError(f"{path}: grad_scaler must be a dict (got {type(saved).__name__})")
    for name, kind in _SCALER_FIELDS:
        value = saved.get(name)
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              if kind is float else isinstance(value, int) and not isinstance(value, bool))
        if not ok or value < 0 or (name == "scale" and not value > 0):
            what = "positive " if name == "scale" else "non-negative "
            raise ValueError(f"{path}: grad_scaler.{name} must be a {what}{kind.__name__} "
                             f"(got {value!r})")
    return {name: kind(saved[name]) for name, kind in _SCALER_FIELDS}


def scheduler_state(scheduler: Any) -> Optional[Dict[str, Any]]:
    """An LR scheduler's state as the checkpoints hold it: {"class": its class name, "state":
    its state_dict()} (plain containers; every rank's is the same: it counts optimizer
    steps), or None without a scheduler."""
    if scheduler is None:
        return None
    return {"class": type(scheduler).__name__, "state": _cpu(scheduler.state_dict())}


def load_scheduler_state(scheduler: Any, ckpt: Dict[str, Any], path: str) -> None:
    """Restores `scheduler` (built on the optimizer before its state was loaded, so that the
    optimizer's learning rates are the saved ones) from the checkpoint's lr_scheduler. A
    checkpoint without one (saved without a scheduler) leaves it at its first step, which rank
    0 notes; ValueError naming the file when it holds another class's state."""
    if scheduler is None:
        return
    saved = optional_state(ckpt, "lr_scheduler", path,
                           lambda: "LR scheduler state (saved without lr_scheduler): the "
                                   "schedule starts from its first step")
    if saved is None:
        return
    if not isinstance(saved, dict) or saved.get("class") != type(scheduler).__name__:
        got = saved.get("class") if isinstance(saved, dict) else type(saved).__name__
        raise ValueError(f"{path}: lr_scheduler.class must be the scheduler resumed "
                         f"({type(scheduler).__name__}) (got {got!r}); resume with the same "
                         f"lr_scheduler factory")
    scheduler.load_state_dict(copy.deepcopy(saved["state"]))  # torch pops from what it loads


def _save(obj: Any, f: Any) -> None:
    """torch.save; a name of its own so that tests can make it fail mid-write."""
    torch.save(obj, f)


def write_atomic(checkpoint: Dict[str, Any], path: str) -> None:
    """torch.save to `<path>.tmp-<pid>`, fsync, rename over `path`, fsync the directory
    (files.write_atomic). On any failure the temporary file is removed and `path` keeps its
    previous content."""
    files.write_atomic(path, lambda f: _save(checkpoint, f), binary=True)


def load(path: Any) -> Dict[str, Any]:
    """Reads and checks a checkpoint's envelope; ValueError naming the file and the field."""
    path = os.fspath(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"{path}: checkpoint cannot be read (no such file)") from None
    except Exception as e:  # not a torch.save file, truncated, or not plain containers
        raise ValueError(f"{path}: checkpoint must be a file written by "
                         f"AppliedPlan.save_checkpoint (got {type(e).__name__}: "
                         f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return check_envelope(ckpt, path)


def check_envelope(ckpt: Any, path: str) -> Dict[str, Any]:
    """A checkpoint dict's format, version and fields; ValueError naming `path` and the field."""
    if not isinstance(ckpt, dict) or ckpt.get("format") != kFormat:
        got = ckpt.get("format") if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ValueError(f"{path}: format must be {kFormat!r} (got {got!r})")
    if ckpt.get("version") != kVersion:
        raise ValueError(f"{path}: version must be {kVersion} (got {ckpt.get('version')!r})")
    for field, kind in (("model", dict), ("optimizer", dict), ("step", int), ("plan", str),
                        ("graph_sha256", str)):
        if not isinstance(ckpt.get(field), kind):
            raise ValueError(f"{path}: {field} must be a {kind.__name__} (got "
                             f"{type(ckpt.get(field)).__name__})")
    if ckpt.get("grad_scaler") is not None:
        check_scaler_state(ckpt["grad_scaler"], path)
    return ckpt


def check_model(ckpt: Dict[str, Any], module: nn.Module, path: str) -> None:
    """The checkpoint's model state must have exactly the module's state_dict keys, shapes and
    dtypes; ValueError naming the file and the first parameter that differs."""
    mine = module.state_dict()
    theirs = ckpt["model"]
    what = type(module).__name__
    for key, t in mine.items():
        if key not in theirs:
            raise ValueError(f"{path}: model[{key!r}] must be in the checkpoint: {what} has it, "
                             f"the checkpoint is of another model")
        c = theirs[key]
        if not isinstance(c, torch.Tensor) or c.shape != t.shape or c.dtype != t.dtype:
            got = (f"{c.dtype}{list(c.shape)}" if isinstance(c, torch.Tensor)
                   else type(c).__name__)
            raise ValueError(f"{path}: model[{key!r}] must be {t.dtype}{list(t.shape)} as in "
                             f"{what} (got {got}): the checkpoint is of another model")
    extra = [k for k in theirs if k not in mine]
    if extra:
        raise ValueError(f"{path}: model[{extra[0]!r}] is not a parameter or buffer of {what} "
                         f"({len(extra)} such keys): the checkpoint is of another model")
    known = set(parameter_aliases(module))
    optimizer = ckpt["optimizer"]
    for name in list(optimizer.get("state", {})) + [
            n for g in optimizer.get("param_groups", []) for n in g.get("params", [])]:
        if name not in known:
            raise ValueError(f"{path}: optimizer state names {name!r}, which is not a "
                             f"parameter of {what}")


def load_optimizer_state(optimizer: torch.optim.Optimizer, names: Dict[int, str],
                         saved: OptimizerByName, path: str) -> None:
    """Loads the state of this rank's parameters (by canonical name) into `optimizer`; each
    local group takes the hyperparameters (lr, momentum, betas, ...) of the saved group that
    holds its first named parameter. A sharded parameter (a DTensor) takes its shard of each
    saved full tensor of its shape (sharding.like_param; no communication)."""
    if saved.get("class") != type(optimizer).__name__:
        raise ValueError(f"{path}: optimizer.class must be the optimizer resumed "
                         f"({type(optimizer).__name__}) (got {saved.get('class')!r})")
    group_of = {n: g for g in saved["param_groups"] for n in g["params"]}
    sd = optimizer.state_dict()
    state: Dict[int, Any] = {}
    groups = []
    for group_sd, group in zip(sd["param_groups"], optimizer.param_groups):
        source = None
        for index, p in zip(group_sd["params"], group["params"]):
            name = names.get(id(p))
            if name is None:
                continue
            if name in saved["state"]:
                state[index] = {k: sharding.like_param(v, p)  # a copy per parameter
                                for k, v in _cpu(saved["state"][name]).items()}
            source = source or group_of.get(name)
        hyper = {k: v for k, v in (source or group_sd).items() if k != "params"}
        groups.append(dict(hyper, params=group_sd["params"]))
    optimizer.load_state_dict({"state": state, "param_groups": groups})
