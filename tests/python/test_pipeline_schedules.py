"""The multi-stage pipeline schedules (the plan's "schedule" "interleaved-1f1b", "interleaved-zb"
and "zbv" with "virtual_stages": 2; executor/pipeline.py) train like one process.

Two launches of Gloo ranks (dist_harness): 2 ranks (dp=1 x mp=2, 4 stages) train torch's
nn.TransformerEncoderLayer stack (user_models.transformer_stack) and Hugging Face GPT-2 built
from a config (tied wte / lm_head: on ranks 0 and 1 under the interleaved schedules, both on
rank 0 under zbv, whose last stage is on rank 0) under each schedule, and with recompute;
user_models.shared_seq2seq (one embedding module shared by its encoder and decoder, so tied
across stages; a stage whose input gradient autograd returns non-contiguous, which Gloo cannot
send) under interleaved-zb, and a model whose last stage's graph saves one of its outputs
(ReturnedAndRead) under zbv. 4 ranks (dp=2 x mp=2) add data parallelism: interleaved-1f1b x
zero2 (FSDP2), and the zero-bubble schedules under DDP and under zero2; the DDP runs measure the
gradient noise scale (a DDP comm hook on each stage), which must equal a 1F1B run's. After
STEPS steps every rank's gathered state_dict equals one process trained on the global batch
(torch.allclose(rtol=1e-4, atol=1e-6), as test_user_models), and every rank returned the
replica's loss of each step (the zbv loss comes from rank 0). The recorded actions name this
rank's stages: F and B, or under a zero-bubble schedule F, I and W.

Single-process units: split_backward's input and weight passes give the gradients of one
backward on stages where torch's own split fails or is wrong, and the plan's stage layout.
`pytest -s -k equality_table` prints the measured table (docs).
"""

import collections
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dist_harness import format_results, run_ranks
from plan_builders import share
from user_models import FACTORIES, call

STEPS, LR, MOMENTUM = 3, 0.05, 0.9


class ReturnedAndRead(nn.Module):
    """Returns a tanh's result that its head also reads: the last stage's graph saves one of
    its own outputs (tanh's backward reads its result), which torch detaches in place after the
    stage's I pass, before W."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        h = torch.tanh(x)
        return h, self.head(h)


def returned_and_read():
    torch.manual_seed(0)

    def batch(n, seed):
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(n, 8, generator=g),), torch.randint(0, 4, (n,), generator=g)

    def loss(output, target):
        return F.cross_entropy(output[1], target) + output[0].square().mean()
    return ReturnedAndRead(), batch, loss


MODELS = dict(FACTORIES, returned_and_read=returned_and_read)
PER_REPLICA, MICROBATCHES = 8, 4
# (model, schedule, dp, sharding, recompute: the stages whose forward is recomputed)
CASES = [(m, s, 1, "none", ()) for m in ("transformer_stack", "gpt2")
         for s in ("interleaved-1f1b", "interleaved-zb", "zbv")] + [
    ("shared_seq2seq", "interleaved-zb", 1, "none", ()),
    ("returned_and_read", "zbv", 1, "none", ()),
    ("transformer_stack", "interleaved-1f1b", 1, "none", (1, 3)),
    ("gpt2", "zbv", 1, "none", (0, 2)),
    ("gpt2", "interleaved-1f1b", 2, "zero2", ()),
    ("gpt2", "interleaved-zb", 2, "none", ()),
    ("gpt2", "zbv", 2, "zero2", ()),
    ("gpt2", "1f1b", 2, "none", ()),  # one stage per rank: the noise scale's reference
]


def case_id(case):
    name, schedule, dp, sharding, rc = case
    parts = [name, schedule, f"dp{dp}"]
    if dp > 1:
        parts.append("ddp" if sharding == "none" else sharding)
    if rc:
        parts.append("rc" + "".join(map(str, rc)))
    return "-".join(parts)


IDS = [case_id(c) for c in CASES]


def sgd(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def virtual_stages(schedule):
    return 1 if schedule in ("gpipe", "1f1b") else 2


def plan_of(case, model, example):
    from hybridplan.hand_plans import hand_plan
    name, schedule, dp, sharding, rc = case
    plan = hand_plan(model, mode="pipeline", dp=dp, mp=2, schedule=schedule,
                     num_microbatches=MICROBATCHES, per_replica_batch=PER_REPLICA,
                     example_inputs=example, virtual_stages=virtual_stages(schedule))
    if sharding != "none":
        plan["sharding"] = sharding
    if rc:
        plan["assignment"] = [dict(a, recompute=True) if a["device"] in rc else a
                              for a in plan["assignment"]]
    return plan


# ---- rank side --------------------------------------------------------------------------------

ZERO_BUBBLE = ("interleaved-zb", "zbv")


def _watch_last_stage(runner):
    """On this rank's last stage (if it holds it): weak references to the activations each
    micro-batch's forward saves for backward (saved tensors an op computed: not parameters, not
    received inputs), and after each W how many of that micro-batch's are still alive. The
    returned list fills as the next step runs."""
    import weakref

    alive = []
    for stage in runner.stages:
        if not stage.is_last:
            continue
        saved = {}
        forward, weight = stage.forward_one_chunk, stage.backward_weight_one_chunk

        def forward_one_chunk(chunk, *args, _forward=forward, _saved=saved, **kwargs):
            refs = _saved.setdefault(chunk, [])

            def pack(t):
                if t.grad_fn is not None:
                    refs.append(weakref.ref(t))
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                return _forward(chunk, *args, **kwargs)

        def backward_weight_one_chunk(chunk, *args, _weight=weight, _saved=saved, **kwargs):
            out = _weight(chunk, *args, **kwargs)
            alive.append(sum(ref() is not None for ref in _saved.pop(chunk, [])))
            return out
        stage.forward_one_chunk = forward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk
    return alive


def train_cases(cases, out_dir):
    """Trains every case of `cases` (dp * 2 == this world) in turn; saves <id>.rank<r>.pt."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel
    import hybridplan
    from hybridplan.executor import destroy_groups
    torch.set_num_threads(1)
    for case in map(tuple, cases):
        name, schedule, dp = case[:3]
        model, batch, loss_fn = MODELS[name]()
        example = share(batch(dp * PER_REPLICA, 100)[0], dp, 0)
        ddp = dp > 1 and case[3] == "none"  # DDP: measure the noise scale (its comm hooks)
        hp = hybridplan.apply(plan_of(case, model, example), model, loss_fn=loss_fn,
                              optimizer=sgd, timeout_s=60, example_inputs=example,
                              measure_noise_scale=1 if ddp else 0)
        losses, alive_after_weight = [], None
        for step in range(STEPS):
            hp.record_actions(step == STEPS - 1)
            if step == STEPS - 1 and schedule in ZERO_BUBBLE and not case[4]:
                alive_after_weight = _watch_last_stage(hp._runner)
            losses.append(hp.step(*hp.shard(*batch(dp * PER_REPLICA, 100 + step))).item())
        runner = hp._runner
        result = {
            "state": hp.state_dict(), "losses": losses, "stages": hp.stages,
            "actions": sorted({(kind, stage) for kind, stage, *_ in hp.recorded_actions}),
            "action_tuples": {len(a) for a in hp.recorded_actions},
            "recomputed": [getattr(m.forward, "_hybridplan_recompute", False)
                           for m in runner.modules],
            "sharded": [isinstance(p, DTensor) for p in hp.parameters()],
            "ddp": [isinstance(s.submod, DistributedDataParallel) for s in runner.stages],
            "alive_after_weight": alive_after_weight,
        }
        if ddp:
            estimate = hp.noise_scale()
            result["noise"] = (estimate.small_sq_norms, estimate.big_sq_norms)
        torch.save(result, os.path.join(out_dir, f"{case_id(case)}.rank{dist.get_rank()}.pt"))
    destroy_groups()


# ---- test side --------------------------------------------------------------------------------

def reference(name, global_batch):
    """(state_dict, per-replica losses per step) of one process on the global batch; the
    losses of replica r are its share's mean loss under the weights of that step."""
    torch.set_num_threads(1)
    model, batch, loss_fn = MODELS[name]()
    opt = sgd(model.parameters())
    losses = []
    for step in range(STEPS):
        inputs, target = batch(global_batch, 100 + step)
        dp = global_batch // PER_REPLICA
        with torch.no_grad():
            losses.append([loss_fn(call(model, share(inputs, dp, r)), share(target, dp, r)).item()
                           for r in range(dp)])
        opt.zero_grad()
        loss_fn(call(model, inputs), target).backward()
        opt.step()
    return model.state_dict(), losses


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    out_dir = tmp_path_factory.mktemp("pipeline_schedules")
    failures = {}
    for dp in sorted({c[2] for c in CASES}):
        cases = [list(c) for c in CASES if c[2] == dp]
        results = run_ranks("test_pipeline_schedules:train_cases", dp * 2,
                            {"cases": cases, "out_dir": str(out_dir)}, timeout_s=300)
        if not all(r.returncode == 0 for r in results):
            failures[dp] = format_results(results)
    loaded = {}
    for case in CASES:
        world = case[2] * 2
        paths = [out_dir / f"{case_id(case)}.rank{r}.pt" for r in range(world)]
        loaded[case_id(case)] = ([torch.load(p) for p in paths] if all(p.exists() for p in paths)
                                 else failures.get(case[2], "no output"))
    return loaded


def _worst(outs, want):
    return max((out["state"][k].float() - want[k].float()).abs().max().item()
               for out in outs for k in want)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_schedule_trains_like_one_process(trained, case):
    from hybridplan.planner import stage_ranks
    outs = trained[case_id(case)]
    if isinstance(outs, str):
        pytest.fail(f"the ranks did not finish {case_id(case)}:\n{outs}")
    name, schedule, dp, sharding, rc = case
    want, losses = reference(name, dp * PER_REPLICA)
    initial = MODELS[name]()[0].state_dict()
    assert any(not torch.equal(want[k], initial[k]) for k in initial)  # it trained
    v = virtual_stages(schedule)
    ranks = stage_ranks(schedule, 2, v)
    split = schedule in ("interleaved-zb", "zbv")
    for rank, out in enumerate(outs):
        mine = [s for s in range(2 * v) if ranks[s] == rank % 2]
        assert out["stages"] == mine
        assert out["actions"] == sorted((k, s) for k in (("F", "I", "W") if split else ("F", "B"))
                                        for s in mine)
        assert out["action_tuples"] == {5}  # (kind, stage, micro-batch, start, end)
        assert out["recomputed"] == [s in rc for s in mine]
        assert set(out["sharded"]) == {sharding != "none"}
        assert out["ddp"] == [dp > 1 and sharding == "none"] * len(mine)
        assert list(out["state"]) == list(want)
        for key in want:
            assert torch.allclose(out["state"][key], want[key], rtol=1e-4, atol=1e-6), (
                f"{case_id(case)} rank {rank}: {key} differs by "
                f"{(out['state'][key] - want[key]).abs().max().item():.3g}")
        replica = rank // 2
        got = out["losses"]
        assert got == pytest.approx([step[replica] for step in losses], rel=1e-4, abs=1e-6)


# Still holding some of a micro-batch's activations after its W, with the loss and outputs
# detached: a last stage whose decoder layer reads an encoder's output from another stage
# (4 saved tensors a micro-batch, its feed-forward's among them), and shared_seq2seq's (1).
# What references them is not found (not a reference cycle: gc.collect frees none).
_HOLDS_AFTER_WEIGHT = {"transformer_stack", "shared_seq2seq"}


@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.xfail(strict=True, reason="holds saved tensors after W"))
    if c[0] in _HOLDS_AFTER_WEIGHT else c
    for c in CASES if c[1] in ZERO_BUBBLE and not c[4]], ids=case_id)
def test_zero_bubble_last_stage_frees_a_microbatch_after_its_weight_pass(trained, case):
    """The last stage's I keeps its graph (retain_graph: W runs its weight side) and the
    schedule keeps each micro-batch's loss to the step's end; unless the loss and the outputs
    are detached once W is done, every micro-batch's activations stay until then (a
    transformer's ZB-V last stage: 5.2 MiB a micro-batch), which the memory model does not
    charge. Counted on the rank that holds the last stage, in the last step."""
    outs = trained[case_id(case)]
    if isinstance(outs, str):
        pytest.fail(outs)
    counts = [n for out in outs for n in (out["alive_after_weight"] or [])]
    assert len(counts) == MICROBATCHES * case[2], counts  # one W per micro-batch per replica
    assert counts == [0] * len(counts), counts


def test_noise_scale_under_zero_bubble_equals_one_stage_per_rank(trained):
    """The DDP comm hooks of every stage a rank holds feed the noise-scale meter, and under a
    zero-bubble schedule DDP reduces from the W passes: the measured |g_b|^2 and |g_B|^2 of
    each step equal those of the same training with one stage per rank (1F1B)."""
    zero_bubble = trained[case_id(("gpt2", "interleaved-zb", 2, "none", ()))]
    one_stage = trained[case_id(("gpt2", "1f1b", 2, "none", ()))]
    for outs in (zero_bubble, one_stage):
        if isinstance(outs, str):
            pytest.fail(f"the ranks did not finish:\n{outs}")
    for a, b in zip(zero_bubble, one_stage):
        for got, want in zip(a["noise"], b["noise"]):
            assert len(got) == STEPS and got == pytest.approx(want, rel=1e-5)


def test_equality_table(trained):
    """Schedule x composition x model -> max |difference| from one process over every rank and
    state entry, as a markdown table (`pytest -s -k equality_table`)."""
    rows = ["| schedule | composition | model | ranks | max abs difference |",
            "|---|---|---|---|---|"]
    for case in CASES:
        outs = trained[case_id(case)]
        assert not isinstance(outs, str), f"{case_id(case)} did not run"
        name, schedule, dp, sharding, rc = case
        parts = ["dp=2 " + ("DDP" if sharding == "none" else sharding)] if dp > 1 else []
        parts += [f"recompute stages {', '.join(map(str, rc))}"] if rc else []
        what = " + ".join(parts) or "pipeline only"
        worst = _worst(outs, reference(name, dp * PER_REPLICA)[0])
        rows.append(f"| {schedule} (v={virtual_stages(schedule)}) | {what} | {name} | "
                    f"{dp} x 2 | {worst:.1e} |")
    print("\n" + "\n".join(rows))


# ---- single process ----------------------------------------------------------------------------

def _stage_grads(model_name, stages):
    """Per stage s >= 1 of an even cut of `model_name` into `stages`, run on what the stages
    before it send: (s, (split_backward's parameter and input gradients), (one backward's)),
    the same random output gradients for both."""
    from hybridplan.autograd import split_backward
    from hybridplan.hand_plans import even_split, nodes_in_call_order
    from hybridplan.profiler import stage_split
    torch.manual_seed(0)
    model, batch, loss_fn = FACTORIES[model_name]()
    inputs, target = batch(2, 0)
    args, kwargs = ((), inputs) if isinstance(inputs, dict) else (tuple(inputs), {})
    names = nodes_in_call_order(model, inputs)
    cut = stage_split.split(model, args, kwargs, even_split(names, stages), stages)
    received = cut.flatten_inputs(args, kwargs)
    results = []
    for s in range(stages):
        module = cut.stages[s]
        meta, _ = cut.meta_of(s)
        if s == 0:
            with torch.no_grad():
                received = module(*received)
            continue
        per_way = []
        for way in ("split", "full"):
            xs = [x.detach().requires_grad_(m.requires_grad) for x, m in zip(received, meta)]
            out = module(*xs)
            if s == stages - 1:
                outputs, grads = (loss_fn(cut.unflatten_outputs(out), target),), None
            else:
                g = torch.Generator().manual_seed(s)
                outputs = out
                grads = [torch.randn(t.shape, generator=g) if t.requires_grad else None
                         for t in out]
            for p in module.parameters():
                p.grad = None
            if way == "split":
                dx, state = split_backward.backward_input(outputs, grads, xs,
                                                          list(module.parameters()))
                split_backward.backward_weight(state)
            else:
                pairs = [(o, torch.ones_like(o) if grads is None else gr)
                         for o, gr in zip(outputs, grads or [None] * len(outputs))
                         if o.requires_grad and (grads is None or gr is not None)]
                torch.autograd.backward([o for o, _ in pairs], [gr for _, gr in pairs])
                dx = [x.grad for x in xs]
            per_way.append(({n: p.grad for n, p in module.named_parameters()}, list(dx)))
        results.append((s, *per_way))
        with torch.no_grad():
            received = module(*received)
    return results


@pytest.mark.parametrize("model_name,stages", [("transformer_stack", 4), ("shared_seq2seq", 4),
                                               ("gpt2", 4), ("albert", 4)])
def test_split_backward_equals_one_backward(model_name, stages):
    """Stages on which torch 2.13's own split (stage_backward_input / _weight) fails or is
    wrong, each way split_backward's module doc lists: a transformer_stack stage sends a view
    (detach_ fails) and its stage 2 (tgt_embed and a decoder layer, whose target input needs no
    gradient) gets wrong tgt_embed gradients from groups that run through each other's
    intermediates; shared_seq2seq's stage 1 holds parameters reached only from batch inputs,
    which torch leaves without a gradient; GPT-2's stage 1 sends a tensor its graph saved,
    which torch's in-place detach breaks for W. ALBERT's stages call one shared layer several
    times: one transposed weight read by matmuls that follow each other."""
    if model_name == "gpt2":
        pytest.importorskip("transformers")
    for s, (split_grads, split_dx), (full_grads, full_dx) in _stage_grads(model_name, stages):
        assert {n for n, g in split_grads.items() if g is None} == \
            {n for n, g in full_grads.items() if g is None}, s
        for n, g in full_grads.items():
            if g is not None:
                torch.testing.assert_close(split_grads[n], g, rtol=1e-6, atol=1e-7,
                                           msg=lambda m, n=n: f"stage {s} {n}: {m}")
        for a, b in zip(split_dx, full_dx):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
                assert a.is_contiguous()  # it is sent (shared_seq2seq's is not, as returned)


def test_split_backward_with_a_weight_read_twice_along_one_path():
    """x @ w @ w: w's two uses lie on one path (pytorch/pytorch#180952), and a stage input that
    needs no gradient beside one that does."""
    from hybridplan.autograd import split_backward
    torch.manual_seed(0)
    w = torch.randn(3, 3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    x = torch.randn(2, 3, requires_grad=True)
    mask = torch.randn(2, 3)
    grads = []
    for way in ("split", "full"):
        w.grad = b.grad = x.grad = None
        out = torch.tanh(x @ w @ w + b) * mask
        g = torch.ones_like(out)
        if way == "split":
            (dx, _), state = split_backward.backward_input([out], [g], [x, mask], [w, b])
            split_backward.backward_weight(state)
        else:
            out.backward(g)
            dx = x.grad
        grads.append((w.grad.clone(), b.grad.clone(), dx.clone()))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("bias", [True, False])
def test_split_backward_runs_a_recurrence_once(bias):
    """An LSTM run step by step, whose every step's gates add one bias (a weight-side node that
    every step's boundary node reaches): W equals one backward's gradients and runs each node of
    the recurrence at most twice (quiet in the bias's pass, which runs through the recurrence,
    and from its recorded gradient in its own). Before the boundary nodes that meet at one
    node ran in one pass, W ran the recurrence below each step again, 12 times at 12 steps."""
    from hybridplan.autograd import split_backward
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(6, 6, proj_size=4, batch_first=True, bias=bias)
    x = torch.randn(2, 12, 6, requires_grad=True)
    params = list(lstm.parameters())
    out, _ = lstm(x.clone())
    out.backward(torch.ones_like(out))
    want = [p.grad.clone() for p in params] + [x.grad.clone()]
    for p in params:
        p.grad = None
    out, _ = lstm(x.clone())
    (dx,), state = split_backward.backward_input([out], [torch.ones_like(out)], [x], params)
    runs = collections.Counter()
    seen, stack = set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        node.register_prehook(lambda grads, node=node: runs.update([node]))
        stack.extend(child for child, _ in node.next_functions)
    split_backward.backward_weight(state)
    assert runs and max(runs.values()) <= 2, sorted(
        (type(n).__name__, k) for n, k in runs.items() if k > 2)[:5]
    for got, expected in zip([p.grad for p in params] + [dx], want):
        torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_stage_layout_of_the_plan():
    """The stages each pipeline rank holds (PlanSpec, from the core's stage_ranks)."""
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    from hybridplan.executor.layout import Layout
    from hybridplan.executor.plan_spec import parse_plan
    model, batch, _ = FACTORIES["transformer_stack"]()
    example = batch(PER_REPLICA, 0)[0]
    expected = {"interleaved-1f1b": [[0, 2], [1, 3]], "interleaved-zb": [[0, 2], [1, 3]],
                "zbv": [[0, 3], [1, 2]]}
    for schedule, stages in expected.items():
        spec = parse_plan(plan_of((None, schedule, 2, "none", ()), model, example))
        assert (spec.virtual_stages, spec.num_stages) == (2, 4)
        assert [spec.stages_of(k) for k in range(2)] == stages
        layout = Layout.of(spec)
        assert layout.stage_of(3) == 1 and layout.dp_group_ranks(1) == [1, 3]
    from hybridplan.hand_plans import hand_plan
    spec = parse_plan(hand_plan(model, mode="pipeline", dp=1, mp=2, schedule="1f1b",
                                num_microbatches=MICROBATCHES, per_replica_batch=PER_REPLICA,
                                example_inputs=example))
    assert (spec.virtual_stages, spec.stages_of(0), spec.stages_of(1)) == (1, [0], [1])
