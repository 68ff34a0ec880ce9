"""Does each trainer read what `python -m hybridplan export` writes as hybridplan meant it?
Every file is loaded with the trainer's own configuration code, not checked by eye:

    torchtitan   ConfigManager().parse_args(["--job.config_file", F]) (its JobConfig), then
                 ParallelDims (its degree checks against the world size), torch's
                 get_schedule_class for the schedule, and generate_llm_fqn_per_model_part
                 for which layers each pipeline stage holds
    Megatron-LM  megatron.training.arguments parse_args + validate_args (Megatron-LM's own
                 argument checks, with WORLD_SIZE set as torchrun sets it), then
                 core_transformer_config_from_args (Megatron-Core's TransformerConfig and its
                 ModelParallelConfig checks)
    DeepSpeed    deepspeed.runtime.config.DeepSpeedConfig(F, mpu) (its batch, ZeRO, bf16 and
                 AutoTP checks; mpu gives the data-parallel size as a pipeline or AutoTP engine
                 would), and deepspeed.runtime.utils.partition_uniform for the stages
    Accelerate   `accelerate launch --config_file F`'s own argument handling
                 (launch_command_parser, _validate_launch_command, prepare_multi_gpu_env), then
                 FullyShardedDataParallelPlugin and ParallelismConfig built from the environment
                 the launcher sets, as the training script's Accelerator builds them

For two models (a GPT-2 and a Llama-like configuration; graphs from graph_from_config) on
eight devices of dgx-h100, the planner's best plan of each kind a trainer names (data
parallel, ZeRO-2, ZeRO-3, HSDP, tensor parallel, each pipeline schedule, pipeline with tensor
parallelism, full and selective recompute) is exported; the trainer's parser loads it; the
degrees, batch, schedule, sharding and recompute the trainer read are compared with what
hybridplan reads back (trainers.parse), and the plan read back (trainers.plan_from) with the
plan exported, as far as the trainer can express it (test_trainers.py's rule). The layers each
pipeline stage holds are compared with the trainer's own split function where it has one.

    python3 bench/bench_trainer_parsers.py [--venv DIR] [--megatron-lm DIR] [--quick]
                                           [--out-dir out/bench/trainer_parsers]

The trainers run in a virtual environment of their own (--venv, default ../trainer-venv beside
the checkout), created with --system-site-packages so it sees the system torch, and filled with
`pip install --no-deps` of the pinned trainer packages and the few small packages their
configuration code imports (PINS, EXTRAS): no pip run here can replace torch, and the venv's
torch is checked to be the system's. Megatron-LM's training code (megatron/training, where its
arguments live, and megatron/legacy, which it imports) is not on PyPI: --megatron-lm names a
checkout of NVIDIA's Megatron-LM at tag core_v0.16.1, the megatron-core pinned here (default
../megatron-lm beside the checkout); without one the Megatron rows fail and say so. Exits 1
when a parser rejects a file or reads it differently (benchmarks/trainers-2026-12-06.md).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# the trainer packages, pinned (each installed with --no-deps)
# (Megatron-Core 0.17 and later need Python 3.12; torchtitan 0.2 is the last with TOML files)
PINS = {"torchtitan": "torchtitan==0.2.2", "megatron": "megatron-core==0.16.1",
        "deepspeed": "deepspeed==0.19.8", "accelerate": "accelerate==1.15.0"}
# what their configuration code imports beyond the system's packages, each --no-deps as well:
# pure Python but psutil and msgpack (small self-contained wheels DeepSpeed imports at start)
EXTRAS = ["tyro", "docstring-parser", "typeguard", "shtab", "hjson", "einops", "psutil",
          "msgpack"]
# to build DeepSpeed's source distribution without build isolation
BUILD = ["wheel"]
DISTRIBUTIONS = {"torchtitan": "torchtitan", "megatron": "megatron-core",
                 "deepspeed": "deepspeed", "accelerate": "accelerate"}


# ---- the virtual environment -------------------------------------------------------------------

def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(venv: Path) -> None:
    """Create the venv (seeing the system's torch) and install what is missing, --no-deps."""
    py = venv_python(venv)
    if not py.exists():
        print(f"creating {venv} (--system-site-packages)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                       check=True)
    missing = []
    for spec in BUILD + list(PINS.values()) + EXTRAS:
        name, _, version = spec.partition("==")
        code = ("import importlib.metadata as m, sys; v = m.version(sys.argv[1]); "
                "sys.exit(0 if not sys.argv[2] or v == sys.argv[2] else 1)")
        if subprocess.run([str(py), "-c", code, name, version],
                          capture_output=True).returncode != 0:
            missing.append(spec)
    for group in ([m for m in missing if m in BUILD], [m for m in missing if m not in BUILD]):
        if not group:
            continue
        print(f"pip install --no-deps {' '.join(group)}", flush=True)
        # DeepSpeed ships a source distribution: build it against the system torch (no build
        # isolation, which would fetch a torch of its own), without its CUDA ops
        env = dict(os.environ, DS_BUILD_OPS="0")
        done = subprocess.run([str(py), "-m", "pip", "install", "--no-deps",
                               "--no-build-isolation", *group], env=env,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"bench_trainer_parsers: pip install failed:\n"
                             f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    torch_here = subprocess.run([str(py), "-c", "import torch; print(torch.__version__)"],
                                capture_output=True, text=True).stdout.strip()
    import torch
    if torch_here != torch.__version__:
        raise SystemExit(f"bench_trainer_parsers: {venv} has torch {torch_here!r}, not the "
                         f"system's {torch.__version__}: remove that venv")
    print(f"venv {venv}: torch {torch_here} (the system's)", flush=True)


# ---- the files (run by the venv's python: hybridplan from this checkout) ------------------------

def models(quick: bool) -> dict:
    from hybridplan.profiler.from_config import TransformerConfig
    if quick:   # tests/python/test_trainers.py's sizes
        return {"gpt2": TransformerConfig("gpt2-like", layers=4, hidden=256, heads=8,
                                          seq_len=256, vocab=1000),
                "llama": TransformerConfig("llama-like", layers=4, hidden=256, heads=8,
                                           seq_len=256, vocab=32000, ffn_hidden=688)}
    # GPT-2 (124M: Radford et al. 2019) and Llama 3.2 1B's dimensions (16 layers, hidden 2048,
    # 32 heads, MLP 8192, vocabulary 128256), both at sequence 1024
    return {"gpt2": TransformerConfig("gpt2", layers=12, hidden=768, heads=12, seq_len=1024,
                                      vocab=50257),
            "llama": TransformerConfig("llama-3.2-1b-like", layers=16, hidden=2048, heads=32,
                                       seq_len=1024, vocab=128256, ffn_hidden=8192)}


def _layer_stages(plan) -> list:
    """Layer i -> the pipeline stage (virtual stage index) its nodes run on."""
    import re
    stages = {}
    for a in plan.to_dict()["assignment"]:
        m = re.search(r"(?:^|\.)layers\.(\d+)\.", a["name"])
        if m:
            stages.setdefault(int(m.group(1)), a["device"])
    return [stages[i] for i in sorted(stages)]


def write_files(out: Path, quick: bool, devices: int) -> list:
    """Export every kind of plan for every trainer; [manifest entry]."""
    from hybridplan import planner, trainers
    from hybridplan.planner import Cluster, Graph
    from hybridplan.profiler.from_config import graph_from_config
    from trainer_plans import JOB as job, layout_of_layout, layout_of_plan, plan_kinds

    cluster = Cluster.preset("dgx-h100")
    entries = []
    suffix = {"torchtitan": "toml", "megatron": "args", "deepspeed": "json",
              "accelerate": "yaml"}
    for model, cfg in models(quick).items():
        g = Graph.from_dict(graph_from_config(cfg, device="H100"), model)
        t0 = time.monotonic()
        kinds = plan_kinds(g, cluster, job, devices)
        print(f"{model}: {len(kinds)} plans searched in {time.monotonic() - t0:.1f} s",
              flush=True)
        for trainer in sorted(trainers.TRAINERS):
            for kind, plan in kinds.items():
                text, unexpressed = trainers.export(plan, trainer, g, job)
                reduced = trainers.reduce(plan, trainer, g, job)
                path = out / model / f"{trainer}-{kind}.{suffix[trainer]}"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                entry = {"trainer": trainer, "model": model, "kind": kind, "file": str(path),
                         "model_config": {"layers": cfg.layers, "hidden": cfg.hidden,
                                          "heads": cfg.heads, "seq_len": cfg.seq_len,
                                          "vocab": cfg.vocab, "ffn": cfg.ffn},
                         "unexpressed": unexpressed, "lost_axes": reduced.lost_axes}
                try:
                    layout = trainers.parse(trainer, text, g, source=str(path))
                    back = trainers.plan_from(trainer, text, g, cluster, job, source=str(path))
                except (ValueError, planner.InfeasibleError) as e:
                    entry["hybridplan_error"] = str(e)
                    entries.append(entry)
                    continue
                entry["layout"] = layout.to_dict()
                expected = layout_of_layout(reduced.layout)
                entry["round_trip"] = (layout_of_plan(back) == expected and (
                    bool(unexpressed) or layout_of_plan(back) == layout_of_plan(plan)))
                entry["round_trip_detail"] = {"back": layout_of_plan(back),
                                              "expected": expected}
                if back.mode == "pipeline":
                    entry["layer_stages"] = _layer_stages(back)
                entries.append(entry)
    return entries


# ---- the trainers' own parsers (each in its own venv process) ----------------------------------

def _compare(read: dict, layout: dict) -> list:
    """The fields where the trainer read something else than hybridplan did."""
    return [f"{k}: trainer read {v!r}, hybridplan {layout[k]!r}" for k, v in read.items()
            if layout.get(k) != v]


def _torchtitan_modules():
    """torchtitan's config package and ParallelDims, imported without torchtitan/__init__.py:
    that imports its MoE Triton kernels, and Triton does not come with a CPU torch. The
    config and parallel-dims modules themselves import no kernel."""
    import importlib.util
    import types
    if "torchtitan" not in sys.modules:
        spec = importlib.util.find_spec("torchtitan")
        package = types.ModuleType("torchtitan")
        package.__path__ = list(spec.submodule_search_locations)
        package.__spec__ = spec
        sys.modules["torchtitan"] = package
    from torchtitan.config import ConfigManager
    from torchtitan.distributed.parallel_dims import ParallelDims
    return ConfigManager, ParallelDims


@functools.lru_cache(maxsize=None)
def _torchtitan_split_function():
    """torchtitan's own generate_llm_fqn_per_model_part, its source taken from the installed
    torchtitan/distributed/pipeline_parallel.py and run alone (that module imports the Triton
    kernels too)."""
    import ast
    import importlib.util
    import typing
    spec = importlib.util.find_spec("torchtitan")
    path = Path(spec.submodule_search_locations[0]) / "distributed" / "pipeline_parallel.py"
    tree = ast.parse(path.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef)
              and n.name == "generate_llm_fqn_per_model_part")
    namespace = dict(vars(typing))
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[fn.name]


def check_torchtitan(e: dict) -> dict:
    import math

    from torch.distributed.pipelining.schedules import (PipelineScheduleSingle,
                                                        get_schedule_class)
    ConfigManager, ParallelDims = _torchtitan_modules()
    lay = e["layout"]
    cfg = ConfigManager().parse_args(["--job.config_file", e["file"]])
    par, train = cfg.parallelism, cfg.training
    # its own degree checks (the degrees multiply to the world size, ...)
    dims = ParallelDims(dp_shard=par.data_parallel_shard_degree,
                        dp_replicate=par.data_parallel_replicate_degree, cp=1,
                        tp=par.tensor_parallel_degree, pp=par.pipeline_parallel_degree,
                        ep=1, etp=1, world_size=lay["world_size"])
    read = {"dp_replicate": dims.dp_replicate, "dp_shard": dims.dp_shard, "tp": dims.tp,
            "pp": dims.pp, "recompute": cfg.activation_checkpoint.mode}
    # torchtitan's train.py: global batch = local batch x dp x gradient accumulation steps
    dp = dims.dp_replicate * dims.dp_shard
    if train.global_batch_size % (train.local_batch_size * dp):
        raise ValueError(f"global_batch_size {train.global_batch_size} is not a multiple of "
                         f"local_batch_size x dp = {train.local_batch_size * dp}")
    read["global_batch"] = train.global_batch_size
    notes = []
    if dims.pp > 1:
        # torchtitan's pipeline_llm: the stage count, its checks, then the split
        schedule = get_schedule_class(par.pipeline_parallel_schedule)
        single = issubclass(schedule, PipelineScheduleSingle)
        L = e["model_config"]["layers"]
        first, last = (par.pipeline_parallel_first_stage_less_layers,
                       par.pipeline_parallel_last_stage_less_layers)
        if par.pipeline_parallel_layers_per_stage is not None:
            stages = math.ceil((L + first + last) / par.pipeline_parallel_layers_per_stage)
            if stages % dims.pp:
                raise ValueError(f"{stages} virtual stages do not divide over pp {dims.pp}")
            if (stages // dims.pp != 1) if single else (stages // dims.pp < 2):
                raise ValueError(f"{stages // dims.pp} stages per rank for "
                                 f"{schedule.__name__}")
        else:
            stages = dims.pp * (1 if single else 2)
        read["virtual_stages"] = stages // dims.pp
        read["micro_batch"] = par.pipeline_parallel_microbatch_size
        read["num_microbatches"] = train.local_batch_size // par.pipeline_parallel_microbatch_size
        parts = _torchtitan_split_function()(stages, L, first, last)
        split = [next(k for k, names in enumerate(parts) if f"layers.{i}" in names)
                 for i in range(L)]
        if split != e["layer_stages"]:
            notes.append(f"stage split: torchtitan {split}, hybridplan {e['layer_stages']}")
        notes.append(f"{schedule.__name__}")
    return {"parser": "ConfigManager + ParallelDims", "read": read, "notes": notes}


@functools.lru_cache(maxsize=None)
def _megatron_arguments(megatron_lm: str):
    """Megatron-LM's megatron.training.arguments from the checkout, imported without
    megatron/training/__init__.py (it imports the training loop, whose batch-invariant kernels
    need Triton): the package gets the accessors of its global_vars, which is what arguments.py
    takes from it. validate_args asks torch.cuda for the GPU's architecture to decide whether
    CUDA_DEVICE_MAX_CONNECTIONS=1 is required: answered as Hopper (9, the H100s planned for)."""
    import types
    sys.path.insert(0, megatron_lm)
    package = types.ModuleType("megatron.training")
    package.__path__ = [str(Path(megatron_lm) / "megatron" / "training")]
    sys.modules["megatron.training"] = package
    import megatron.training.global_vars as global_vars
    for name in dir(global_vars):
        if name.startswith(("get_", "set_")):
            setattr(package, name, getattr(global_vars, name))
    import megatron.training.arguments as arguments
    arguments.get_device_arch_version = lambda: 9
    return arguments


def check_megatron(e: dict, megatron_lm: str) -> dict:
    import shlex
    lay, m = e["layout"], e["model_config"]
    text = Path(e["file"]).read_text()
    words = " ".join(ln.split("#", 1)[0].rstrip().rstrip("\\") for ln in text.splitlines())
    model_args = ["--num-layers", str(m["layers"]), "--hidden-size", str(m["hidden"]),
                  "--num-attention-heads", str(m["heads"]), "--seq-length", str(m["seq_len"]),
                  "--max-position-embeddings", str(m["seq_len"]),
                  "--ffn-hidden-size", str(m["ffn"]), "--lr", "1e-4", "--train-iters", "10"]
    os.environ.update(WORLD_SIZE=str(lay["world_size"]), RANK="0")
    # the launch environment the file's header asks for
    if "CUDA_DEVICE_MAX_CONNECTIONS=1" in text:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    else:
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    if not megatron_lm:
        raise ImportError("no Megatron-LM checkout (--megatron-lm): its arguments unchecked")
    arguments = _megatron_arguments(megatron_lm)
    sys.argv = ["pretrain_gpt.py", *model_args, *shlex.split(words)]
    args = arguments.parse_args()
    arguments.validate_args(args)
    config = arguments.core_transformer_config_from_args(args)   # Megatron-Core's checks
    sharding = "none"
    if getattr(args, "use_megatron_fsdp", False):
        sharding = "zero3"
    elif args.use_distributed_optimizer:
        sharding = "zero2"
    read = {"tp": config.tensor_model_parallel_size, "pp": config.pipeline_model_parallel_size,
            "dp": args.data_parallel_size,
            "virtual_stages": config.virtual_pipeline_model_parallel_size or 1,
            "micro_batch": args.micro_batch_size, "global_batch": args.global_batch_size,
            "recompute": config.recompute_granularity or "none",
            "sequence_parallel": bool(config.sequence_parallel),
            "precision": "bf16" if config.bf16 else "fp32", "sharding": sharding}
    if sharding != "none":
        # the distributed optimizer's instances are the replicate groups (HSDP)
        read["dp_replicate"] = getattr(args, "num_distributed_optimizer_instances", 1)
    return {"parser": "Megatron-LM parse_args + validate_args, Megatron-Core TransformerConfig",
            "read": read, "notes": []}


def check_deepspeed(e: dict) -> dict:
    import torch.distributed as tdist
    lay = e["layout"]
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    import deepspeed
    from deepspeed.runtime.config import DeepSpeedConfig
    if not tdist.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)

    class Mpu:
        """The data-parallel size a pipeline (PipelineModule's topology) or AutoTP engine gives
        DeepSpeedConfig: the ranks that hold different batches."""
        def get_data_parallel_world_size(self):
            return lay["dp"]

        def get_data_parallel_rank(self):
            return 0

        def get_model_parallel_world_size(self):
            return lay["tp"] * lay["pp"]

        def get_model_parallel_rank(self):
            return 0

    cfg = DeepSpeedConfig(e["file"], mpu=Mpu())
    stage = cfg.zero_optimization_stage
    read = {"global_batch": cfg.train_batch_size,
            "sharding": {0: "none", 1: "zero2", 2: "zero2", 3: "zero3"}[int(stage)],
            "precision": "bf16" if cfg.bfloat16_config.enabled else "fp32"}
    tp = getattr(cfg.tensor_parallel_config, "autotp_size", 0) or 1
    read["tp"] = tp
    if lay["pp"] > 1:
        read["num_microbatches"] = cfg.gradient_accumulation_steps
        read["micro_batch"] = cfg.train_micro_batch_size_per_gpu
    notes = []
    if lay["pp"] > 1:
        from deepspeed.runtime.utils import partition_uniform
        L = e["model_config"]["layers"]
        bounds = partition_uniform(num_items=L + 2, num_parts=lay["pp"])  # [emb, layers, head]
        split = [next(s for s in range(lay["pp"]) if bounds[s] <= i + 1 < bounds[s + 1])
                 for i in range(L)]
        if split != e["layer_stages"]:
            notes.append(f"stage split: DeepSpeed {split}, hybridplan {e['layer_stages']}")
    return {"parser": "DeepSpeedConfig", "read": read, "notes": notes}


def check_accelerate(e: dict) -> dict:
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env
    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", e["file"], "train.py"])
    args, defaults, mp_from_config_flag = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    os.environ.update(env)
    read = {"world_size": args.num_processes,
            "precision": "bf16" if args.mixed_precision == "bf16" else "fp32"}
    notes = []
    if args.use_fsdp:
        from accelerate.utils import FullyShardedDataParallelPlugin
        plugin = FullyShardedDataParallelPlugin()
        read["sharding"] = "zero3" if plugin.reshard_after_forward else "zero2"
        read["recompute"] = "full" if plugin.activation_checkpointing else "none"
        notes.append(f"FSDP{plugin.fsdp_version}")
        try:
            from accelerate.parallelism_config import ParallelismConfig
            pc = ParallelismConfig.from_env() if hasattr(ParallelismConfig, "from_env") \
                else ParallelismConfig()
            read.update(dp_replicate=pc.dp_replicate_size, dp_shard=pc.dp_shard_size,
                        tp=pc.tp_size)
            if pc.total_size != args.num_processes:
                raise ValueError(f"ParallelismConfig's total size {pc.total_size} is not "
                                 f"num_processes {args.num_processes}")
        except ImportError:
            notes.append("no ParallelismConfig in this Accelerate")
    return {"parser": "accelerate launch's argument handling, FullyShardedDataParallelPlugin, "
                      "ParallelismConfig", "read": read, "notes": notes}


def run_check(trainer: str, entry: dict, megatron_lm: str) -> dict:
    try:
        if trainer == "torchtitan":
            out = check_torchtitan(entry)
        elif trainer == "megatron":
            out = check_megatron(entry, megatron_lm)
        elif trainer == "deepspeed":
            out = check_deepspeed(entry)
        else:
            out = check_accelerate(entry)
    except BaseException as e:  # the trainer's rejection (assert, ValueError, SystemExit, ...)
        return {"loaded": False, "error": f"{type(e).__name__}: {str(e)[:400]}"}
    out["loaded"] = True
    out["mismatches"] = _compare(out["read"], entry["layout"])
    return out


# ---- the report ----------------------------------------------------------------------------------

def versions(py: Path) -> dict:
    code = ("import importlib.metadata as m, json, sys; "
            "print(json.dumps({d: m.version(d) for d in sys.argv[1:]}))")
    done = subprocess.run([str(py), "-c", code, *DISTRIBUTIONS.values()], capture_output=True,
                          text=True)
    return json.loads(done.stdout) if done.returncode == 0 else {}


def report(entries: list, results: dict, vers: dict) -> tuple:
    rows, bad = [], 0
    summary = {}
    for e in entries:
        key = (e["trainer"], e["model"])
        r = results.get(f"{e['trainer']}/{e['model']}/{e['kind']}", {})
        loaded = r.get("loaded", False)
        same_read = loaded and not r.get("mismatches") and not any(
            n.startswith("stage split") for n in r.get("notes", []))
        rt = e.get("round_trip", False)
        s = summary.setdefault(key, {"n": 0, "loaded": 0, "read": 0, "rt": 0, "parser": ""})
        s["n"] += 1
        s["loaded"] += loaded
        s["read"] += same_read
        s["rt"] += rt
        s["parser"] = r.get("parser", s["parser"])
        if not (loaded and same_read and rt):
            bad += 1
        why = r.get("error") or "; ".join(r.get("mismatches", []) + [
            n for n in r.get("notes", []) if n.startswith("stage split")]) or \
            e.get("hybridplan_error", "")
        rows.append(f"| {e['trainer']} | {e['model']} | {e['kind']} | "
                    f"{Path(e['file']).name} | {'yes' if loaded else 'NO'} | "
                    f"{'yes' if same_read else 'NO'} | {'yes' if rt else 'NO'} | "
                    f"{'; '.join(e['unexpressed'])[:160]} | {why[:200]} |")
    head = ["| trainer | model | files | parser used | loaded ok | trainer reads what "
            "hybridplan reads | round trip: same plan |", "|---|---|---|---|---|---|---|"]
    for (trainer, model), s in summary.items():
        version = vers.get(DISTRIBUTIONS[trainer], "?")
        head.append(f"| {trainer} {version} | {model} | {s['n']} | {s['parser']} | "
                    f"{s['loaded']}/{s['n']} | {s['read']}/{s['n']} | {s['rt']}/{s['n']} |")
    detail = ["| trainer | model | plan | file | loaded | same reading | round trip | "
              "what the file cannot hold (export's warnings) | trainer's complaint |",
              "|---|---|---|---|---|---|---|---|---|"] + rows
    return head, detail, bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", default=str(ROOT.parent / "trainer-venv"))
    ap.add_argument("--megatron-lm", default=str(ROOT.parent / "megatron-lm"),
                    help="a Megatron-LM checkout (its megatron/training); '' for none")
    ap.add_argument("--quick", action="store_true", help="4-layer models (a smoke run)")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--out-dir", default=str(ROOT / "out" / "bench" / "trainer_parsers"))
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--check", nargs=2, metavar=("TRAINER", "MANIFEST"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    venv = Path(args.venv).resolve()
    megatron_lm = args.megatron_lm if args.megatron_lm and \
        (Path(args.megatron_lm) / "megatron" / "training" / "arguments.py").exists() else ""
    if args.check:
        trainer, manifest = args.check
        entries = [e for e in json.loads(Path(manifest).read_text())
                   if e["trainer"] == trainer and "layout" in e]
        import contextlib
        import io
        results = {}
        for e in entries:
            noise = io.StringIO()
            with contextlib.redirect_stdout(noise):
                results[f"{trainer}/{e['model']}/{e['kind']}"] = run_check(trainer, e,
                                                                           megatron_lm)
        print("RESULTS " + json.dumps(results))
        return 0
    if not args.inside:
        ensure_venv(venv)
        argv = [str(venv_python(venv)), str(Path(__file__).resolve()), "--inside",
                *sys.argv[1:]]
        return subprocess.run(argv, env=dict(os.environ, PYTHONPATH=str(ROOT / "python"))
                              ).returncode
    sys.path[:0] = [str(ROOT / "python"), str(ROOT / "tests" / "python")]  # trainer_plans
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    entries = write_files(out, args.quick, args.devices)
    manifest = out / "manifest.json"
    manifest.write_text(json.dumps(entries, indent=1))
    results = {}
    for trainer in sorted({e["trainer"] for e in entries}):
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--check",
                               trainer, str(manifest), "--megatron-lm", megatron_lm,
                               "--venv", str(venv)], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=str(ROOT / "python")))
        line = next((ln for ln in done.stdout.splitlines() if ln.startswith("RESULTS ")), None)
        if line is None:
            print(f"{trainer}: its checker failed (exit {done.returncode}):\n"
                  f"{done.stderr[-3000:]}", flush=True)
            continue
        results.update(json.loads(line[len("RESULTS "):]))
        print(f"{trainer}: {sum(1 for e in entries if e['trainer'] == trainer)} files checked "
              f"in {time.monotonic() - t0:.1f} s", flush=True)
    vers = versions(Path(sys.executable))
    head, detail, bad = report(entries, results, vers)
    print()
    print("\n".join(head))
    print()
    print("\n".join(detail))
    extra = "" if megatron_lm else " (no Megatron-LM checkout: its arguments unchecked)"
    print(f"\n{len(entries) - bad} of {len(entries)} files loaded, read alike and round-tripped"
          f"{extra}; files in {out}")
    (out / "results.json").write_text(json.dumps({"versions": vers, "results": results},
                                                 indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
