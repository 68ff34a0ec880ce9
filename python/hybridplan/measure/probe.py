"""Link probe: measures this machine's devices and links into a Cluster JSON (kind
"hybridplan.cluster", docs/formats.md). Run one process per device under torchrun:

    torchrun --nproc_per_node 2 -m hybridplan probe --out cluster.json

Each level's link is modelled as time(bytes) = latency_s + bytes / bandwidth_bytes_per_s
(alpha-beta, Hockney). Send/recv ping-pong between two ranks gives one-way times at several
message sizes, fitted by least squares. The intra-node link pairs ranks 0 and 1; the inter-node
link pairs rank 0 with the first rank of the second node (only measured with several nodes; a
single node copies the intra-node numbers, and says so in "sources"). All-reduce over all ranks
is measured too and fitted to the ring model the planner uses,

    allreduce_s = 2(p-1) * alpha + 2(p-1)/p * bytes / bandwidth,

and recorded under "measured" (with every raw point) so the two can be compared.
Device: memory from CUDA (per GPU) or /proc/meminfo (MemTotal shared by the node's ranks);
peak_flops from the fastest of several timed float32 matmuls, the slowest rank's figure.
Gloo on CPU, NCCL on CUDA; collectives time out after `timeout_s`.
"""

import contextlib
import datetime
import json
import os
import statistics
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

__all__ = ["probe", "fit_alpha_beta", "DEFAULT_SIZES"]

from ..files import write_text_atomic  # noqa: E402
from .fitting import fit_alpha_beta, fit_line  # noqa: E402  (fit_alpha_beta: public here too)
from .timing import max_over_ranks, min_over_ranks, timed_samples  # noqa: E402

DEFAULT_SIZES = (4 << 10, 32 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)  # message bytes


@dataclass
class _Env:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int

    @property
    def num_nodes(self) -> int:
        return self.world_size // self.local_world_size


def rank_env(command: str = "probe", min_ranks: int = 2) -> _Env:
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                           "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ValueError(f"{command}: environment lacks {', '.join(missing)}: run under "
                         f"torchrun, e.g. torchrun --nproc_per_node 2 -m hybridplan {command} "
                         "--out cluster.json")
    env = _Env(*(int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                              "LOCAL_WORLD_SIZE")))
    if env.world_size < min_ranks:
        raise ValueError(f"{command}: needs at least {min_ranks} ranks to measure a link (got "
                         f"WORLD_SIZE={env.world_size})")
    if env.world_size % env.local_world_size:
        raise ValueError(f"probe: WORLD_SIZE {env.world_size} is not a multiple of "
                         f"LOCAL_WORLD_SIZE {env.local_world_size} (nodes must be alike)")
    return env


def time_allreduce(nbytes: int, device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of one all-reduce of `nbytes` (float32), the slowest rank's median."""
    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    samples = timed_samples(lambda: dist.all_reduce(buf), device, warmup, repeats, barrier=True)
    return max_over_ranks(statistics.median(samples), device)


def _time_pingpong(nbytes: int, a: int, b: int, rank: int, device: torch.device, warmup: int,
                   repeats: int) -> float:
    """Median one-way seconds (half a round trip) of `nbytes` between ranks a and b."""
    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)

    def round_trip():
        if rank == a:
            dist.send(buf, b)
            dist.recv(buf, b)
        elif rank == b:
            dist.recv(buf, a)
            dist.send(buf, a)
    samples = [s / 2 for s in timed_samples(round_trip, device, warmup, repeats, barrier=True)]
    one_way = statistics.median(samples) if rank == a else 0.0
    return max_over_ranks(one_way, device)


def peak_flops(device: torch.device, n: int = 512, repeats: int = 5) -> float:
    """float32 FLOP/s of the fastest of `repeats` n x n matmuls (2 n^3 FLOPs each)."""
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    best_s = min(timed_samples(lambda: torch.mm(a, b), device, 0, repeats + 1))
    return 2 * n ** 3 / best_s


def device_memory_bytes(device: torch.device, local_world_size: int) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 // local_world_size  # kB, shared by ranks
    raise ValueError("probe: /proc/meminfo has no MemTotal line")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            model = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")),
                         "unknown cpu")
    except OSError:
        model = "unknown cpu"
    return f"cpu rank ({model}, {torch.get_num_threads()} thread(s))"


def fit_link(points: List[Tuple[int, float]], fits: Dict[str, dict], name: str) -> Dict[str, float]:
    """alpha-beta link of one-way times; the fit (residuals, and whether the bandwidth was
    resolved at all) goes to `fits[name]`."""
    fit = fit_line([p[0] for p in points], [p[1] for p in points])
    fits[name] = fit.to_dict()
    return {"bandwidth_bytes_per_s": 1.0 / fit.beta, "latency_s": fit.alpha}


def allreduce_link(points: List[Tuple[int, float]], p: int, fits: Dict[str, dict],
                   name: str) -> Dict[str, float]:
    """Link alpha/bandwidth that make the ring formula 2(p-1) alpha + 2(p-1)/p bytes / bw
    reproduce the measured all-reduces of p ranks."""
    fit = fit_line([b for b, _ in points], [t for _, t in points])
    fits[name] = fit.to_dict()
    return {"bandwidth_bytes_per_s": (2 * (p - 1) / p) / fit.beta,
            "latency_s": fit.alpha / (2 * (p - 1))}


@contextlib.contextmanager
def process_group(env, timeout_s: float):
    """This rank's device and backend (CUDA + NCCL where there is a GPU, else CPU + Gloo) inside
    a default process group that is destroyed on the way out (probe and calibrate)."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", env.local_rank) if cuda else torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        yield device, backend
    finally:
        dist.destroy_process_group()


def probe(sizes_bytes: Sequence[int] = DEFAULT_SIZES, warmup: int = 2, repeats: int = 10,
          timeout_s: float = 60.0, name: Optional[str] = None,
          out: Optional[str] = None) -> Optional[dict]:
    """Measures the cluster this torchrun job runs on; rank 0 returns the Cluster dict and
    writes it to `out` atomically (if given), other ranks return None."""
    if len(set(sizes_bytes)) < 2 or min(sizes_bytes) < 4:
        raise ValueError(f"probe: sizes must hold at least two distinct sizes >= 4 bytes "
                         f"(got {list(sizes_bytes)})")
    env = rank_env()
    with process_group(env, timeout_s) as (device, backend):
        cluster = _measure(env, device, backend, sorted(set(sizes_bytes)), warmup, repeats, name)
    if env.rank != 0:
        return None
    if out:
        write_json(out, cluster)
    return cluster


def _measure(env: _Env, device, backend, sizes, warmup, repeats, name) -> dict:
    intra_pair = (0, 1) if env.local_world_size > 1 else None
    inter_pair = (0, env.local_world_size) if env.num_nodes > 1 else None
    # first use of a connection pays for its setup: exercise every path once, unmeasured
    time_allreduce(sizes[-1], device, 1, 1)
    for pair in filter(None, (intra_pair, inter_pair)):
        _time_pingpong(sizes[-1], *pair, env.rank, device, 1, 1)
    links, fits = {}, {}
    raw = {"allreduce_s": [], "intra_node_one_way_s": [], "inter_node_one_way_s": []}
    for level, pair in (("intra_node", intra_pair), ("inter_node", inter_pair)):
        if pair is None:
            continue
        points = [(n, _time_pingpong(n, *pair, env.rank, device, warmup, repeats))
                  for n in sizes]
        raw[f"{level}_one_way_s"] = points
        links[level] = fit_link(points, fits, level)
    raw["allreduce_s"] = [(n, time_allreduce(n, device, warmup, repeats)) for n in sizes]
    dist.barrier()
    flops = min_over_ranks(peak_flops(device), device)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    sources = [f"measured {date} by `torchrun --nnodes {env.num_nodes} --nproc_per_node "
               f"{env.local_world_size} -m hybridplan probe` ({backend}, sizes "
               f"{sizes[0]}..{sizes[-1]} bytes, median of {repeats}; least-squares "
               "alpha-beta fit of send/recv one-way times)"]
    for missing, copy_of in (("inter_node", "intra_node"), ("intra_node", "inter_node")):
        if missing not in links:
            links[missing] = dict(links[copy_of])
            sources.append(f"{missing} not measured (no such rank pair); copied from {copy_of}")
    return {
        "schema_version": 1, "kind": "hybridplan.cluster",
        "name": name or ("localhost-cpu" if device.type == "cpu" else "probed-cuda"),
        "num_nodes": env.num_nodes, "devices_per_node": env.local_world_size,
        "device": {"name": device_name(device),
                   "memory_bytes": device_memory_bytes(device, env.local_world_size),
                   "peak_flops": flops},
        "intra_node": links["intra_node"], "inter_node": links["inter_node"],
        "sources": sources,
        "measured": {"allreduce_ring_link": allreduce_link(raw["allreduce_s"], env.world_size,
                                                           fits, "allreduce"),
                     "world_size": env.world_size, "fits": fits,
                     **{k: [[n, t] for n, t in v] for k, v in raw.items() if v}},
    }


def write_json(path: str, doc: dict) -> None:
    write_text_atomic(path, json.dumps(doc, indent=2) + "\n")
