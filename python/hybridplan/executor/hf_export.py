"""Exports a module trained under a plan as a Hugging Face checkpoint directory (docs/formats.md
"Export to Hugging Face"): config.json, generation_config.json where the model generates, and
model.safetensors (or model-0000i-of-0000n.safetensors shards and their index), which
`type(model).from_pretrained(directory)` and `AutoModel*.from_pretrained` load.

    hp.export_pretrained("out/gpt2-trained")          # every rank calls it (collective)
    model = GPT2LMHeadModel.from_pretrained("out/gpt2-trained")

How: rank 0 gathers the whole model state under the original module's state_dict keys (the
gather save_checkpoint uses: AppliedPlan._gather_parts / _build_consolidated; a pipeline's
stages and a sharded plan's DTensors come back as whole CPU tensors) and calls the model's own
`save_pretrained(..., state_dict=...)`, so the files are exactly what transformers writes for
that model class (its key renaming, its config, its handling of tied weights). The gathered
state holds a tied weight's copies as separate tensors (GPT-2's lm_head.weight and
transformer.wte.weight); they are re-tied to one tensor first (after checking that the copies
are equal), so that save_pretrained drops the tied duplicate as it does for a live model
(safetensors refuses shared tensors) and from_pretrained ties it back.

The live training module is not touched: save_pretrained runs on a shallow copy of the original
module (its submodules shared and only read: the model's dtype and structure) that holds its own
copies of `config` and `generation_config` (save_pretrained records dtype and architectures in
them); the weights written are the gathered plain tensors, never the module's own (which are
stale pipeline originals or DTensor shards after a sharded plan).

Only `transformers.PreTrainedModel`s: a Hugging Face checkpoint is a config plus weights, and a
plain nn.Module has no config that from_pretrained could rebuild it from. Any other module gets
a ValueError on every rank before anything is gathered; for those, save_checkpoint (one
consolidated torch.save file) or consolidated_state()["model"] with
`safetensors.torch.save_file` are the exports.

Atomic, as save_checkpoint: rank 0 writes into a temporary sibling directory
`<directory>.tmp-<pid>`, fsyncs every file, then renames it into place (a previous export at
`directory` is first renamed aside to `<directory>.old-<pid>` and removed once the new one is in
place) and fsyncs the parent. A failure before the rename removes the temporary directory and
leaves a previous export intact. Rank 0 broadcasts the outcome: every rank returns, or every
rank raises RuntimeError. An existing `directory` that is not a previous export (not empty and
no config.json) is refused rather than replaced.
"""

from __future__ import annotations

import copy
import inspect
import os
import shutil
from typing import Any, Dict, List, Optional, Union

import torch

from .. import files
from .rank_agreement import rank_zero_acts, rank_zero_error

kDefaultMaxShardSize = "5GB"  # the Hub's usual shard size (transformers 4.x's default)


def _pretrained_model_class() -> Optional[type]:
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return None
    return PreTrainedModel


def check_exportable(module: Any) -> None:
    """ValueError unless `module` is a transformers.PreTrainedModel."""
    base = _pretrained_model_class()
    if base is None or not isinstance(module, base):
        why = ("transformers is not installed" if base is None
               else f"got {type(module).__module__}.{type(module).__qualname__}")
        raise ValueError(
            f"export_pretrained: the module must be a transformers.PreTrainedModel (a Hugging "
            f"Face model, which has the config that from_pretrained rebuilds it from; {why}); "
            f"for any other nn.Module use save_checkpoint(path) (one consolidated torch.save "
            f"file), or consolidated_state()['model'] with safetensors.torch.save_file")


def retie(state: Dict[str, torch.Tensor], aliases: Dict[str, str]) -> Dict[str, torch.Tensor]:
    """`state` with every tied name (aliases: name -> canonical name) holding the canonical
    name's tensor itself, so that save_pretrained sees the weights as tied and writes them once.
    The gathered copies must be equal (a plan keeps them so): ValueError naming the first that
    is not."""
    out = dict(state)
    for name, canonical in aliases.items():
        if name == canonical or name not in out or canonical not in out:
            continue
        if not torch.equal(out[name], out[canonical]):
            raise ValueError(f"export_pretrained: {name} is tied to {canonical} but their "
                             f"trained values differ")
        out[name] = out[canonical]
    return out


def _detached_view(module: Any) -> Any:
    """A shallow copy of `module` for save_pretrained: the same submodules (read only), its own
    config and generation_config (which save_pretrained updates)."""
    # not copy.copy: FSDP2's class of a sharded module reduces to its constructor's call
    view = object.__new__(type(module))
    view.__dict__.update(module.__dict__)  # the same values in a dict of its own
    for name in ("config", "generation_config"):
        if getattr(module, name, None) is not None:
            object.__setattr__(view, name, copy.deepcopy(getattr(module, name)))
    return view


def _fsync_tree(folder: str) -> None:
    for root, _, names in os.walk(folder):
        for name in names:
            files.fsync_path(os.path.join(root, name))
        files.fsync_path(root)


def _check_serialization(module: Any, safe_serialization: bool) -> bool:
    """Whether module.save_pretrained takes safe_serialization (transformers 4.x; 5.x writes
    safetensors only: ValueError for safe_serialization=False there)."""
    if "safe_serialization" in inspect.signature(module.save_pretrained).parameters:
        return True
    if not safe_serialization:
        raise ValueError("export_pretrained: safe_serialization=False needs a transformers "
                         "that writes pytorch_model.bin (4.x); this one writes safetensors only")
    return False


def _save_pretrained(module: Any, folder: str, state: Dict[str, torch.Tensor],
                     safe_serialization: bool, max_shard_size: Union[int, str]) -> None:
    """module.save_pretrained(folder, state_dict=state) on a detached view; a name of its own so
    that tests can make it fail mid-write."""
    kwargs: Dict[str, Any] = {"state_dict": state, "max_shard_size": max_shard_size}
    if _check_serialization(module, safe_serialization):
        kwargs["safe_serialization"] = safe_serialization  # transformers 4.x
    _detached_view(module).save_pretrained(folder, is_main_process=True, **kwargs)


def write_atomic(module: Any, directory: str, state: Dict[str, torch.Tensor], *,
                 safe_serialization: bool = True,
                 max_shard_size: Union[int, str] = kDefaultMaxShardSize) -> None:
    """Writes the export into `<directory>.tmp-<pid>` and renames it into place (module
    docstring). On any failure before the rename the temporary directory is removed and
    `directory` keeps its previous content."""
    directory = os.path.abspath(directory)
    parent = os.path.dirname(directory)
    if os.path.exists(directory):
        if not os.path.isdir(directory):
            raise ValueError(f"{directory} exists and is not a directory")
        if os.listdir(directory) and not os.path.exists(os.path.join(directory, "config.json")):
            raise ValueError(f"{directory} exists and is not a previous export (no "
                             f"config.json): refusing to replace it")
    os.makedirs(parent, exist_ok=True)
    tmp = f"{directory}.tmp-{os.getpid()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        _save_pretrained(module, tmp, state, safe_serialization, max_shard_size)
        _fsync_tree(tmp)
        files.replace_dir(tmp, directory)  # the previous export put back if this fails
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def export_pretrained(hp: Any, directory: Union[str, os.PathLike], *,
                      safe_serialization: bool = True,
                      max_shard_size: Union[int, str] = kDefaultMaxShardSize) -> None:
    """Writes `hp`'s trained model to `directory` as a Hugging Face checkpoint (module
    docstring). Collective: every rank of the plan calls it; rank 0 gathers and writes. Raises
    ValueError on every rank (before gathering) when the original module is not a
    transformers.PreTrainedModel (or safe_serialization=False where transformers writes
    safetensors only), RuntimeError on every rank when the write failed."""
    hp._check_open("export_pretrained")
    check_exportable(hp.original)  # the same module on every rank: all raise alike
    _check_serialization(hp.original, safe_serialization)
    directory = os.fspath(directory)
    parts: Optional[List[Any]] = hp._gather_parts()

    def write() -> None:  # rank 0
        state = retie(hp._build_consolidated(parts)["model"], hp._aliases)
        write_atomic(hp.original, directory, state, safe_serialization=safe_serialization,
                     max_shard_size=max_shard_size)
    rank_zero_acts(write, rank_zero_error(
        lambda why: f"{directory}: export not written (rank 0: {why}); a previous export "
                    f"there, if any, is unchanged"))
