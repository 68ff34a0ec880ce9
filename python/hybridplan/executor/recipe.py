"""Applies a Plan to a torch.nn.Module inside a torch.distributed job (torchrun): apply() is
the recipe, read top to bottom in the order it builds a plan; AppliedPlan (applied.py) holds
the result.

    hp = hybridplan.apply(plan, model, optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                          example_inputs=one_replica_batch)   # pipeline plans: the traced shape
    for inputs, target in loader:                 # the global batch, the same on every rank
        loss = hp.step(*hp.shard(inputs, target))  # this replica's share; forward+backward+update
    full = hp.state_dict()                        # the original module's keys, on every rank

apply() initialises the default process group if needed (env:// rendezvous as torchrun sets it
up; Gloo on CPU, NCCL for CUDA tensors), checks the plan against the module and the job, makes
every rank agree on torch and hybridplan versions, plan and parameter shapes, builds the process
groups the plan needs (one named DeviceMesh, executor/layout.py), then:

  placement  (one process per replica, rank = replica, world = dp): each assigned graph node
             moves to its replica device, inputs follow, and the replica is wrapped in
             DistributedDataParallel over the replicas (see placement).
  pipeline   (one process per device, rank = replica * mp + k, world = dp * mp): the module
             is cut into the plan's mp * virtual_stages stages by torch.export
             (profiler.stage_split) and this rank's stage (or, under the interleaved and
             zero-bubble schedules, stages; the plan's stage_ranks say which) runs in
             torch.distributed.pipelining's PipelineStage under the plan's schedule, wrapped in
             DDP over its DP group {r * mp + k} (see pipeline).

Sharded data parallelism (the plan's "sharding": "zero2" or "zero3"; see sharding): in place
of DDP, torch's FSDP2 fully_shard over the same data-parallel group shards parameters,
gradients and optimizer state over the replicas. Placement plans (mp == 1) shard each graph
node as a unit and the root as one more (zero2 keeps a unit's gathered parameters from its
forward through its backward, zero3 frees them after the forward and gathers them again);
pipeline plans shard each stage module as one unit (zero2 only). The training is the same;
state_dict() and save_checkpoint() gather the shards, so checkpoints move between sharded and
unsharded plans.

Tensor parallelism (the plan's "tp" > 1, docs/tensor_parallel.md; see tensor_parallel): every
process above becomes tp processes, TP rank t innermost (placement rank = replica * tp + t,
pipeline rank = (replica * mp + k) * tp + t), that split the nodes profiler.tensor_parallel.
detect_layout names (apply() calls it on the module, with example_inputs) over their TP group
with DTensor's parallelize_module; data parallelism over the replicas of one TP rank is FSDP2's
(fully_shard for sharded plans, else replicate), and each TP rank runs its own pipeline.

Precision (the plan's "precision", the Job's: "bf16" or "fp16"; see precision): parameters,
master weights and optimizer state stay fp32 and gradients are reduced in fp32; the forward
computes in the dtype, under FSDP2's MixedPrecisionPolicy for sharded placement plans and
under torch.autocast for the others, fp16 with a loss scaler.

Inputs as users have them: `inputs` is a tensor, a tuple of positional arguments or a dict of
keyword arguments (input_ids=..., attention_mask=...); the module may return a tensor, a
tuple, a dict or a ModelOutput, which loss_fn(output, target) receives as the module returns it.

Training under any plan is the same training as on one device with the global batch (up to
float reassociation): the loss is mean-reduced, micro-batch losses are divided by their number
(equal micro-batches), replicas average their gradients and tied weights' copies sum theirs.
BatchNorm: placement (DDP) trains as torch DDP does, which apply() notes once; with
sync_batchnorm=True it normalises over the global batch (torch's SyncBatchNorm over the
replicas), as one process does; a pipeline stage normalises each micro-batch alone, as GPipe
does (see pipeline, batch_norm).

apply(..., measure_noise_scale=N) measures the gradient noise scale every N steps from the
replicas' local and all-reduced gradients (a DDP comm hook, see noise; not under sharding);
hp.noise_scale() reads it and hp.switch_advice(graph, cluster, job) says whether another plan
would now win. hp.switch(other_plan) moves the running job to another plan on the same
processes, the state handed over in memory, and hp becomes that plan; apply(...,
adapt=Adapt(graph, cluster, job)) switches by itself when the advice says so (see switching).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
from typing import Any, Callable, Dict, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from ..planner import Plan
from ..profiler import block_timing, stage_split
from . import batch_norm, checkpoint, noise, placement, sharded_checkpoint, sharding, switching
from . import compiling, materialize, precision, stepping, tensor_parallel
from .applied import AppliedPlan, Built
from .calls import default_loss, device_for, first_microbatch
from .checks import accumulation_steps_of, check_step_options, local_checks
from .layout import Layout, Mesh
from .lifecycle import DEFAULT_TIMEOUT_S, init_process_group
from .pipeline import PipelineRunner
from .plan_spec import parse_plan
from . import rank_agreement
from .rank_agreement import RankReport, agree_across_ranks, param_signature

__all__ = ["apply", "cut_stages"]


def cut_stages(spec: Plan, module: nn.Module, example_inputs: Any, batch_dim: int,
               tp_styles: Optional[Dict[str, str]] = None) -> stage_split.StageCut:
    """The plan's stages (pipeline mode): the export-based cut at one micro-batch; with
    tensor parallelism, of a copy holding this TP rank's shards (tensor_parallel.
    narrowed_for_export: the traced stages record the sizes the rank runs)."""
    args, kwargs = first_microbatch(spec, example_inputs, batch_dim)
    if spec.tp > 1 and tp_styles:
        module = tensor_parallel.narrowed_for_export(
            module, tp_styles, Layout.of(spec).tp_rank_of(dist.get_rank()), spec.tp)
    return stage_split.split(module, args, kwargs, spec.assignment, spec.num_stages, spec.source)


@dataclasses.dataclass
class TpSplit:
    """Tensor parallelism on this module (tp > 1): node -> style, node module -> weight kind,
    and sequence parallelism's layout (or None); empty for tp = 1."""
    styles: Dict[str, str] = dataclasses.field(default_factory=dict)
    kinds: Dict[str, str] = dataclasses.field(default_factory=dict)
    sequence: Any = None


def detect_tp(spec: Plan, module: nn.Module, example_inputs: Any) -> TpSplit:
    """The profiler's one definition of what splits, checked on this module (tp > 1)."""
    if spec.tp == 1:
        return TpSplit()
    layout = tensor_parallel.detect(module, spec.assignment, example_inputs, spec.source)
    styles = tensor_parallel.check_layout(layout, spec.tp, spec.source)
    split = TpSplit(styles, tensor_parallel.weight_kinds(module, styles))
    if spec.sequence_parallel:
        if spec.mode == "pipeline":
            raise ValueError(
                f"{spec.source}: sequence_parallel with a pipeline (mp={spec.mp}) is "
                "not applied: a pipeline stage is a traced graph with no blocks to "
                "split the sequence between; plan it with sequence_parallel off")
        split.sequence = tensor_parallel.detect_sequence(
            module, layout, spec.tp, spec.assignment, example_inputs, spec.source)
    return split


def place_replica(spec: Plan, module: nn.Module, mesh: Mesh, tp: TpSplit,
                  sync_batchnorm: bool, mixed: precision.Precision,
                  compiled: Optional[Dict[str, Any]] = None) -> Built:
    """Placement mode, the axes in the order they apply to the replica: SyncBatchNorm (if
    asked) -> each graph node on its device, recomputed nodes wrapped (placement.place) ->
    tensor parallelism over the replica's TP group -> data parallelism over the replicas:
    FSDP2 shards (zero2/zero3, HSDP when dp_shard < dp) or replicate (tp > 1), else DDP."""
    layout = mesh.layout
    rank = dist.get_rank()
    replica, tp_rank = layout.replica_of(rank), layout.tp_rank_of(rank)
    if sync_batchnorm:  # before place(): a BN node may be replaced
        module = batch_norm.convert_sync(module, mesh.dp_group(),  # tp == 1 (plan rule)
                                         device_for(spec, spec.mesh[replica][0]))
    devices = [device_for(spec, g + tp_rank) for g in spec.mesh[replica]]
    if compiled is not None:  # each block's forward compiled, under the hooks place() adds
        compiling.compile_blocks(module, compiling.compiled_names(spec, rank, tp.styles),
                                 compiled)
    hooks = placement.place(module, spec.assignment, devices, spec.recompute, spec.selective)
    built = Built(original=module, module=module, params=[], devices=devices, hooks=hooks)
    if spec.tp > 1:  # mp == 1 (plan rule): TP over the replica's group, DP over the dp dim
        tensor_parallel.parallelize(module, tp.styles, tp.kinds, mesh.tp(),
                                    sequence=tp.sequence)
        if spec.dp > 1 and spec.sharding != "none":
            built.shard_units = sharding.shard_placement(module, spec.assignment, mesh.dp(),
                                                         spec.sharding, mixed.mp_policy())
        elif spec.dp > 1:
            tensor_parallel.replicate_placement(module, spec.assignment, mesh.dp_tp())
    elif spec.sharding == "none":
        built.ddp = placement.wrap_ddp(module, devices, mesh.dp_group())
    else:  # mp == 1 (plan rule): one device; recompute was applied above, before sharding
        built.shard_units = sharding.shard_placement(
            module, spec.assignment, mesh.hsdp() if layout.hybrid else mesh.dp(), spec.sharding,
            mixed.mp_policy())
    built.params = list(module.parameters())  # FSDP's DTensors when sharded
    return built


def run_stages(spec: Plan, module: nn.Module, cut: stage_split.StageCut, mesh: Mesh,
               tp: TpSplit, loss_fn: Callable, mixed: precision.Precision,
               compiled: Optional[Dict[str, Any]] = None) -> Built:
    """Pipeline mode: this rank's stages of the cut under the plan's schedule (PipelineRunner
    applies, per stage, tensor parallelism, recompute and then DDP, FSDP2 or replicate over the
    stage's DP group), and the groups the step needs: the tied weights' holders and this TP
    rank's pipeline of the replica."""
    layout = mesh.layout
    rank = dist.get_rank()
    replica, stage = layout.replica_of(rank), layout.stage_of(rank)
    tp_rank = layout.tp_rank_of(rank)
    # per tied parameter: the ranks of this replica and TP rank holding a copy (a group where
    # they are several; where one rank holds every copy, it sums them alone: see pipeline)
    stage_ranks = spec.stage_ranks
    tie_groups: Dict[int, Any] = {}
    for i, uses in enumerate(cut.tied):
        holders = sorted({stage_ranks[s] for s in uses})
        if len(holders) > 1:
            tie_groups[i] = mesh.tied_group(holders)
    replica_group = mesh.pp_group()  # this TP rank's pipeline of the replica
    device = device_for(spec, spec.mesh[replica][stage] + tp_rank)
    stages = spec.stages_of(stage)
    recomputed = {spec.assignment[n] for n in spec.recompute}
    selective = {spec.assignment[n] for n in spec.selective}  # whole stages (plan rule)
    runner = PipelineRunner(
        cut, stages, device, spec.schedule, spec.num_microbatches, loss_fn,
        replica_group, mesh.dp_group(), spec.dp, tie_groups,
        recompute_stages=sorted(recomputed), sharding=spec.sharding,
        dp_mesh=mesh.hsdp() if layout.hybrid else mesh.dp(),
        selective_stages=sorted(selective),
        tensor_parallel=(tp.styles, tp.kinds, mesh.dp_tp()) if spec.tp > 1 else None,
        precision=mixed, compiled=compiled,
        nodes=(compiling.compiled_names(spec, rank, tp.styles) if compiled is not None
               else ()))
    return Built(original=module, module=runner.module, params=runner.parameters(),
                 runner=runner, cut=cut, device=device, stages=stages, replica_group=replica_group,
                 # the ranks of this TP rank's pipeline holding stage 0 (the inputs) and the last
                 first_rank=layout.rank_of(replica, stage_ranks[0], tp_rank),
                 last_rank=layout.rank_of(replica, stage_ranks[-1], tp_rank))


def make_optimizer(spec: Plan, built: Built, optimizer: Any, device: torch.device
                   ) -> torch.optim.Optimizer:
    """The optimizer over this rank's parameters: the user's Optimizer as it is (placement;
    parameters of other stages get no grad, so it skips them), else the factory's (default
    SGD lr=0.01) over the parameters this rank trains."""
    if isinstance(optimizer, torch.optim.Optimizer):
        if spec.mode == "pipeline" and built.cut.tied:
            raise ValueError("hybridplan.apply: with tied weights across pipeline stages "
                             "pass an optimizer factory (each stage steps its own copy)")
        return optimizer
    factory = optimizer or functools.partial(torch.optim.SGD, lr=0.01)
    params = [p for p in built.params if p.requires_grad]
    if not params:  # a stage without parameters still takes part in the schedule
        params = [nn.Parameter(torch.zeros(0, device=device))]
    return factory(params)


def noise_meter(spec: Plan, built: Built, every: int, decay: float, device: torch.device
                ) -> Optional[noise.NoiseScaleMeter]:
    """measure_noise_scale=N: the meter on this rank's DDP wrappers (a pipeline stage without
    parameters adds zeros); None when off."""
    if not every:
        return None
    meter = noise.NoiseScaleMeter(every, decay, spec.dp, device)
    for ddp in [built.ddp] if spec.mode == "placement" else built.runner.ddps:
        if ddp is not None:
            meter.install(ddp)
    return meter


def apply(plan: Any, module: nn.Module, *, loss_fn: Optional[Callable] = None,
          optimizer: Union[Callable, torch.optim.Optimizer, None] = None,
          timeout_s: float = DEFAULT_TIMEOUT_S, graph: Any = None,
          batch_dim: int = 0, example_inputs: Any = None, measure_noise_scale: int = 0,
          noise_scale_decay: float = 0.99,
          resume_from: Union[str, os.PathLike, Dict[str, Any], None] = None,
          checkpoint_dir: Union[str, os.PathLike, None] = None,
          retain_freed_memory: bool = True, adapt: Optional[switching.Adapt] = None,
          sync_batchnorm: bool = False, init_weights: Optional[Callable] = None,
          init_seed: int = 0, load_pretrained: Union[str, os.PathLike, None] = None,
          clip_grad_norm: Optional[float] = None,
          accumulation_steps: Optional[int] = None, lr_scheduler: Optional[Callable] = None,
          compile: Any = None) -> AppliedPlan:
    """Trains `module` under `plan` in this torch.distributed job; see the module docstring.

    plan       a hybridplan Plan (anything with to_dict()), a plan dict, or a path to its JSON.
    module     the full model, built identically on every rank (same parameter shapes).
    loss_fn    loss(output, target), mean-reduced over the batch; default: module.loss if the
               module has one, else torch.nn.functional.cross_entropy.
    optimizer  a factory params -> Optimizer (e.g. functools.partial(torch.optim.Adam, lr=1e-3))
               or an Optimizer over module.parameters() (not with sharding: a factory then);
               default SGD(lr=0.01).
    timeout_s  timeout of the process groups and of every p2p wait.
    graph      optional Graph (object, dict or path); its sha256 must equal the plan's.
    batch_dim  dimension of inputs and target that indexes samples (pipeline plans: 0).
    example_inputs  pipeline plans: one replica batch as step() receives it (a tensor, tuple or
               dict); the stages are traced by torch.export at one micro-batch of it, in the
               module's current train/eval mode, so every step must have that shape. Plans with
               tp > 1 too: each node's split is checked on it (tensor_parallel.detect).
    measure_noise_scale  N > 0: measure the gradient noise scale every N steps from the
               replicas' local and all-reduced gradients (needs dp >= 2; one extra scalar
               all-reduce per measured step); read it with AppliedPlan.noise_scale(). 0: off.
    noise_scale_decay  the moving averages' weight per measured step, in (0, 1]; 1 averages
               every measurement equally.
    resume_from  a checkpoint written by AppliedPlan.save_checkpoint under this or any other
               plan (or AppliedPlan.consolidated_state()'s dict): the model state is loaded
               before the module is placed or cut, the optimizer state of this rank's
               parameters by name, and step_count. Also a sharded checkpoint (save_sharded's
               step-<N>/ directory), a directory of them (the newest complete one), or
               "latest": the newest complete one in checkpoint_dir, or none yet (a first run
               starts from the beginning, logged). A checkpoint whose files do not match its
               manifest is refused, naming the file; a directory's newest complete one is
               taken past those (logged).
    checkpoint_dir  where save_sharded() writes by default and resume_from="latest" looks.
    retain_freed_memory  on a CPU job, keep freed memory in the process (glibc mallopt,
               process-wide; profiler.block_timing.retain_freed_memory) as the profiler does and
               as caching allocators (CUDA's) do: otherwise every large activation or gradient
               buffer of every step is mapped anew and page-faults on first touch. BigLSTM's
               step at batch 32 took 28.8 ms without, 21.4 ms with it (one process, median of
               10); the profile, and so the plan's prediction, assumes it. False, for memory
               (a model too large to waste what it frees, docs/real_size.md): give blocks of
               1 MiB or more back to the kernel when freed
               (profiler.block_timing.return_freed_memory).
    adapt      a hybridplan.Adapt policy (needs measure_noise_scale): the adaptive mode, in which
               step() now and then asks switch_advice on rank 0 and switches this AppliedPlan
               in place (AppliedPlan.switch) when it says so; see executor/switching.py.
    sync_batchnorm  True: the module's BatchNorm layers are converted in place
               (nn.SyncBatchNorm.convert_sync_batchnorm, the same parameters and buffers) to
               normalise over the replicas' process group: the global batch's statistics, so
               data parallelism trains as one process on the global batch. Placement plans
               with tp = 1 only (ValueError for a pipeline; see executor/batch_norm.py). False:
               each replica normalises its own share, as torch DDP does (noted once).
    init_weights  a model built on the meta device (with torch.device("meta"): ...): each rank
               materialises only what it holds (its shards, stages or slices) with the values
               one process gets from hybridplan.materialize(model, init_weights, init_seed):
               each module initialised, children first, from a seed of init_seed and its name
               (executor/materialize.py, docs/real_size.md). None: the module's
               reset_parameters, or a Hugging Face model's _init_weights; else callable(module)
               writing that module's tensors in place.
    init_seed  the seed of that rule (an int, the same on every rank).
    load_pretrained  a Hugging Face safetensors directory (model.safetensors, or shards with
               model.safetensors.index.json): every rank reads only the tensors or slices it
               holds (executor/pretrained.py); a meta-built model's tensors the files do not
               hold (non-persistent buffers) come from init_weights' rule.
    clip_grad_norm  max_norm: step() clips the gradients by their global norm (AppliedPlan.
               clip_grad_norm: over the whole model, equal to one process's
               torch.nn.utils.clip_grad_norm_ on the global batch). None: no clipping.
    accumulation_steps  K: a step accumulates K forward_backward calls' gradients, synchronised
               over the replicas on the K-th only, each loss divided by K, so it trains as one
               process on dp x per_replica_batch x K samples; step() takes K x
               per_replica_batch samples per replica (hp.global_batch in all). None (default):
               the plan's accumulation_steps (1 when it has none); an integer overrides it
               (the plan's predicted step is then for its own K; rank 0 logs the difference).
    compile    torch.compile per graph block (executor/compiling.py): True (inductor), a dict
               of torch.compile keyword arguments, False; None (default): the plan's "compile"
               (False when it has none). Every plan kind; the zero-bubble schedules and
               blocks recomputed selectively run eager (rank 0 warns why), and a block torch
               cannot compile as one graph runs eager (warned, naming it).
    lr_scheduler  a factory optimizer -> torch.optim.lr_scheduler.LRScheduler (e.g.
               hybridplan.warmup_cosine(warmup_steps, total_steps)), stepped after each
               optimizer step; its state is in both checkpoints, restored on resume under any
               plan, and a switch carries it.

    Raises ValueError, on every rank, if the plan is malformed or does not fit the module or the
    job's world size, or if ranks run different torch or hybridplan versions or hold different
    plans or parameter shapes.
    """
    # ---- 0. the process group and the checks every rank agrees on before any slow step ----
    timeout = datetime.timedelta(seconds=timeout_s)
    switching.check_adapt(adapt, measure_noise_scale)  # the same arguments on every rank
    check_step_options(clip_grad_norm, accumulation_steps, lr_scheduler)
    compiling.compile_options(compile)  # the option's form; the plan's checked below
    if not torch.cuda.is_available():  # CPU devices (calls.device_for)
        if retain_freed_memory:
            block_timing.retain_freed_memory()
        else:
            block_timing.return_freed_memory()
    init_process_group(timeout)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    plan_sha, spec, cut, error, weights, compiled = None, None, None, None, None, None
    resumed, resumed_from = None, ""
    tp = TpSplit()
    signature = param_signature(module)  # before the cut, which may copy tied parameters
    aliases = checkpoint.parameter_aliases(module)  # likewise
    versions = rank_agreement.local_versions()
    try:
        spec = parse_plan(plan)  # the one plan object this job holds
        plan_sha = spec.sha256
        local_checks(spec, module, graph, world_size, example_inputs, batch_dim,
                     measure_noise_scale, noise_scale_decay, optimizer)
        batch_norm.check_sync(spec, module, sync_batchnorm)
        compiled = compiling.compile_of(spec, compile, rank)
        weights = materialize.Weights.of(module, init_weights, init_seed, load_pretrained,
                                         spec.source, spec.mode)
        if weights is not None and weights.meta and resume_from is not None:
            raise ValueError(f"{spec.source}: resume_from with a meta-built model is not "
                             f"supported: build the model on a real device to resume, or load "
                             f"an exported model with load_pretrained")
        tp = detect_tp(spec, weights.detection_module(module) if weights is not None and
                       spec.tp > 1 else module, example_inputs)
        if resume_from is not None:
            resumed, resumed_from = sharded_checkpoint.resolve(resume_from, checkpoint_dir)
            if resumed is not None:
                checkpoint.check_model(resumed, module, resumed_from)
    except ValueError as e:
        error = str(e)
    agree_across_ranks(RankReport(rank, plan_sha, error, signature, *versions,
                                  resumed=resumed_from))
    # ---- 1. the state resumed, into the whole module before it is placed or cut ----
    if resumed is not None:
        with torch.no_grad():
            module.load_state_dict(resumed["model"])
    # ---- 2. the pipeline cut (torch.export at one micro-batch; it can fail too) ----
    if spec.mode == "pipeline":
        try:
            cut = cut_stages(spec, module, example_inputs, batch_dim, tp.styles)
        except ValueError as e:
            error = str(e)
        agree_across_ranks(RankReport(rank, plan_sha, error, signature, *versions))
    # ---- 3. one mesh: every process group this plan uses (collective) ----
    mesh = Layout.of(spec).build(timeout)
    # ---- 3b. a meta-built model or pretrained weights: a DDP replica or this rank's stages ----
    if weights is not None:
        weights.before_axes(spec, module, cut, rank)
    # ---- 4. the axes: placement, recompute, tensor parallelism, data parallelism ----
    loss_fn = loss_fn or default_loss(module)
    mixed = precision.of_plan(spec)  # the plan's precision: FSDP2's policy or autocast
    if spec.mode == "placement":
        built = place_replica(spec, module, mesh, tp, sync_batchnorm, mixed, compiled)
    else:
        built = run_stages(spec, module, cut, mesh, tp, loss_fn, mixed, compiled)
    built.precision = mixed
    # ---- 4b. ... or the shards and slices of a sharded or tensor-parallel replica ----
    if weights is not None and weights.after_axes(spec, module, rank):
        built.params = list(module.parameters())  # the new tensors (FSDP's DTensors)
    built.tp = tp
    first_device = built.devices[0] if spec.mode == "placement" else built.device
    # ---- 5. the optimizer and the noise meter over this rank's parameters ----
    opt = make_optimizer(spec, built, optimizer, first_device)
    scheduler = stepping.make_scheduler(lr_scheduler, opt)  # before a resumed state is loaded
    meter = noise_meter(spec, built, measure_noise_scale, noise_scale_decay, first_device)
    # what switch() carries over to the next plan (loss_fn None: the module's default)
    carried = {"loss_fn": None if loss_fn == default_loss(module) else loss_fn,
               "optimizer": optimizer, "timeout_s": timeout_s, "batch_dim": batch_dim,
               "measure_noise_scale": measure_noise_scale,
               "noise_scale_decay": noise_scale_decay, "adapt": adapt,
               "sync_batchnorm": sync_batchnorm, "clip_grad_norm": clip_grad_norm,
               "accumulation_steps": accumulation_steps, "lr_scheduler": lr_scheduler,
               "compile": compile}
    hp = AppliedPlan(spec, mesh, built, opt, loss_fn, timeout, batch_dim, carried, aliases,
                     meter, resumed, resumed_from,
                     os.fspath(checkpoint_dir) if checkpoint_dir is not None else None,
                     clip_grad_norm=clip_grad_norm,
                     accumulation_steps=accumulation_steps_of(spec, accumulation_steps, rank),
                     lr_scheduler=scheduler)
    hp._rebuild = apply  # switch() rebuilds through this recipe (switching.switch_plan)
    batch_norm.note_data_parallel(spec, module, sync_batchnorm, rank)
    return hp
