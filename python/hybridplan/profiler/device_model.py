"""What one aten op costs on a device, from its shapes alone: the price list of the fake
profile (fake_profile), which runs a model without values.

    dm = device_model("dgx-h100")        # a preset, a cluster dict, "A100"/"H100", or "cpu"
    seconds = dm.op_s(func, args, kwargs, out)

Each op is priced by the kind of work it does (`op_s`):

- **matrix products** (mm, addmm, bmm, baddbmm): from_config's GEMM efficiency model
  (`gemm_time`: FLOPs at the device's achievable matmul rate for the operands' dtype, with
  tile and wave quantization on GPUs; never below its operands' bytes at memory bandwidth);
- **other counted FLOPs** (convolutions and their backward, fused attention):
  torch.utils.flop_counter's count at the same achievable rate (no tile model: a convolution
  runs as an implicit GEMM whose tiles the count does not see), or its bytes at memory
  bandwidth where that is longer;
- **convolutions and pooling on a CPU** (where measure_cpu measured them): a convolution's
  fixed cost a call (oneDNN's, about 70 us on the test host against a 2-3 us op floor; two for
  its backward) plus its FLOPs at the measured convolution rate; a pooling op's output
  elements x window x the measured cost per window element (NCHW pooling runs far below its
  bytes' bandwidth there). Elsewhere these are priced as the rules above and below;
- **a causal fused attention**: the counted FLOPs times the share of score blocks on or below
  the diagonal (causal_share), as FlashAttention and torch's CPU kernel skip the rest;
- **torch's CPU flash attention** (where measure_attention measured it): a fixed cost for each
  block of queries of each (batch, head) plus its computed FLOPs at the measured attention
  rate (about half the matmul rate on the test host, and 3-6 us a block);
- **everything else that runs a kernel**: the bytes its tensor inputs and outputs hold, at
  memory bandwidth (an embedding lookup: the rows it gathers, read and written); on a CPU
  where measure_step_bandwidth measured it, at most at the bandwidth such ops reach inside a
  training step (a fifth of a hot copy's on the test host);
- **views** (an op whose output aliases its input without writing it: view, transpose,
  expand, slice), allocations without a fill (empty) and queries that return no tensor
  (prim.device, sizes): nothing;
- every op that runs a kernel costs at least `kernel_floor_s`: a GPU kernel's launch, or on a
  CPU the eager dispatcher's fixed cost per op.

**Rates.** 16-bit operands on a GPU: the measured maximum achievable matmul FLOP/s of
from_config's table (MAMF). float32 on a GPU (torch's default keeps TF32 off for matmuls):
the datasheet FP32 peak x the same MAMF / peak fraction, an assumption (no float32 MAMF is
tabled). A cluster's GPU that the table lacks: its `peak_flops` x kDefaultAchievable, no tile
model. A CPU: `measure_cpu` times a float32 matmul, a copy and a one-element add on this
process's threads, or a calibrated cluster (`hybridplan calibrate`: device.peak_flops, the
fastest 512 x 512 float32 matmul; device.memory_bandwidth_bytes_per_s) gives them.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Dict, Tuple, Union

import torch
import torch.utils._python_dispatch
from torch import nn
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

from ..planner import load_cluster
from .block_timing import StepTimer
from .from_config import DEVICES, GemmDevice, gemm_time

__all__ = ["DeviceModel", "device_model", "measure_cpu"]

# Where a cluster's GPU is not in from_config's MAMF table: the achievable share of its peak
# (the table's A100 and H100 measure 0.87 and 0.80).
kDefaultAchievable = 0.8
# A GPU kernel launch as the presets' call_floor_s gives it, where a cluster has none.
kDefaultGpuFloorS = 5e-6
# Datasheet dense FP32 (non-tensor-core) FLOP/s of the table's GPUs (A100: 19.5 TFLOP/s;
# H100 SXM5: 67 TFLOP/s).
kFp32PeakFlops = {"A100": 19.5e12, "H100": 67e12}

_GEMMS = {"mm", "addmm", "bmm", "baddbmm", "_grouped_mm"}
_CONVOLUTIONS = {"convolution", "convolution_backward"}
_POOLING = {"max_pool2d_with_indices", "max_pool2d", "avg_pool2d", "max_pool1d",
            "avg_pool1d", "max_pool3d_with_indices", "avg_pool3d"}
_CPU_ATTENTION = {"_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_flash_attention_for_cpu_backward"}
_NO_KERNEL = {"empty", "empty_like", "empty_strided", "empty_permuted", "lift_fresh",
              "_unsafe_view",  # a view whose schema does not say so
              "_local_scalar_dense", "sym_size", "sym_stride", "sym_numel"}


@dataclasses.dataclass(frozen=True)
class DeviceModel:
    """A device's rates (see the module doc). `gemm` is from_config's GEMM model device: its
    mamf_flops the 16-bit achievable rate, its tile and SMs the quantization (a CPU: tile
    (1, 1) on one "SM", which makes the quantization factor 1)."""
    name: str
    gemm: GemmDevice
    fp32_flops: float          # achievable float32 matmul FLOP/s
    kernel_floor_s: float      # the least an op that runs a kernel costs
    source: str = ""
    # (working-set bytes, bytes/s) ascending, measured where caches make small working sets
    # faster than memory (a CPU); empty: gemm.memory_bandwidth at every size
    bandwidth_curve: Tuple[Tuple[int, float], ...] = ()
    # (forward, backward) seconds each graph node costs beyond its ops in an eager step (the
    # module call, its hooks, the autograd engine's visit); 0 where not measured
    node_overhead_s: Tuple[float, float] = (0.0, 0.0)
    # (FLOPs of one product, achieved float32 FLOP/s) ascending, measured where small products
    # run below the large ones' rate for want of tiles rather than waves (a CPU); empty: the
    # tile model alone
    matmul_curve: Tuple[Tuple[float, float], ...] = ()
    # convolutions where they run apart from the matmul rate (a CPU's oneDNN): (fixed seconds a
    # call, FLOP/s beyond it); (0, 0): at the matmul rate with the op floor
    convolution: Tuple[float, float] = (0.0, 0.0)
    # seconds per output element per window element of a pooling op, where pooling runs below
    # its bytes' bandwidth (a CPU's NCHW pooling); 0: its bytes at bandwidth
    window_s: float = 0.0
    # ((aten op name, seconds per element of its largest output), ...) measured where such
    # kernels run below their bytes' bandwidth (a CPU's normalisations, GeLU, softmax:
    # measure_kernels); empty: their bytes at bandwidth
    kernel_s: Tuple[Tuple[str, float], ...] = ()
    # bytes/s the ops priced by their bytes reach inside a training step, where they run below
    # a copy's rate in a tight loop (a CPU: measure_step_bandwidth); 0: the curve's alone
    step_bandwidth: float = 0.0
    # ((seconds a query block, FLOP/s beyond it) forward, (the same) backward) of a fused
    # attention kernel that runs far below the matmul rate with a fixed cost per block of
    # queries of each (batch, head) (torch's CPU flash attention: measure_attention); empty:
    # its FLOPs at the matmul rate
    attention: Tuple[Tuple[float, float], ...] = ()

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        return self.gemm.memory_bandwidth

    def memory_s(self, nbytes: float) -> float:
        """Seconds an op of a step takes to read and write `nbytes`: at the bandwidth curve's
        rate for that working set (log-log interpolation between its points, its end points
        beyond them; no curve: the memory bandwidth), or at step_bandwidth where measured and
        slower."""
        if nbytes <= 0:
            return 0.0
        rate = (_on_curve(self.bandwidth_curve, nbytes) if self.bandwidth_curve
                else self.gemm.memory_bandwidth)
        return nbytes / (min(rate, self.step_bandwidth) if self.step_bandwidth else rate)

    def matmul_flops(self, dtype: torch.dtype) -> float:
        """Achievable matmul FLOP/s for operands of `dtype`."""
        return self.fp32_flops if dtype.itemsize >= 4 else self.gemm.mamf_flops

    def gemm_s(self, m: int, n: int, k: int, count: int, dtype: torch.dtype) -> float:
        """`count` (m x k) @ (k x n) products: from_config.gemm_time at the dtype's rate."""
        rate = self.matmul_flops(dtype)
        if self.matmul_curve:
            rate = min(rate, _on_curve(self.matmul_curve, 2.0 * m * n * k))
        scale = rate / self.gemm.mamf_flops
        return gemm_time(m, n, k, self.gemm, count, scale, dtype.itemsize)

    def op_s(self, func: Any, args: tuple, kwargs: dict, out: Any) -> float:
        """Seconds of one aten op (an OpOverload) from its arguments' and outputs' shapes."""
        name = func.overloadpacket.__name__
        if name in _NO_KERNEL or _is_view(func) or not _tensor_bytes(out) and out is not None:
            return 0.0  # a view, an allocation, or a query of metadata (prim.device, sizes)
        if name in _GEMMS:
            seconds = self._gemm_op_s(name, args)
        elif name in _CONVOLUTIONS and self.convolution[1] > 0:
            floor_s, rate = self.convolution
            calls = 2 if name == "convolution_backward" else 1  # input and weight gradients
            seconds = max(calls * floor_s + op_flops(func, args, kwargs, out) / rate,
                          self.memory_s(_tensor_bytes((args, kwargs)) + _tensor_bytes(out)))
        elif name in _POOLING and self.window_s > 0:
            first = out[0] if isinstance(out, (tuple, list)) else out
            window = math.prod(int(v) for v in args[1]) if len(args) > 1 else 1
            seconds = max(first.numel() * window * self.window_s,
                          self.memory_s(_tensor_bytes(args[0]) + _tensor_bytes(out)))
        elif name in _CPU_ATTENTION and self.attention:
            seconds = self._attention_s(func, args, kwargs, out)
        elif name == "embedding":  # a gather reads the rows it returns, not the whole table
            seconds = self.memory_s(2 * _tensor_bytes(out) + _tensor_bytes(args[1]))
        else:
            nbytes = _tensor_bytes((args, kwargs)) + _tensor_bytes(out)
            seconds = self.memory_s(nbytes)
            per_element = dict(self.kernel_s).get(name) if self.kernel_s else None
            if per_element:
                seconds = max(seconds, _largest_numel(out) * per_element)
            flops = op_flops(func, args, kwargs, out) * self._causal_share(func, args, kwargs)
            if flops:
                seconds = max(seconds, flops / self.matmul_flops(_dtype_of(args, out)))
        return max(seconds, self.kernel_floor_s)

    def _attention_s(self, func: Any, args: tuple, kwargs: dict, out: Any) -> float:
        """A CPU flash attention forward or backward where measured (`attention`): a fixed cost
        for each block of queries of each (batch, head) (cpu_flash_blocks) plus its computed
        FLOPs (the causal share of flop_counter's count) at the measured attention rate."""
        names = [a.name for a in func._schema.arguments]
        q = args[names.index("query")]
        s_q, s_k = int(q.shape[-2]), int(args[names.index("key")].shape[-2])
        heads = math.prod(int(d) for d in q.shape[:-2])
        blocks = heads * -(-s_q // cpu_flash_blocks(s_q, s_k)[0])
        block_s, rate = self.attention[func.overloadpacket.__name__.endswith("_backward")]
        flops = op_flops(func, args, kwargs, out) * self._causal_share(func, args, kwargs)
        return max(blocks * block_s + flops / rate,
                   self.memory_s(_tensor_bytes((args, kwargs)) + _tensor_bytes(out)))

    def _causal_share(self, func: Any, args: tuple, kwargs: dict) -> float:
        """The share of a fused attention's counted FLOPs its kernel runs: 1, or under a causal
        mask the score blocks on or below the diagonal (causal_share), at FlashAttention's
        128 x 128 blocks on a GPU and the block sizes of torch's CPU flash attention kernel
        on a CPU. flop_counter counts every block, masked or not."""
        if "scaled_dot_product" not in func.overloadpacket.__name__:
            return 1.0
        names = [a.name for a in func._schema.arguments]
        if "is_causal" not in names:
            return 1.0
        i = names.index("is_causal")
        causal = kwargs.get("is_causal", args[i] if i < len(args) else False)
        if not causal:
            return 1.0
        q, k = args[names.index("query")], args[names.index("key")]
        s_q, s_k = int(q.shape[-2]), int(k.shape[-2])
        if self.gemm.sms > 1:
            return causal_share(s_q, s_k, kFlashBlock, kFlashBlock)
        return causal_share(s_q, s_k, *cpu_flash_blocks(s_q, s_k))

    def _gemm_op_s(self, name: str, args: tuple) -> float:
        count, m, n, k, dtype = _gemm_shape(name, args)
        if 0 in (count, m, n, k):
            return 0.0
        return self.gemm_s(m, n, k, count, dtype)


def _gemm_shape(name: str, args: tuple) -> Tuple[int, int, int, int, torch.dtype]:
    """(count, m, n, k, dtype) of a matrix product op: `count` (m x k) @ (k x n) products.

    `_grouped_mm` (a mixture of experts' grouped GEMM: each expert's rows, delimited by an
    offsets tensor, times that expert's weight) is taken as one product over all groups' rows
    together: its FLOPs are the same whatever the rows per expert, and the tile model sees one
    matrix, i.e. the load spread evenly with no expert's last tile partial. This is the
    assumption under which fake tensors, whose offsets have no values, can price it. Its four
    forms: (M, K) x (E, K, N) -> (M, N), the forward and the input gradient; (K, S) x (S, N)
    -> (E, K, N), the weight gradient (the grouped dimension is the contracted one);
    (E, M, K) x (K, N) -> (M, N); (E, M, K) x (E, K, N), a plain batch."""
    a, b = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
    if name == "_grouped_mm":
        if a.dim() == 2 and b.dim() == 2:
            (m, k), n, count = a.shape, b.shape[1], 1
        elif a.dim() == 2:
            (m, k), n, count = a.shape, b.shape[2], 1
        elif b.dim() == 2:
            m, k, n, count = a.shape[1], a.shape[2], b.shape[1], 1
        else:
            count, m, k = a.shape
            n = b.shape[2]
    elif a.dim() == 3:
        count, m, k = a.shape
        n = b.shape[-1]
    else:
        count, (m, k), n = 1, a.shape, b.shape[-1]
    return int(count), int(m), int(n), int(k), a.dtype


# FlashAttention's tile of queries and keys on a GPU (FlashAttention-2, head dim 128: 128 x
# 128 in its forward), the granularity at which a causal mask skips work.
kFlashBlock = 128


def cpu_flash_blocks(s_q: int, s_k: int) -> Tuple[int, int]:
    """(query, key) block sizes of torch's CPU flash attention kernel
    (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp: qSplitSize 256 from 768 queries, 64
    from 192, else 32; kvSplitSize 512, or the whole key length below it). Measured on this
    2-core host, one thread, 4 heads of 64: causal against unmasked ran 1.01x faster at 512
    tokens and 1.53x at 2048, where causal_share with these blocks gives 1.0x and 1.6x."""
    q_block = 256 if s_q >= 768 else 64 if s_q >= 192 else 32
    return q_block, (512 if s_k >= 512 else s_k)


def causal_share(s_q: int, s_k: int, q_block: int, k_block: int) -> float:
    """The share of the s_q x s_k score blocks a causal kernel computes: for each block of
    q_block queries, the key blocks up to its last query's position (the blocks wholly above
    the diagonal are skipped)."""
    computed = 0
    for first in range(0, s_q, q_block):
        last_query = min(s_q, first + q_block) + (s_k - s_q)  # keys it may attend to
        keys = min(s_k, -(-max(last_query, 0) // k_block) * k_block)
        computed += keys * (min(s_q, first + q_block) - first)
    return computed / (s_q * s_k)


def _on_curve(curve: Tuple[Tuple[float, float], ...], x: float) -> float:
    """The curve's value at x: log-log interpolation between its points, its end values
    beyond them."""
    if x <= curve[0][0]:
        return curve[0][1]
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x <= x1:
            w = math.log(x / x0) / math.log(x1 / x0)
            return math.exp((1 - w) * math.log(y0) + w * math.log(y1))
    return curve[-1][1]


def op_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> float:
    """torch.utils.flop_counter's FLOPs of one op (0 for ops it does not count). The counter
    has no entry for the CPU's fused attention; its flash-attention formulas count it."""
    name = func.overloadpacket.__name__
    if name == "_grouped_mm":  # not in flop_registry; uniform load (_gemm_shape)
        count, m, n, k, _ = _gemm_shape(name, args)
        return 2.0 * count * m * n * k
    if name == "_scaled_dot_product_flash_attention_for_cpu":
        return float(sdpa_flop_count(*(t.shape for t in args[:3])))
    if name == "_scaled_dot_product_flash_attention_for_cpu_backward":
        return float(sdpa_backward_flop_count(*(t.shape for t in args[:4])))
    formula = flop_registry.get(func.overloadpacket)
    return float(formula(*args, **kwargs, out_val=out)) if formula else 0.0


def _is_view(func: Any) -> bool:
    """An op whose outputs alias its inputs and that writes none of them."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                 for r in returns)


def _tensor_bytes(value: Any) -> int:
    """Bytes the tensors in `value` hold (an expanded tensor: its storage, not its view)."""
    if isinstance(value, torch.Tensor):
        full = value.numel() * value.element_size()
        try:
            return min(full, value.untyped_storage().nbytes())
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
            return full
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    return 0


def _largest_numel(value: Any) -> int:
    """Elements of the largest tensor in `value` (an op's outputs)."""
    if isinstance(value, torch.Tensor):
        return value.numel()
    if isinstance(value, (list, tuple)):
        return max((_largest_numel(v) for v in value), default=0)
    return 0


def _dtype_of(args: tuple, out: Any) -> torch.dtype:
    for v in (*args, out):
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            return v.dtype
    return torch.float32


def device_model(spec: Union[str, dict, DeviceModel, None] = "cpu") -> DeviceModel:
    """The DeviceModel named by `spec`: a DeviceModel as it is; "cpu" (or None): this CPU,
    measured now (measure_cpu); "A100" / "H100": from_config's table; a cluster preset name
    ("dgx-h100", hybridplan.load_cluster) or a cluster dict: from its device (from_cluster)."""
    if isinstance(spec, DeviceModel):
        return spec
    if spec is None or spec == "cpu":
        return measure_cpu()
    if isinstance(spec, dict):
        return from_cluster(spec)
    if isinstance(spec, str):
        if spec in DEVICES:
            return _from_table(spec, DEVICES[spec].memory_bandwidth, kDefaultGpuFloorS)
        try:
            cluster = load_cluster(spec)
        except (ValueError, FileNotFoundError, OSError) as exc:
            raise ValueError(f"device_model: {spec!r} is neither \"cpu\", a GPU of "
                             f"{sorted(DEVICES)} nor a cluster preset ({exc})") from None
        return from_cluster(cluster.to_dict())
    raise ValueError(f"device_model: device_model must be \"cpu\", a preset name, a cluster "
                     f"dict or a DeviceModel (got {type(spec).__name__})")


def _from_table(key: str, bandwidth: float, floor_s: float) -> DeviceModel:
    dev = dataclasses.replace(DEVICES[key], memory_bandwidth=bandwidth)
    fp32 = kFp32PeakFlops[key] * dev.mamf_flops / dev.peak_flops
    return DeviceModel(dev.name, dev, fp32, floor_s,
                       f"{dev.source}; float32: datasheet FP32 peak x the MAMF fraction")


def from_cluster(cluster: dict) -> DeviceModel:
    """The DeviceModel of a cluster's device (docs/formats.md "Cluster"): a GPU in
    from_config's table by its MAMF and tiles, another by peak_flops x kDefaultAchievable; a CPU
    by its calibrated peak_flops (a measured matmul rate) and memory bandwidth."""
    device = cluster.get("device", {})
    where = f"cluster {cluster.get('name', '?')!r}"
    name, kind = str(device.get("name", "")), device.get("type", "cuda")
    bandwidth = device.get("memory_bandwidth_bytes_per_s")
    peak = device.get("peak_flops")
    if not bandwidth or not peak:
        raise ValueError(f"device_model: {where} device.memory_bandwidth_bytes_per_s and "
                         f"device.peak_flops must be given (got {bandwidth!r}, {peak!r}); "
                         f"`hybridplan calibrate` measures both, or pass \"cpu\" to measure "
                         f"this CPU now")
    floor_s = device.get("call_floor_s")
    if kind == "cuda":
        for key in DEVICES:
            if name.upper().startswith(key):
                return _from_table(key, float(bandwidth), floor_s or kDefaultGpuFloorS)
        rate = float(peak) * kDefaultAchievable
        dev = GemmDevice(name, float(peak), rate, float(bandwidth), 1, (1, 1))
        return DeviceModel(name, dev, rate, floor_s or kDefaultGpuFloorS,
                           f"{where}: peak_flops x {kDefaultAchievable}, no tile model")
    dev = GemmDevice(name, float(peak), float(peak), float(bandwidth), 1, (1, 1))
    return DeviceModel(name, dev, float(peak), floor_s or measure_op_floor_s(),
                       f"{where}: calibrated peak_flops and memory bandwidth")


def _clock() -> Callable[[], float]:
    """This thread's CPU time where torch computes on this thread alone (one intra-op thread:
    other processes on a shared CPU then do not enter the figures), else the wall clock."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def _best_s(fn, repeats: int) -> float:
    clock = _clock()
    fn()
    times = []
    for _ in range(repeats):
        started = clock()
        fn()
        times.append(clock() - started)
    return min(times)


def measure_op_floor_s(repeats: int = 200) -> float:
    """The median time of an add of one-element tensors: the eager dispatcher's cost per op."""
    a, b = torch.ones(1), torch.ones(1)
    clock = _clock()
    _best_s(lambda: torch.add(a, b), 10)
    times = []
    for _ in range(repeats):
        started = clock()
        torch.add(a, b)
        times.append(clock() - started)
    return statistics.median(times)


# Working sets of the copies measure_cpu times (source and destination together): within a
# core's L2, within a shared L3, and far beyond any cache.
kCopyWorkingSets = (256 << 10, 4 << 20, 128 << 20)


# The square float32 products measure_cpu times: from a few cache-resident tiles to well past
# where the rate levels off.
kMatmulSizes = (64, 128, 256, 512, 1024)


def measure_cpu(repeats: int = 5) -> DeviceModel:
    """This CPU on this process's intra-op threads: the fastest float32 n x n matmul (2 n^3
    FLOPs) at each of kMatmulSizes (the matmul curve; the largest is the rate), the fastest
    copy at each of kCopyWorkingSets (bytes read and written over the time:
    the bandwidth curve; the largest is the memory bandwidth) and measure_op_floor_s. Timed on
    this thread's CPU clock with one intra-op thread, else the wall clock. About a second."""
    matmuls = []
    for n in kMatmulSizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        matmuls.append((2.0 * n ** 3, 2.0 * n ** 3 / _best_s(lambda: torch.mm(a, b), repeats)))
    rate = matmuls[-1][1]
    curve = []
    for working_set in kCopyWorkingSets:
        src = torch.empty(working_set // 8)
        dst = torch.empty_like(src)
        copies = max(1, (64 << 20) // working_set)  # long enough to time
        seconds = _best_s(lambda: [dst.copy_(src) for _ in range(copies)], repeats) / copies
        curve.append((working_set, working_set / seconds))
    floor_s = measure_op_floor_s()
    overhead = measure_node_overhead_s(floor_s)
    convolution = measure_convolution(repeats)
    window_s = measure_window_s(repeats)
    kernels = measure_kernels(repeats)
    attention = measure_attention(repeats)
    step_bandwidth = measure_step_bandwidth()
    dev = GemmDevice("cpu", rate, rate, curve[-1][1], 1, (1, 1))
    return DeviceModel(f"cpu ({torch.get_num_threads()} threads)", dev, rate, floor_s,
                       "measured: float32 matmul "
                       + ", ".join(f"{r / 1e9:.0f}" for _, r in matmuls)
                       + f" GFLOP/s at n = {', '.join(map(str, kMatmulSizes))}, copy "
                       + ", ".join(f"{b / 1e9:.1f} GB/s at {w >> 10} KiB" for w, b in curve)
                       + f", one-element add {floor_s * 1e6:.1f} us, per node "
                       f"{overhead[0] * 1e6:.0f} us forward, {overhead[1] * 1e6:.0f} us "
                       f"backward, convolution {convolution[0] * 1e6:.0f} us a call + "
                       f"{convolution[1] / 1e9:.0f} GFLOP/s, pooling {window_s * 1e9:.1f} ns "
                       f"per window element, "
                       + ", ".join(f"{op} {c * 1e9:.2f}" for op, c in kernels)
                       + " ns per element, flash attention "
                       + ", ".join(f"{b * 1e6:.1f} us a query block + {r / 1e9:.0f} GFLOP/s"
                                   for b, r in attention) + " (forward, backward), "
                       f"in a step {step_bandwidth / 1e9:.1f} GB/s",
                       tuple(curve), overhead, tuple(matmuls), convolution, window_s, kernels,
                       attention=attention, step_bandwidth=step_bandwidth)


# The convolutions measure_cpu times (batch, channels in = out, size; a 1 x 1 kernel): one that
# is all fixed cost, and one whose FLOPs dominate, small-channel as the CNN family's are.
kConvTiny = (16, 16, 2)
kConvWork = (16, 32, 16)


def measure_convolution(repeats: int = 5) -> Tuple[float, float]:
    """(fixed seconds a call, FLOP/s beyond it) of a float32 2-D convolution on this CPU: the
    fastest call of kConvTiny (32 kFLOP: its time is the fixed cost, oneDNN's work per call)
    and of kConvWork (8.4 MFLOP). Measured on the 2-core Xeon host: the fixed cost 66-110 us at
    every shape tried (a 1 x 1 convolution of 16 channels: 77 us at 2 x 2, 84 us at 8 x 8),
    where the one-element add costs 2-3 us; beyond it 58-64 GFLOP/s at kConvWork in four
    runs, where a matmul of the same implicit-GEMM shape runs at 120-160. The rate beyond
    the fixed cost depends on the working set more than this model says: 107-115 GFLOP/s at
    64 channels of 8 x 8, 22-74 at 64 of 16 x 16, 12-13 at 32 of 32 x 32 (batch 16 each)."""
    def conv_s(shape):
        batch, channels, size = shape
        x = torch.randn(batch, channels, size, size)
        w = torch.randn(channels, channels, 1, 1)
        return _best_s(lambda: torch.nn.functional.conv2d(x, w), repeats)
    fixed = conv_s(kConvTiny)
    batch, channels, size = kConvWork
    flops = 2.0 * batch * size * size * channels * channels
    return fixed, flops / max(conv_s(kConvWork) - fixed, 1e-9)


# The kernels measure_kernels times: (aten ops, the block that dispatches them forward and
# backward, its input's shape), at about 200 k elements (the model families' activations at
# batch 16 are 50-200 k).
kKernelBlocks = (
    (("native_layer_norm", "native_layer_norm_backward"),
     lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]), (64, 32, 96)),
    (("native_group_norm", "native_group_norm_backward"),
     lambda x: torch.nn.functional.group_norm(x, 4), (16, 32, 16, 16)),
    (("gelu", "gelu_backward"), torch.nn.functional.gelu, (16, 32, 384)),
    (("_softmax", "_softmax_backward_data"), lambda x: torch.softmax(x, -1), (512, 384)),
    (("_log_softmax", "_log_softmax_backward_data"),
     lambda x: torch.log_softmax(x, -1), (512, 384)),
)


class _KernelClock(torch.utils._python_dispatch.TorchDispatchMode):
    """Times the aten ops named in `ops` (this thread's clock where one intra-op thread)."""

    def __init__(self, ops):
        super().__init__()
        self.ops, self.times, self.clock = ops, {}, _clock()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        started = self.clock()
        out = func(*args, **(kwargs or {}))
        if name in self.ops:
            elapsed = self.clock() - started
            self.times[name] = min(self.times.get(name, math.inf),
                                   elapsed / max(1, _largest_numel(out)))
        return out


def measure_kernels(repeats: int = 5) -> Tuple[Tuple[str, float], ...]:
    """((aten op, seconds per element of its largest output), ...) of the kernels of
    kKernelBlocks, each the fastest of `repeats` forward and backward runs of its block. On the
    2-core Xeon host, op by op in a real step (bench_fake_profile --by-op), layer norm ran 5-7x
    its bytes at the copy bandwidth, GeLU 3-3.5x, log-softmax 3-4x: they compute per element
    (reductions, erf, exp) more than they move."""
    out = []
    for ops, block, shape in kKernelBlocks:
        x = torch.randn(shape, requires_grad=True)
        timer = _KernelClock(ops)
        for _ in range(repeats + 1):
            with timer:
                block(x).backward(torch.ones(shape))
            x.grad = None
        out += [(op, timer.times[op]) for op in ops if op in timer.times]
    return tuple(out)


# The training step measure_step_bandwidth times: (rows, width) of a pre-norm MLP block's
# activations (4 x wider inside), and its blocks. Its element-wise ops (residual adds, bias
# gradients' sums, gradient accumulation) move 16 KiB to 2 MiB each.
kStepShape = (256, 128)
kStepBlocks = 2
# The ops of that step that measure_step_bandwidth leaves out: priced by other rules
# (GEMMs, measured kernels) or each a few bytes (below kStepOpBytes, where the floor prices it).
kStepOpBytes = 16 << 10


class _BytesClock(torch.utils._python_dispatch.TorchDispatchMode):
    """Sums the time (_clock) and the bytes (inputs and outputs) of the ops `priced_by_bytes`
    accepts."""

    def __init__(self, priced_by_bytes):
        super().__init__()
        self.accept, self.seconds, self.bytes, self.clock = priced_by_bytes, 0.0, 0, _clock()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        started = self.clock()
        out = func(*args, **kwargs)
        elapsed = self.clock() - started
        nbytes = _tensor_bytes((args, kwargs)) + _tensor_bytes(out)
        if self.accept(func) and nbytes >= kStepOpBytes:
            self.seconds += elapsed
            self.bytes += nbytes
        return out


def measure_step_bandwidth(steps: int = 7) -> float:
    """Bytes/s of the ops a device model prices by their bytes (op_s's last rule: not a
    product, convolution, pooling, measured kernel or view), timed inside training steps of
    kStepBlocks pre-norm MLP blocks at kStepShape: their bytes over their time, the median of
    `steps` steps after one warm-up. On the 2-core Xeon host such ops (adds, sums, clones,
    copies) ran at 8-10 GB/s inside the model families' steps, whatever their size from about
    100 to 600 KiB, where a copy of the same working set in a tight loop runs at 50-60 GB/s
    (this step measured 5-12 GB/s across runs under load): in a step each op finds its
    operands, and fresh output memory, outside the core's nearest caches."""
    blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(kStepShape[1]),
                                         nn.Linear(kStepShape[1], 4 * kStepShape[1]), nn.GELU(),
                                         nn.Linear(4 * kStepShape[1], kStepShape[1]))
                           for _ in range(kStepBlocks))
    x = torch.randn(kStepShape, requires_grad=True)
    measured = {name for ops, _, _ in kKernelBlocks for name in ops}

    def priced_by_bytes(func) -> bool:
        name = func.overloadpacket.__name__
        return not (name in _GEMMS or name in _NO_KERNEL or name in measured or _is_view(func))

    rates = []
    for step in range(steps + 1):
        timer = _BytesClock(priced_by_bytes)
        with timer:
            h = x
            for block in blocks:
                h = h + block(h)
            h.square().mean().backward()
        x.grad = None
        blocks.zero_grad(set_to_none=True)
        if step and timer.seconds > 0:
            rates.append(timer.bytes / timer.seconds)
    return statistics.median(rates)


# The attentions measure_attention times ((batch, heads, tokens, head width), causal): one that
# is all fixed cost (a single block of queries for each of 16 heads) and one whose FLOPs
# dominate (8 blocks of 64 queries each for 4 heads of 64).
kAttentionTiny = (4, 4, 32, 32)
kAttentionWork = (1, 4, 512, 64)


def measure_attention(repeats: int = 5) -> Tuple[Tuple[float, float], ...]:
    """((seconds a query block, FLOP/s beyond it) forward, (the same) backward) of torch's CPU
    flash attention kernel (aten._scaled_dot_product_flash_attention_for_cpu), unmasked, the
    fastest of `repeats` runs: the time of kAttentionTiny over its blocks (cpu_flash_blocks), and
    kAttentionWork's FLOPs (flop_counter's) over its time less its blocks' fixed cost. Measured
    on the 2-core Xeon host, one thread, fixed cost + FLOPs at this rate held within 12 % from
    (16, 4, 32, 24) to (2, 8, 512, 64), the forward 5.6-5.8 us a block + 75-80 GFLOP/s and the
    backward 9.6-10.6 us a block + 77-80 GFLOP/s, where the matmul runs at 150-160: at the
    transformer family's 24-wide heads the kernel ran 4-6x its FLOPs at the matmul rate."""
    forward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default

    def times(shape):
        q, k, v = (torch.randn(shape) for _ in range(3))
        out, lse = forward(q, k, v, 0.0, False)
        grad = torch.randn_like(out)
        blocks = math.prod(shape[:2]) * -(-shape[2] // cpu_flash_blocks(shape[2], shape[2])[0])
        return (blocks, _best_s(lambda: forward(q, k, v, 0.0, False), repeats),
                _best_s(lambda: backward(grad, q, k, v, out, lse, 0.0, False), repeats),
                sdpa_flop_count(q.shape, k.shape, v.shape),
                sdpa_backward_flop_count(grad.shape, q.shape, k.shape, v.shape))

    tiny, work = times(kAttentionTiny), times(kAttentionWork)
    out = []
    for i in (1, 2):
        block_s = tiny[i] / tiny[0]
        out.append((block_s, work[i + 2] / max(work[i] - work[0] * block_s, 1e-9)))
    return tuple(out)


def measure_window_s(repeats: int = 5) -> float:
    """Seconds per output element per window element of a 3 x 3 max pooling (stride 1) on a
    (16, 32, 8, 8) float32 tensor. On the 2-core Xeon host: 32-33 ns an output element at 8 x 8
    to 32 x 32 (3.6 ns a window element), where its bytes at the copy bandwidth take under
    1 ns."""
    x = torch.randn(16, 32, 8, 8)
    seconds = _best_s(lambda: torch.nn.functional.max_pool2d(x, 3, 1, 1), repeats)
    return seconds / (x.numel() * 9)


# A Linear(8, 8) at batch 1 runs one kernel forward (addmm) and three backward (two matrix
# products and the bias gradient's sum), each at the floor: the rest of its time is the node's.
kTinyNodeOps = (1, 3)


def measure_node_overhead_s(floor_s: float, nodes: int = 16, steps: int = 20
                            ) -> Tuple[float, float]:
    """(forward, backward) seconds a graph node costs beyond its ops, as the real profiler
    sees it: the median per-node times (block_timing.StepTimer, this thread's clock) of a chain
    of `nodes` Linear(8, 8) at batch 1, less kTinyNodeOps op floors each."""
    chain = nn.Sequential(*[nn.Linear(8, 8) for _ in range(nodes)])
    names = {str(i): mod for i, mod in enumerate(chain)}
    timer = StepTimer(chain, names, "thread" if torch.get_num_threads() == 1 else "wall")
    x = torch.randn(1, 8)
    forward, backward = [], []
    try:
        for step in range(steps + 2):
            f, b = timer.step((x,))
            if step >= 2:  # two warm-up steps
                forward += f.values()
                backward += b.values()
    finally:
        timer.remove()
    return (max(0.0, statistics.median(forward) - kTinyNodeOps[0] * floor_s),
            max(0.0, statistics.median(backward) - kTinyNodeOps[1] * floor_s))


def describe(dm: DeviceModel) -> Dict[str, Any]:
    """The rates as a dict (logs and bench tables)."""
    return {"name": dm.name, "matmul_flops_16bit": dm.gemm.mamf_flops,
            "matmul_flops_fp32": dm.fp32_flops,
            "memory_bandwidth_bytes_per_s": dm.gemm.memory_bandwidth,
            "kernel_floor_s": dm.kernel_floor_s, "sms": dm.gemm.sms, "tile": list(dm.gemm.tile),
            "source": dm.source}
