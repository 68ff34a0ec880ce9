"""The batch-size trade-off, measured directly: steps to a target at several global batches.

The planner's time-to-accuracy objective needs, for each global batch B, the epochs training
takes to reach the target. Its convergence model (csrc/planner/run/convergence.h) is McCandlish et
al.'s (https://arxiv.org/abs/1812.06162, eq. 2.11):

    steps S(B) = S_min (1 + B_crit / B),   samples E(B) = B S(B) = E_min (1 + B / B_crit),

with B_crit = E_min / S_min. This module measures S(B) by training the user's model on the
user's data to the user's target at several global batches and seeds, fits S_min and E_min,
and writes a Job the planner reads:

    task = Task(model=lambda seed: hybridplan.models.digits_cnn(seed), data=datasets.digits(),
                loss_fn=F.cross_entropy, optimizer=lambda params, lr: SGD(params, lr, 0.9),
                lr_rule=LrRule(base_lr=0.05, base_batch=32, scaling="sqrt",
                               warmup_samples=2048),
                target=Target("loss", 0.15))
    sweep = measure(task, batches=[8, 16, 32, 64, 128, 256, 512], seeds=[0, 1, 2])
    fit = fit_critical_batch(sweep.runs)            # S_min, E_min, B_crit with bootstrap spread
    job = convergence_job(fit, samples_per_epoch=task.data.num_train, per_replica_batch=[...])

`branched` is the cheaper mode (Merrill et al., https://arxiv.org/abs/2505.23971): one run at a
small batch to a checkpoint (or the user's checkpoint of the run so far, in the executor's
format, which moves between plans), then short branches from it at several batches, each to
the target; the same fit over the branches' steps gives the local critical batch of the rest
of training. Merrill et al. judge a branch by its loss after a fixed number of tokens; this
counts each branch's steps to the target instead, so one two-parameter fit serves both modes.

Definitions that every run shares (the plan worker's too, time_to_target_worker):
  - data order: one stream of samples, a fresh permutation of the training set per epoch
    (torch.Generator seeded by seed and epoch); a step of global batch B takes the stream's next
    B samples (`sample_indices`), so the epoch count is samples / training-set size, fractional;
  - learning rate: `LrRule.lr(B, samples_seen)`: base_lr scaled by (B / base_batch) linearly,
    by its square root, or not at all, times a linear warm-up over warmup_samples samples;
  - evaluation: the held-out loss and accuracy after the steps `eval_due` picks (every step up
    to 100, then every 1 % of the steps so far: the step count is resolved to 1 %); the run's
    steps to target are the first evaluated step at which the target holds.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import random
import statistics
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..factories import load_factory
from ..schedules import warmup_fraction
from ..gradient_noise.noise_scale import noise_scale
from ..gradient_noise.noise_scale_job import trajectory_job

# torch, the executor (which imports torch) and the compiled planner are imported inside the
# functions that use them, so that importing this package needs neither torch nor the planner's
# compiled extension (the command line imports it at its start).

__all__ = ["LrRule", "Target", "Task", "Run", "Sweep", "Fit", "sample_indices", "eval_due",
           "evaluate", "train_to_target", "measure", "branched", "fit_critical_batch",
           "convergence_job", "predicted_steps", "task_from_spec", "OPTIMIZERS",
           "noise_scale_at"]

SCALINGS = ("linear", "sqrt", "none")


@dataclasses.dataclass(frozen=True)
class LrRule:
    """The learning rate at global batch B after `samples_seen` samples: base_lr times
    (B / base_batch) ** p (p = 1 linear, 1/2 sqrt, 0 none), times the linear warm-up
    schedules.warmup_fraction(samples after this step, warmup_samples) (min(1, their ratio);
    hybridplan.warmup_cosine warms up by it too, over steps)."""
    base_lr: float
    base_batch: int
    scaling: str = "sqrt"
    warmup_samples: int = 0

    def __post_init__(self):
        if self.scaling not in SCALINGS:
            raise ValueError(f"LrRule: scaling must be one of {SCALINGS} (got {self.scaling!r})")
        for name in ("base_lr", "base_batch"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
                raise ValueError(f"LrRule: {name} must be a finite number > 0 (got {value!r})")
        if not isinstance(self.warmup_samples, int) or self.warmup_samples < 0:
            raise ValueError(f"LrRule: warmup_samples must be an integer >= 0 "
                             f"(got {self.warmup_samples!r})")

    def lr(self, global_batch: int, samples_seen: int) -> float:
        power = {"linear": 1.0, "sqrt": 0.5, "none": 0.0}[self.scaling]
        lr = self.base_lr * (global_batch / self.base_batch) ** power
        return lr * warmup_fraction(samples_seen + global_batch, self.warmup_samples)

    def describe(self) -> str:
        rule = {"linear": "x B / {b}", "sqrt": "x sqrt(B / {b})", "none": "(not scaled)"}
        text = f"lr = {self.base_lr:g} {rule[self.scaling].format(b=self.base_batch)}"
        return text + (f", linear warm-up over {self.warmup_samples} samples"
                       if self.warmup_samples else "")


@dataclasses.dataclass(frozen=True)
class Target:
    """Reached when the held-out `loss` is at most `value`, or its `accuracy` at least `value`."""
    kind: str
    value: float

    def __post_init__(self):
        if self.kind not in ("loss", "accuracy"):
            raise ValueError(f"Target: kind must be 'loss' or 'accuracy' (got {self.kind!r})")
        if not isinstance(self.value, (int, float)) or not math.isfinite(self.value):
            raise ValueError(f"Target: value must be a finite number (got {self.value!r})")

    def reached(self, loss: float, accuracy: float) -> bool:
        return loss <= self.value if self.kind == "loss" else accuracy >= self.value

    def describe(self) -> str:
        return f"held-out {self.kind} {'<=' if self.kind == 'loss' else '>='} {self.value:g}"


@dataclasses.dataclass
class Task:
    """What to train: `model(seed)` builds a fresh module, `data` has train_inputs,
    train_targets, eval_inputs, eval_targets (tensors, batch first; hybridplan.datasets),
    `loss_fn(output, target)` averages over the batch, `optimizer(params, lr)` builds the
    optimizer, `lr_rule` sets its learning rate at each step, and training stops at `target` or
    after `max_epochs`."""
    model: Callable[[int], Any]
    data: Any
    loss_fn: Callable[[Any, Any], Any]
    optimizer: Callable[[Any, float], Any]
    lr_rule: LrRule
    target: Target
    max_epochs: float = 200.0


@dataclasses.dataclass
class Run:
    global_batch: int
    seed: int
    reached: bool
    steps: int                    # steps to target (or steps run, if not reached)
    samples: int
    epochs: float
    curve: List[Tuple[int, float, float]]  # (step, held-out loss, accuracy) at each evaluation
    start_samples: int = 0        # a branch's starting point in the data stream

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Sweep:
    runs: List[Run]
    lr_rule: str
    target: str
    mode: str = "full"            # "full": from initialisation; "branched": from a checkpoint
    branch: Optional[dict] = None  # the branching point (batch, step, samples, loss)

    def to_dict(self) -> dict:
        return {"runs": [r.to_dict() for r in self.runs], "lr_rule": self.lr_rule,
                "target": self.target, "mode": self.mode, "branch": self.branch}


# ---- a task named in JSON (the CLI's and the plan worker's) ----------------------------------

def _sgd(params, lr):
    import torch
    return torch.optim.SGD(params, lr=lr)


def _sgd_momentum(params, lr):
    import torch
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def _adam(params, lr):
    import torch
    return torch.optim.Adam(params, lr=lr)


# The Job's optimizer names (docs/formats.md) -> torch.optim with torch's defaults otherwise.
OPTIMIZERS: Dict[str, Callable[[Any, float], Any]] = {
    "sgd": _sgd, "sgd_momentum": _sgd_momentum, "adam": _adam}

TASK_FIELDS = ("model", "data", "optimizer", "lr_rule", "target", "max_epochs", "loss")


def task_from_spec(spec: Dict[str, Any], source: str = "task") -> Task:
    """A Task from its JSON form (docs/formats.md, "Convergence task"):
    {"model": "MODULE:FACTORY" (called with seed=), "data": "MODULE:FACTORY" (returns a
    hybridplan.datasets.Dataset), "optimizer": "sgd" | "sgd_momentum" | "adam",
    "lr_rule": {"base_lr", "base_batch", "scaling", "warmup_samples"},
    "target": {"kind": "loss" | "accuracy", "value"}, "max_epochs" (optional, 200),
    "loss": "MODULE:NAME" (optional; default the model's own `loss`, else cross-entropy)}.
    Errors name `source` and the field."""
    if not isinstance(spec, dict):
        raise ValueError(f"{source}: must be a JSON object (got {type(spec).__name__})")
    unknown = sorted(set(spec) - set(TASK_FIELDS))
    if unknown:
        raise ValueError(f"{source}: {unknown[0]} is not a task field (fields: "
                         f"{', '.join(TASK_FIELDS)})")
    for field in ("model", "data", "optimizer", "lr_rule", "target"):
        if field not in spec:
            raise ValueError(f"{source}: {field} is required")
    factory = load_factory(spec["model"], source, "model")
    data = load_factory(spec["data"], source, "data")()
    if spec["optimizer"] not in OPTIMIZERS:
        raise ValueError(f"{source}: optimizer must be one of {sorted(OPTIMIZERS)} "
                         f"(got {spec['optimizer']!r})")

    def fields(name: str, kinds: Sequence[str]) -> Dict[str, Any]:
        value = spec[name]
        if not isinstance(value, dict) or set(value) - set(kinds):
            raise ValueError(f"{source}: {name} must be an object with fields "
                             f"{', '.join(kinds)} (got {value!r})")
        return value
    try:
        lr_rule = LrRule(**fields("lr_rule", ("base_lr", "base_batch", "scaling",
                                              "warmup_samples")))
        target = Target(**fields("target", ("kind", "value")))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source}: {e}") from None
    max_epochs = spec.get("max_epochs", 200.0)
    if not isinstance(max_epochs, (int, float)) or not max_epochs > 0:
        raise ValueError(f"{source}: max_epochs must be a number > 0 (got {max_epochs!r})")
    if "loss" in spec:
        loss_fn = load_factory(spec["loss"], source, "loss")
    else:
        own = getattr(factory(seed=0), "loss", None)
        if callable(own):
            loss_fn = own
        else:
            import torch.nn.functional as F
            loss_fn = F.cross_entropy
    return Task(model=lambda seed: factory(seed=seed), data=data, loss_fn=loss_fn,
                optimizer=OPTIMIZERS[spec["optimizer"]], lr_rule=lr_rule, target=target,
                max_epochs=float(max_epochs))


# ---- one definition each: data order, evaluation schedule ------------------------------------

# Each step reads its epoch's permutation: computed once per epoch, not once per step (a
# permutation of a large training set costs more than a small model's step). The tensor is
# only sliced, never written.
@functools.lru_cache(maxsize=8)
def _epoch_order(num_samples: int, seed: int, epoch: int):
    import torch

    generator = torch.Generator().manual_seed(1_000_003 * seed + epoch)
    return torch.randperm(num_samples, generator=generator)


def sample_indices(num_samples: int, seed: int, start: int, count: int):
    """Training-set indices of samples start, ..., start + count - 1 of the data stream (a new
    permutation per epoch)."""
    import torch

    parts, position = [], start
    while position < start + count:
        epoch, offset = divmod(position, num_samples)
        take = min(num_samples - offset, start + count - position)
        parts.append(_epoch_order(num_samples, seed, epoch)[offset:offset + take])
        position += take
    return torch.cat(parts)


def eval_due(step: int, last_eval: int) -> bool:
    """Whether to evaluate after `step` steps when the last evaluation was after `last_eval`:
    every step up to 100 steps since the start, then when 1 % of the steps have passed."""
    return step - last_eval >= max(1, last_eval // 100)


def evaluate(module, loss_fn, inputs, targets, chunk: int = 1024) -> Tuple[float, float]:
    """(mean loss, accuracy) of `module` on the held-out data, in eval mode without gradients."""
    import torch

    was_training = module.training
    module.eval()
    total, correct, n = 0.0, 0, int(targets.shape[0])
    with torch.no_grad():
        for i in range(0, n, chunk):
            out = module(inputs[i:i + chunk])
            out = out[0] if isinstance(out, (tuple, list)) else out
            t = targets[i:i + chunk]
            total += float(loss_fn(out, t)) * t.shape[0]
            if out.dim() == t.dim() + 1:
                correct += int((out.argmax(-1) == t).sum())
    module.train(was_training)
    return total / n, correct / n


# ---- training to the target ------------------------------------------------------------------

def _set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def train_to_target(task: Task, global_batch: int, seed: int, *,
                    start: Optional[Dict[str, Any]] = None,
                    stop: Optional[Target] = None) -> Tuple[Run, Dict[str, Any]]:
    """Trains `task.model(seed)` in one process at `global_batch` from initialisation (or from
    `start`, a state returned by a previous call: model, optimizer, samples seen) until `stop`
    (default task.target) holds at an evaluation or max_epochs pass. Returns the Run and the
    final state."""
    import torch

    _check_batch(global_batch)
    stop = stop or task.target
    data = task.data
    n = int(data.train_targets.shape[0])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = task.model(seed)
        optimizer = task.optimizer(module.parameters(), task.lr_rule.lr(global_batch, 0))
        samples = 0
        if start is not None:
            module.load_state_dict(start["model"])
            optimizer.load_state_dict(start["optimizer"])
            samples = start["samples"]
        first = samples
        module.train()
        curve: List[Tuple[int, float, float]] = []
        step, last_eval, reached = 0, 0, False
        limit = first + int(task.max_epochs * n)
        while samples < limit:
            idx = sample_indices(n, seed, samples, global_batch)
            _set_lr(optimizer, task.lr_rule.lr(global_batch, samples))
            optimizer.zero_grad(set_to_none=True)
            task.loss_fn(module(data.train_inputs[idx]), data.train_targets[idx]).backward()
            optimizer.step()
            step += 1
            samples += global_batch
            if eval_due(step, last_eval):
                last_eval = step
                loss, accuracy = evaluate(module, task.loss_fn, data.eval_inputs,
                                          data.eval_targets)
                curve.append((step, loss, accuracy))
                if not math.isfinite(loss):
                    break  # diverged: never reaches the target
                if stop.reached(loss, accuracy):
                    reached = True
                    break
        run = Run(global_batch, seed, reached, step, samples - first,
                  (samples - first) / n, curve, start_samples=first)
        state = {"model": copy.deepcopy(module.state_dict()),
                 "optimizer": copy.deepcopy(optimizer.state_dict()), "samples": samples}
        return run, state


def _check_batch(global_batch: Any) -> None:
    if not isinstance(global_batch, int) or isinstance(global_batch, bool) or global_batch < 1:
        raise ValueError(f"convergence: global batch must be an integer >= 1 "
                         f"(got {global_batch!r})")


def _check_sweep(batches: Sequence[int], seeds: Sequence[int]) -> None:
    for b in batches:
        _check_batch(b)
    if len(set(batches)) < 2:
        raise ValueError(f"convergence: batches must hold at least two distinct global batches "
                         f"to fit S_min and E_min (got {list(batches)!r})")
    if not seeds or any(not isinstance(s, int) for s in seeds):
        raise ValueError(f"convergence: seeds must be a non-empty list of integers "
                         f"(got {list(seeds)!r})")


def measure(task: Task, batches: Sequence[int], seeds: Sequence[int],
            progress: Optional[Callable[[Run], None]] = None) -> Sweep:
    """Steps to the target from initialisation at every (batch, seed); one process each."""
    _check_sweep(batches, seeds)
    runs = []
    for seed in seeds:
        for b in batches:
            run, _ = train_to_target(task, b, seed)
            runs.append(run)
            if progress:
                progress(run)
    return Sweep(runs, task.lr_rule.describe(), task.target.describe())


def load_start(path: str, task: Task, seed: int = 0) -> Dict[str, Any]:
    """A branching state from a checkpoint the executor wrote (AppliedPlan.save_checkpoint,
    under any plan): the model, the optimizer state by parameter name, and the data position
    (the checkpoint's step times its plan's global batch)."""
    from ..executor import checkpoint

    ckpt = checkpoint.load(path)
    module = task.model(seed)
    checkpoint.check_model(ckpt, module, path)
    module.load_state_dict(ckpt["model"])
    optimizer = task.optimizer(module.parameters(), task.lr_rule.base_lr)
    names = {id(p): n for n, p in module.named_parameters()}
    checkpoint.load_optimizer_state(optimizer, names, ckpt["optimizer"], path)
    global_batch = json.loads(ckpt["plan"])["global_batch"]
    return {"model": module.state_dict(), "optimizer": optimizer.state_dict(),
            "samples": ckpt["step"] * global_batch}


def branched(task: Task, batches: Sequence[int], seeds: Sequence[int], *,
             reference_batch: Optional[int] = None, branch_loss: Optional[float] = None,
             start: Optional[Dict[str, Any]] = None,
             progress: Optional[Callable[[Run], None]] = None) -> Sweep:
    """Short runs from one branching point at every (batch, seed), each to the target.

    The branching point is `start` (load_start of a checkpoint), or the state of one run at
    `reference_batch` (default the smallest batch), seed 0, when its held-out loss first falls to
    `branch_loss` (default: halfway, in log, between the initial loss and a loss target). The
    branches continue the data stream from there with their own seed's order."""
    _check_sweep(batches, seeds)
    branch: Dict[str, Any] = {}
    if start is None:
        reference_batch = reference_batch or min(batches)
        if branch_loss is None:
            if task.target.kind != "loss":
                raise ValueError("branched: give branch_loss when the target is an accuracy")
            import torch

            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0)
                initial, _ = evaluate(task.model(0), task.loss_fn, task.data.eval_inputs,
                                      task.data.eval_targets)
            branch_loss = math.sqrt(initial * task.target.value)
        ref, start = train_to_target(task, reference_batch, 0,
                                     stop=Target("loss", branch_loss))
        if not ref.reached:
            raise ValueError(f"branched: the reference run at batch {reference_batch} did not "
                             f"reach the branching loss {branch_loss:g} in {task.max_epochs} "
                             f"epochs")
        branch = {"global_batch": reference_batch, "steps": ref.steps, "samples": ref.samples,
                  "loss": ref.curve[-1][1], "branch_loss": branch_loss}
    else:
        branch = {"samples": start["samples"], "from": "checkpoint"}
    runs = []
    for seed in seeds:
        for b in batches:
            run, _ = train_to_target(task, b, 1 + seed, start=start)
            runs.append(run)
            if progress:
                progress(run)
    return Sweep(runs, task.lr_rule.describe(), task.target.describe(), mode="branched",
                 branch=branch)


def noise_scale_at(task: Task, state: Optional[Dict[str, Any]], small_batch: int,
                   big_batch: int, steps: int, seed: int = 0):
    """The gradient noise scale B_simple (hybridplan.noise_scale) of the task's model at `state`
    (a train_to_target state; None: at initialisation), on random training samples."""
    import torch

    data = task.data
    n = int(data.train_targets.shape[0])
    module = task.model(seed)
    if state is not None:
        module.load_state_dict(state["model"])

    def batch(size: int, step: int):
        g = torch.Generator().manual_seed(7_919 * seed + 2 * step + (size > small_batch))
        idx = torch.randint(0, n, (size,), generator=g)
        return (data.train_inputs[idx],), data.train_targets[idx]
    return noise_scale(module, batch, task.loss_fn, small_batch, big_batch, steps)


# ---- the fit ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Fit:
    """S(B) = s_min + e_min / B fitted to the runs that reached the target (least squares on
    the relative error of S); the 16th-84th and 5th-95th percentiles of each value over
    bootstrap resamples of the seeds (whole seeds, each with its runs at every batch)."""
    s_min: float
    e_min: float                   # samples
    critical_batch: float          # e_min / s_min (inf when s_min fits <= 0: no limit seen)
    critical_batch_68: Tuple[float, float]
    critical_batch_90: Tuple[float, float]
    e_min_68: Tuple[float, float]
    s_min_68: Tuple[float, float]
    points: List[Tuple[int, float, float, int]]  # (B, median steps, stdev of steps, seeds)
    residuals: List[float]         # fitted S / median S - 1 per batch
    unreached: List[Tuple[int, int]]  # (B, seed) that did not reach the target
    resamples: int

    def steps(self, global_batch: float) -> float:
        return self.s_min + self.e_min / global_batch

    def to_dict(self) -> dict:
        def finite(v):  # JSON has no infinity: null
            if isinstance(v, float):
                return v if math.isfinite(v) else None
            if isinstance(v, (list, tuple)):
                return [finite(x) for x in v]
            return v
        return {k: finite(v) for k, v in dataclasses.asdict(self).items()}


def _least_squares(points: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
    """(s_min, e_min) minimising sum ((s_min + e_min / B - S) / S)^2; s_min held >= 0."""
    # Weighted linear least squares in x = 1 / B with weights 1 / S^2: closed form, 2x2.
    sw = sx = sy = sxx = sxy = 0.0
    for b, s in points:
        w, x = 1.0 / (s * s), 1.0 / b
        sw += w
        sx += w * x
        sy += w * s
        sxx += w * x * x
        sxy += w * x * s
    det = sw * sxx - sx * sx
    if det > 0:
        s_min = (sy * sxx - sx * sxy) / det
        e_min = (sw * sxy - sx * sy) / det
        if s_min >= 0 and e_min > 0:
            return s_min, e_min
    # The best fit has no steps floor (every batch needs the same samples, or noise says
    # less): S = e_min / B alone.
    return 0.0, sxy / sxx


def fit_critical_batch(runs: Sequence[Run], resamples: int = 1000, seed: int = 0) -> Fit:
    """Fits the critical-batch model to the runs (see Fit); raises ValueError when fewer than
    two batches have a run that reached the target."""
    by_batch: Dict[int, List[int]] = {}
    unreached = []
    for r in runs:
        if r.reached:
            by_batch.setdefault(r.global_batch, []).append(r.steps)
        else:
            unreached.append((r.global_batch, r.seed))
    if len(by_batch) < 2:
        raise ValueError(f"fit_critical_batch: runs at two or more batches must reach the target "
                         f"(reached at {sorted(by_batch)}; not reached: {unreached})")
    batches = sorted(by_batch)
    s_min, e_min = _least_squares([(b, s) for b in batches for s in by_batch[b]])
    # A seed's runs at every batch share its initialisation and data order (a slow seed is slow
    # at every batch), so the resamples draw whole seeds; runs without a shared seed set are
    # drawn within their batch.
    by_seed: Dict[int, List[Tuple[int, int]]] = {}
    for r in runs:
        if r.reached:
            by_seed.setdefault(r.seed, []).append((r.global_batch, r.steps))
    seeds = sorted(by_seed)
    joint = len(seeds) > 1 and all({b for b, _ in by_seed[k]} == set(batches) for k in seeds)
    rng = random.Random(seed)
    crit, emins, smins = [], [], []
    for _ in range(resamples):
        if joint:
            pts = [p for k in rng.choices(seeds, k=len(seeds)) for p in by_seed[k]]
        else:
            pts = [(b, s) for b in batches
                   for s in rng.choices(by_batch[b], k=len(by_batch[b]))]
        s, e = _least_squares(pts)
        crit.append(e / s if s > 0 else math.inf)
        emins.append(e)
        smins.append(s)

    def q(xs, lo, hi):
        xs = sorted(xs)
        pick = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
        return (pick(lo), pick(hi))
    points = [(b, float(statistics.median(by_batch[b])),
               float(statistics.stdev(by_batch[b])) if len(by_batch[b]) > 1 else 0.0,
               len(by_batch[b])) for b in batches]
    residuals = [(s_min + e_min / b) / m - 1 for b, m, _, _ in points]
    return Fit(s_min, e_min, e_min / s_min if s_min > 0 else math.inf, q(crit, 0.16, 0.84),
               q(crit, 0.05, 0.95), q(emins, 0.16, 0.84), q(smins, 0.16, 0.84), points,
               residuals, unreached, resamples)


def predicted_steps(job: dict, global_batch: int, samples_per_epoch: int) -> float:
    """Steps to target at `global_batch` as the Job's convergence model says: its epochs times
    the epoch's samples over the batch (the planner's own rule for time to train)."""
    from .. import planner

    return planner.epochs_to_target(job, global_batch) * samples_per_epoch / global_batch


def convergence_job(fit: Fit, samples_per_epoch: int, *, optimizer: str = "sgd_momentum",
                    per_replica_batch: Any = None, global_batch: Any = None,
                    source: Optional[dict] = None) -> dict:
    """A Job (docs/formats.md) whose convergence model is the fit: critical_batch with
    epochs_min = e_min / samples_per_epoch, or, where no limit was seen (s_min fitted 0), a
    table of the measured median epochs per batch. The measurement rides along under
    "measured_convergence", which the loaders ignore."""
    if fit.s_min > 0:
        convergence = {"model": "critical_batch", "epochs_min": fit.e_min / samples_per_epoch,
                       "critical_batch": fit.critical_batch}
    else:
        convergence = {"model": "table",
                       "points": [[b, b * s / samples_per_epoch] for b, s, _, _ in fit.points]}
    job: Dict[str, Any] = {"schema_version": 1, "kind": "hybridplan.job",
                           "samples_per_epoch": samples_per_epoch, "optimizer": optimizer,
                           "convergence": convergence}
    if per_replica_batch is not None:
        job["per_replica_batch"] = per_replica_batch
    if global_batch is not None:
        job["global_batch"] = global_batch
    job["measured_convergence"] = dict(fit.to_dict(), **(source or {}))
    return job


# ---- the command: measure, fit, compare with the noise scale, write a Job --------------------

def measure_tradeoff(task: Task, batches: Sequence[int], seeds: Sequence[int], *,
                     mode: str = "full", noise: Tuple[int, int, int] = (8, 512, 50),
                     optimizer: str = "sgd_momentum", per_replica_batch: Any = None,
                     progress: Optional[Callable[[Run], None]] = None) -> Dict[str, Any]:
    """Everything the `convergence` command reports: the sweep (full or branched), the fit, the
    measured Job, the gradient noise scale B_simple at initialisation, halfway (in log loss) and
    at the target of one run at the smallest batch, and the Job built from those."""
    if mode not in ("full", "branched"):
        raise ValueError(f"convergence: mode must be 'full' or 'branched' (got {mode!r})")
    sweep = (measure if mode == "full" else branched)(task, batches, seeds, progress=progress)
    fit = fit_critical_batch(sweep.runs)
    n = task.data.num_train
    job = convergence_job(fit, n, optimizer=optimizer, per_replica_batch=per_replica_batch,
                          source={"mode": mode, "lr_rule": sweep.lr_rule,
                                  "target": sweep.target, "seeds": list(seeds)})
    # The noise scale along one run at the smallest batch (halfway: the loss halfway in log
    # between the initial one and a loss target; progress = that run's share of its samples).
    small, big, steps = noise
    smallest = min(batches)
    reference, at_target = train_to_target(task, smallest, seeds[0])
    estimates = [(0.0, noise_scale_at(task, None, small, big, steps, seeds[0]))]
    if task.target.kind == "loss" and reference.reached:
        initial = reference.curve[0][1]
        half_run, half = train_to_target(task, smallest, seeds[0],
                                         stop=Target("loss", math.sqrt(initial * task.target.value)))
        estimates.append((half_run.samples / reference.samples,
                          noise_scale_at(task, half, small, big, steps, seeds[0])))
    estimates.append((1.0, noise_scale_at(task, at_target, small, big, steps, seeds[0])))
    noise_record = [{"progress": p, "b_simple": e.b_simple, "stderr": e.stderr,
                     "small_batch": small, "big_batch": big, "steps": steps} for p, e in estimates]
    point = next(((b, b * s / n) for b, s, _, _ in fit.points), None)
    noise_job = trajectory_job([(p, e.b_simple) for p, e in estimates], point, n,
                               optimizer=optimizer, per_replica_batch=per_replica_batch)
    return {"sweep": sweep.to_dict(), "fit": fit.to_dict(), "job": job, "noise_scale": noise_record,
            "noise_job": noise_job, "samples_per_epoch": n,
            "model_fit_residual_max": max(abs(r) for r in fit.residuals)}


def refit(record: Dict[str, Any], source: str = "record") -> Dict[str, Any]:
    """`record` (what measure_tradeoff returned, as the command writes it) with its fit and its
    measured Job made again from its runs: a change to the fit, without training again."""
    try:
        runs = [Run(**r) for r in record["sweep"]["runs"]]
        job = dict(record["job"])
        n = record["samples_per_epoch"]
    except (KeyError, TypeError) as e:
        raise ValueError(f"{source}: not a convergence record ({e})") from None
    fit = fit_critical_batch(runs)
    source_fields = {k: v for k, v in job.get("measured_convergence", {}).items()
                     if k in ("mode", "lr_rule", "target", "seeds")}
    new_job = convergence_job(fit, n, optimizer=job.get("optimizer", "sgd_momentum"),
                              per_replica_batch=job.get("per_replica_batch"),
                              global_batch=job.get("global_batch"), source=source_fields)
    return dict(record, fit=fit.to_dict(), job=new_job,
                model_fit_residual_max=max(abs(r) for r in fit.residuals))
