"""`python -m hybridplan`: the Python-side commands (the planner's commands are the C++
`hybridplan` binary).

    python -m hybridplan profile hybridplan.models:branchy_cnn --input-shape 8,3,32,32 --out g.json
    python -m hybridplan profile hybridplan.models:gnmt_lstm --batch-size 8 --out g.json
    torchrun --nproc_per_node 2 -m hybridplan probe --out cluster.json

Bad input exits 2 with a one-line message, as the C++ CLI does.
"""

import argparse
import importlib
import json
import sys
from typing import List, Optional, Sequence

EXIT_BAD_INPUT = 2


def _parse_shape(text: str) -> List[int]:
    try:
        shape = [int(d) for d in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers (got {text!r})")
    if not shape or any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(f"dimensions must be >= 1 (got {text!r})")
    return shape


def _parse_sizes(text: str) -> List[int]:
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated byte counts (got {text!r})")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hybridplan")
    sub = parser.add_subparsers(dest="command", required=True)

    prof = sub.add_parser("profile", help="profile a module into a Graph JSON")
    prof.add_argument("factory", metavar="MODULE:FACTORY",
                      help="a callable returning the nn.Module, e.g. hybridplan.models:branchy_cnn")
    prof.add_argument("--input-shape", type=_parse_shape, action="append", default=[],
                      help="shape of one positional input, e.g. 8,3,32,32 (repeat for more "
                           "inputs); default: the module's example_inputs(--batch-size)")
    prof.add_argument("--input-dtype", action="append", default=[],
                      help="dtype of each input (one for all, or one per --input-shape); "
                           "integer inputs hold random ids in [0, --int-high)")
    prof.add_argument("--int-high", type=int, default=2)
    prof.add_argument("--batch-size", type=int, default=8,
                      help="batch for the module's own example_inputs (without --input-shape)")
    prof.add_argument("--device", default="cpu")
    prof.add_argument("--warmup", type=int)  # default: hybridplan.profile's
    prof.add_argument("--repeats", type=int)
    prof.add_argument("--clock", default="auto", choices=("auto", "wall", "thread", "cuda"))
    prof.add_argument("--threads", type=int, help="torch.set_num_threads before profiling")
    prof.add_argument("--name", help="graph name (default: the factory's name)")
    prof.add_argument("--out", help="write the Graph JSON here (default: stdout)")
    prof.add_argument("--quiet", action="store_true", help="no progress output")

    probe = sub.add_parser("probe", help="measure links and devices into a Cluster JSON "
                                         "(run under torchrun)")
    probe.add_argument("--out", required=True, help="Cluster JSON path (rank 0 writes it)")
    probe.add_argument("--sizes", type=_parse_sizes,
                       help="message sizes in bytes, comma-separated")
    probe.add_argument("--warmup", type=int, default=2)
    probe.add_argument("--repeats", type=int, default=10)
    probe.add_argument("--timeout-s", type=float, default=60.0)
    probe.add_argument("--name", help="cluster name (default localhost-cpu / probed-cuda)")
    return parser


def _load_factory(spec: str):
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"profile: factory must be MODULE:FACTORY (got {spec!r})")
    try:
        obj = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"profile: cannot import {module_name!r} ({exc})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"profile: {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"profile: {spec} is not callable")
    return obj


def _example_inputs(args, module) -> tuple:
    import torch

    if not args.input_shape:
        if not hasattr(module, "example_inputs"):
            raise ValueError(f"profile: {type(module).__name__} has no example_inputs(); "
                             "give --input-shape")
        return tuple(module.example_inputs(args.batch_size))
    dtypes = args.input_dtype or ["float32"]
    if len(dtypes) not in (1, len(args.input_shape)):
        raise ValueError(f"profile: give one --input-dtype or one per --input-shape "
                         f"(got {len(dtypes)} for {len(args.input_shape)} inputs)")
    dtypes = dtypes * len(args.input_shape) if len(dtypes) == 1 else dtypes
    g = torch.Generator().manual_seed(0)
    inputs = []
    for shape, name in zip(args.input_shape, dtypes):
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"profile: --input-dtype {name!r} is not a torch dtype")
        if dtype.is_floating_point:
            inputs.append(torch.randn(shape, generator=g).to(dtype))
        else:
            inputs.append(torch.randint(0, args.int_high, shape, generator=g, dtype=dtype))
    return tuple(inputs)


def _profile(args) -> int:
    import torch

    from .profiler import profile_dict

    if args.threads:
        torch.set_num_threads(args.threads)
    factory = _load_factory(args.factory)
    module = factory()
    inputs = _example_inputs(args, module)
    name = args.name or args.factory.partition(":")[2].split(".")[-1]
    counts = {k: v for k, v in (("warmup", args.warmup), ("repeats", args.repeats)) if v is not None}
    graph = profile_dict(module, inputs, device=args.device, verbose=not args.quiet, name=name,
                         clock=args.clock, **counts)
    try:
        from .planner import Graph  # validates and writes the canonical JSON
    except ImportError:
        Graph = None
    if args.out:
        if Graph is not None:
            Graph.from_dict(graph, source=args.out).save(args.out)
        else:
            from .probe import _atomic_write_json
            _atomic_write_json(args.out, graph)
        if not args.quiet:
            print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(json.dumps(graph, indent=2))
    return 0


def _probe(args) -> int:
    from .probe import DEFAULT_SIZES, probe

    cluster = probe(sizes_bytes=args.sizes or DEFAULT_SIZES, warmup=args.warmup,
                    repeats=args.repeats, timeout_s=args.timeout_s, name=args.name,
                    out=args.out)
    if cluster is not None:
        intra = cluster["intra_node"]
        print(f"wrote {args.out}: intra_node latency {intra['latency_s'] * 1e6:.1f} us, "
              f"bandwidth {intra['bandwidth_bytes_per_s'] / 1e9:.3f} GB/s, peak "
              f"{cluster['device']['peak_flops'] / 1e9:.1f} GFLOP/s", file=sys.stderr)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"profile": _profile, "probe": _probe}[args.command](args)
    except ValueError as exc:
        print(f"python -m hybridplan {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
