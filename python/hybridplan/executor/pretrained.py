"""Pretrained weights straight into the pieces a rank holds: apply(..., load_pretrained=DIR) reads
a Hugging Face safetensors directory (one model.safetensors, or shards listed by
model.safetensors.index.json, as save_pretrained and hp.export_pretrained write them) into any
plan, each rank reading only what it holds (docs/real_size.md):

  - a FSDP2 shard or a tensor-parallel slice (a DTensor): torch.distributed.checkpoint's
    HuggingFaceStorageReader with dcp.load, which reads each local chunk with safetensors'
    `get_slice` (the file is memory-mapped: only the slice's bytes are read);
  - a pipeline stage's parameters: the same, for the stage's tensors only;
  - a pipeline stage traced at a tensor-parallel rank's shapes (a plain tensor holding that
    rank's slice): `get_slice` of that slice;
  - a whole replica (DDP): every tensor.

The file's keys are the model's state_dict keys (what save_pretrained writes; a tied weight is
stored once, under any of its names). Tensors the file does not hold by design, non-persistent
buffers (a rotary embedding's inv_freq), come from the initialiser (executor/materialize) on a
meta-built model, or keep their values on a real one. Values are converted to the model's
dtype. Refused with ValueError before anything is read, naming the directory or file: no
model.safetensors and no index; an index naming a file that is missing; a state_dict tensor the
files do not hold; a tensor whose shape is not the model's.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Set, Tuple

import torch
from torch import nn

kSingle = "model.safetensors"
kIndex = "model.safetensors.index.json"

__all__ = ["Pretrained"]


class Pretrained:
    """The safetensors directory `directory` checked against `module` (a meta-built or real
    model): `file_key` maps each state_dict tensor (canonical name, materialize.
    canonical_names) to its key in the files; `load(targets)` fills a rank's tensors."""

    def __init__(self, directory: str, module: nn.Module, canonical: Dict[str, str],
                 source: str = "apply"):
        from safetensors import safe_open

        self.directory = os.fspath(directory)
        self.where = source
        files = self._files()
        self.entries: Dict[str, Tuple[str, List[int]]] = {}  # key -> (file, shape)
        for path in files:
            try:
                with safe_open(path, framework="pt") as f:
                    for key in f.keys():
                        self.entries.setdefault(key, (path, list(f.get_slice(key).get_shape())))
            except Exception as e:  # a truncated or foreign file
                raise ValueError(f"{path}: not a readable safetensors file ({type(e).__name__}: "
                                 f"{str(e).strip()[:200]})") from None
        described = files[0] if len(files) == 1 else os.path.join(self.directory, kIndex)
        # every tensor of the model's state_dict, under each of its names (tied weights)
        aliases: Dict[str, List[str]] = {}
        for name in module.state_dict(keep_vars=True):
            aliases.setdefault(canonical[name], []).append(name)
        shapes = {canonical[n]: list(t.shape) for n, t in
                  list(module.named_parameters(remove_duplicate=False)) +
                  list(module.named_buffers(remove_duplicate=False)) if t is not None}
        self.file_key: Dict[str, str] = {}
        missing = []
        for canon, names in aliases.items():
            key = next((n for n in names if n in self.entries), None)
            if key is None:
                missing.append(names[0])
                continue
            path, shape = self.entries[key]
            if shape != shapes[canon]:
                raise ValueError(f"{path}: tensor {key} has shape {shape}; the model's "
                                 f"{names[0]} is {shapes[canon]}")
            self.file_key[canon] = key
        if missing:
            raise ValueError(f"{described}: {len(missing)} tensors of "
                             f"{type(module).__name__} are missing: {missing[:8]}")

    def _files(self) -> List[str]:
        """The safetensors files: the index's (each must exist), else model.safetensors."""
        index = os.path.join(self.directory, kIndex)
        single = os.path.join(self.directory, kSingle)
        if not os.path.isdir(self.directory):
            raise ValueError(f"{self.where}: load_pretrained={self.directory!r} is not a "
                             f"directory")
        if os.path.exists(index):
            try:
                with open(index) as f:
                    weight_map = json.load(f)["weight_map"]
                names = sorted(set(weight_map.values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
                raise ValueError(f"{index}: weight_map must map tensor names to file names "
                                 f"({type(e).__name__}: {e})") from None
            paths = [os.path.join(self.directory, n) for n in names]
            absent = [n for n, p in zip(names, paths) if not os.path.isfile(p)]
            if absent:
                raise ValueError(f"{index}: names {absent[0]}, which is missing from "
                                 f"{self.directory}")
            return paths
        if os.path.isfile(single):
            return [single]
        raise ValueError(f"{self.directory}: holds neither {kSingle} nor {kIndex} (a Hugging "
                         f"Face safetensors checkpoint)")

    def holds(self) -> Set[str]:
        """The canonical names the files provide."""
        return set(self.file_key)

    def load(self, targets: Dict[str, List[torch.Tensor]], narrow_rank: int = 0) -> None:
        """Fills each target (canonical name -> the rank's tensors for it, with storage) that
        the files hold with its part of the stored tensor (module doc)."""
        import torch.distributed.checkpoint as dcp
        from safetensors import safe_open
        from torch.distributed.checkpoint import HuggingFaceStorageReader
        from torch.distributed.tensor import DTensor

        state: Dict[str, torch.Tensor] = {}
        narrowed: List[Tuple[str, torch.Tensor]] = []
        copies: List[Tuple[torch.Tensor, torch.Tensor]] = []  # (from, to) after the load
        for canon, tensors in targets.items():
            key = self.file_key.get(canon)
            if key is None:
                continue
            full = self.entries[key][1]
            for t in tensors:
                if not isinstance(t, DTensor) and list(t.shape) != full:
                    narrowed.append((key, t))
                elif key not in state:
                    state[key] = t
                else:
                    copies.append((state[key], t))
        if state:
            with torch.no_grad():
                dcp.load({k: v.detach() if not isinstance(v, DTensor) else v
                          for k, v in state.items()},
                         storage_reader=HuggingFaceStorageReader(self.directory), no_dist=True)
        with torch.no_grad():
            for key, t in narrowed:
                path, full = self.entries[key]
                dims = [d for d in range(len(full)) if full[d] != t.shape[d]]
                if len(dims) != 1 or full[dims[0]] % t.shape[dims[0]]:
                    raise ValueError(f"{path}: tensor {key} has shape {full}, of which this "
                                     f"rank holds no slice of shape {list(t.shape)}")
                d, k = dims[0], t.shape[dims[0]]
                index = tuple(slice(narrow_rank * k, (narrow_rank + 1) * k) if i == d
                              else slice(None) for i in range(len(full)))
                with safe_open(path, framework="pt") as f:
                    t.copy_(f.get_slice(key)[index])
            for src, dst in copies:
                (dst._local_tensor if isinstance(dst, DTensor) else dst).copy_(
                    src._local_tensor if isinstance(src, DTensor) else src)
