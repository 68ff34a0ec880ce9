"""The executor's pure parts, without a process group: plan parsing, plan-vs-module checks, the
export-based stage cut (profiler.stage_split) and the cross-rank judgement."""

import copy
import json

import pytest
import torch
from torch import nn

import hybridplan.models as models
from hybridplan.executor.calls import first_microbatch
from hybridplan.executor.checks import check_module, local_checks
from hybridplan.executor.layout import Layout
from hybridplan.executor.pipeline import merge_states
from hybridplan.executor.plan_spec import parse_plan, sha256_hex
from hybridplan.executor.rank_agreement import RankReport, judge, param_signature
from hybridplan.profiler import stage_split
from plan_builders import nodes_in_call_order, pipeline_plan, placement_plan


def small_cnn():
    return models.branchy_cnn(seed=0, width=4, image_size=8)


# ---- plan parsing -----------------------------------------------------------------------------

def test_plan_is_accepted_as_dict_path_or_object(tmp_path):
    plan = pipeline_plan(small_cnn(), dp=2, mp=2, schedule="gpipe", num_microbatches=2)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))

    class PlanLike:
        def to_dict(self):
            return copy.deepcopy(plan)

    specs = [parse_plan(plan), parse_plan(str(path)), parse_plan(PlanLike())]
    assert {s.sha256 for s in specs} == {sha256_hex(plan)}
    spec = specs[0]
    assert spec.num_processes == 4
    layout = Layout.of(spec)
    assert (layout.dp_group_ranks(1), layout.replica_ranks(1)) == ([1, 3], [2, 3])
    assert (layout.replica_of(3), layout.stage_of(3)) == (1, 1)


def test_bad_plans_get_the_cores_message():
    """parse_plan validates through the core; every message is in test_plan_validation.py."""
    plan = pipeline_plan(small_cnn(), dp=2, mp=2, schedule="gpipe", num_microbatches=2)
    plan["world_size"] = 3
    with pytest.raises(ValueError, match=r"^plan: world_size must equal dp \* mp = 4 \(got 3\)$"):
        parse_plan(plan)


def test_unreadable_plan_path_is_named(tmp_path):
    with pytest.raises(ValueError, match="missing.json: cannot be read"):
        parse_plan(str(tmp_path / "missing.json"))


# ---- plan against module and job --------------------------------------------------------------

def test_assignment_names_must_be_graph_nodes():
    model = small_cnn()
    plan = placement_plan(model, dp=1, mp=2)
    plan["assignment"][0]["name"] = "stem.convv"
    with pytest.raises(ValueError) as e:
        check_module(parse_plan(plan), model)
    assert "assignment names must be graph nodes of BranchyCNN (got 1 unknown: ['stem.convv'])" \
        in str(e.value)


def test_every_node_with_parameters_must_be_assigned():
    model = small_cnn()
    plan = placement_plan(model, dp=1, mp=2)
    plan["assignment"] = [a for a in plan["assignment"] if a["name"] != "fc"]
    with pytest.raises(ValueError, match=r"missing 1 of BranchyCNN: \['fc'\]"):
        check_module(parse_plan(plan), model)


def test_world_size_must_match_the_mode():
    model = small_cnn()
    spec = parse_plan(placement_plan(model, dp=2, mp=2))
    with pytest.raises(ValueError, match=r"placement plan needs world size 2 \(one process per "
                                         r"replica, world = dp; dp=2, mp=2\) \(got world size 4\)"):
        local_checks(spec, model, None, 4)
    assert local_checks(spec, model, None, 2) is None


def test_graph_hash_must_match():
    model = small_cnn()
    spec = parse_plan(placement_plan(model, dp=1, mp=1))

    class GraphLike:  # what hybridplan.planner.Graph offers: its canonical JSON's sha256
        sha256 = "ab" * 32
    with pytest.raises(ValueError, match="graph.sha256 must match the graph applied"):
        local_checks(spec, model, GraphLike(), 1)


def test_apply_outside_a_distributed_job_says_so(monkeypatch):
    import hybridplan
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    model = small_cnn()
    with pytest.raises(ValueError, match=r"must run inside a torch.distributed job \(launch with "
                                         r"torchrun\): environment variables \['RANK'"):
        hybridplan.apply(placement_plan(model, dp=1, mp=1), model)


def _cut(model, stage_of, mp, batch=2):
    return stage_split.split(model, model.example_inputs(batch), {}, stage_of, mp)


def test_stages_must_be_contiguous_in_execution_order():
    model = small_cnn()
    names = nodes_in_call_order(model)
    stages = {n: 0 if i < len(names) // 2 else 1 for i, n in enumerate(names)}
    stages[names[1]] = 1  # names[2] (stage 0) runs after it
    with pytest.raises(ValueError) as e:
        _cut(model, stages, 2)
    assert (f"plan: assignment must be contiguous in execution order: module '{names[2]}' "
            f"(stage 0) runs after module '{names[1]}' (stage 1)") in str(e.value)


def test_a_stage_without_operations_is_named():
    model = small_cnn()
    names = nodes_in_call_order(model)
    with pytest.raises(ValueError, match="plan: assignment stage 2 must run an operation"):
        _cut(model, {n: 0 if i < 3 else 1 for i, n in enumerate(names)}, 3)


def _run_stages(cut, args, kwargs=None):
    values = cut.flatten_inputs(args, kwargs or {})
    for stage in cut.stages:
        values = stage(*values)
    return cut.unflatten_outputs(values)


@pytest.mark.parametrize("name,mp", [("branchy_cnn", 3), ("gnmt_lstm", 3), ("biglstm", 2)])
def test_stages_compose_to_the_original_forward(name, mp):
    kwargs = {"branchy_cnn": dict(width=4, image_size=8),
              "gnmt_lstm": dict(vocab_size=32, hidden_size=8, src_len=4, tgt_len=4),
              "biglstm": dict(vocab_size=64, embed_size=8, hidden_size=16, seq_len=4)}[name]
    model = models.get(name, seed=0, **kwargs)
    plan = pipeline_plan(model, dp=1, mp=mp, schedule="gpipe", num_microbatches=1)
    cut = _cut(model, parse_plan(plan).assignment, mp, batch=3)
    inputs = model.example_inputs(3)
    torch.testing.assert_close(_run_stages(cut, inputs), model(*inputs), rtol=0, atol=0)
    # every stage receives exactly what its predecessor sends, with the metadata given
    for s in range(1, mp):
        assert cut.stages[s].carry_in == cut.stages[s - 1].carry_out
        assert [m.shape for m in cut.carry_meta[s]] == [
            t.shape for t in cut.stages[s].carry_in and _carried(cut, inputs, s)]
    # the stages' parameters and buffers partition the model's
    owned = [stage_split.original_name(k) for st in cut.stages for k in st.state_dict()]
    assert sorted(owned) == sorted(model.state_dict())


def test_stages_run_generated_code_not_the_fx_interpreter():
    # torch.fx.Interpreter costs ~20 us per graph node per call (stage_split._run_generated_code);
    # every outlined module of every stage must run the graph's generated code instead, and the
    # stages must still compute the model's forward and gradients exactly.
    model = models.get("branchy_cnn", seed=0, width=4, image_size=8)
    plan = pipeline_plan(model, dp=1, mp=2, schedule="gpipe", num_microbatches=1)
    cut = _cut(model, parse_plan(plan).assignment, 2, batch=3)
    outlined = [m for st in cut.stages for m in st.modules() if hasattr(m, "_run_with_interpreter")]
    assert outlined and not any(m._run_with_interpreter for m in outlined)
    inputs = model.example_inputs(3)
    _run_stages(cut, inputs).sum().backward()
    model(*inputs).sum().backward()
    grads = {stage_split.original_name(k): p.grad for st in cut.stages
             for k, p in st.named_parameters()}
    for k, p in model.named_parameters():
        torch.testing.assert_close(grads[k], p.grad, rtol=0, atol=0)


class _SelfNamed(nn.Module):
    """Like Hugging Face BERT's attention: a submodule named `self`."""

    def __init__(self):
        super().__init__()
        self.self = nn.Linear(4, 4)
        self.output = nn.Linear(4, 4)

    def forward(self, x):
        return self.output(torch.relu(self.self(x)))


def test_a_submodule_named_self_runs_as_generated_code():
    # torch's generated code would bind the call's value to `self` and shadow forward's self
    torch.manual_seed(0)
    model = nn.Sequential(_SelfNamed(), _SelfNamed(), nn.Linear(4, 2))
    names = nodes_in_call_order(model)
    cut = stage_split.split(model, (torch.randn(3, 4),), {},
                            {n: 0 if i < 4 else 1 for i, n in enumerate(names)}, 2)
    x = torch.randn(3, 4)
    torch.testing.assert_close(_run_stages(cut, (x,)), model(x), rtol=0, atol=0)


def _carried(cut, inputs, upto):
    values = cut.flatten_inputs(inputs, {})
    for stage in cut.stages[:upto]:
        values = stage(*values)
    return values


def test_values_skip_no_stage_and_batch_inputs_reach_later_stages():
    """h from stage 0 is read on stage 2 and x (a batch input) on stage 1: stage 1 passes h on,
    stage 0 passes x on (torch's traced stages support neither)."""
    class Skip(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(8, 4), nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            return self.b(torch.cat([h, x], dim=1)) + self.c(h)
    model = Skip()
    cut = stage_split.split(model, (torch.randn(2, 4),), {}, {"a": 0, "b": 1, "c": 2}, 3)
    x, h = ("input", 0), ("stage", 0, 0)
    assert set(cut.stages[0].carry_out) == {x, h} and h in cut.stages[1].carry_out
    inputs = (torch.randn(2, 4),)
    torch.testing.assert_close(_run_stages(cut, inputs), model(*inputs), rtol=0, atol=0)


def test_keyword_inputs_and_structured_outputs():
    class Dicty(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x, mask=None, scale=2.0):
            h = self.a(x) * mask
            return {"logits": self.b(h) * scale, "hidden": (h, None)}
    model = Dicty()
    x, mask = torch.randn(2, 4), torch.ones(2, 4)
    cut = stage_split.split(model, (x,), {"mask": mask, "scale": 2.0}, {"a": 0, "b": 1}, 2)
    out = _run_stages(cut, (x,), {"mask": mask, "scale": 2.0})
    expected = model(x, mask=mask)
    assert out["hidden"][1] is None
    torch.testing.assert_close(out["logits"], expected["logits"], rtol=0, atol=0)
    with pytest.raises(ValueError, match="non-tensor input 2 must equal the example's"):
        cut.flatten_inputs((x,), {"mask": mask, "scale": 3.0})


def test_tied_weights_are_copied_onto_each_stage_and_listed():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.mid, self.head = nn.Embedding(8, 4), nn.Linear(4, 4), nn.Linear(4, 8)
            self.head.weight = self.embed.weight

        def forward(self, ids):
            return self.head(self.mid(self.embed(ids)))
    model = Tied()
    cut = stage_split.split(model, (torch.randint(0, 8, (2, 3)),), {},
                            {"embed": 0, "mid": 0, "head": 1}, 2)
    assert cut.tied == [{0: "module.embed.weight", 1: "module.head.weight"}]
    copies = [cut.stages[s].part.get_parameter(cut.tied[0][s]) for s in (0, 1)]
    assert copies[0] is not copies[1] and torch.equal(copies[0], copies[1])
    # stage 0 keeps no unused alias of the tied weight (no parameter without a gradient)
    assert [k for k, _ in cut.stages[0].named_parameters()] == [
        "part.module.embed.weight", "part.module.mid.weight", "part.module.mid.bias"]
    # a state_dict merged from the stages names both tied keys
    parts = [{stage_split.original_name(k): v for k, v in st.state_dict().items()}
             for st in cut.stages]
    merged = merge_states(model, parts)
    assert list(merged) == list(model.state_dict())
    torch.testing.assert_close(merged["head.weight"], merged["embed.weight"])


def test_a_module_called_on_two_stages_is_tied_and_one_tensor_within_a_stage():
    """l applied three times, calls 0 and 1 on stage 0, call 2 on stage 1: stage 0 holds one
    tensor for both its calls (the outliner had made a copy per call), stage 1 a copy, and the
    cut lists each parameter as tied between the two stages; the stages compose to the model."""
    class Loop(nn.Module):
        def __init__(self):
            super().__init__()
            self.l, self.head = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            for _ in range(3):
                x = torch.tanh(self.l(x))
            return self.head(x)
    model = Loop()
    x = torch.randn(2, 4)
    cut = stage_split.split(model, (x,), {}, {"l": 0, "l@1": 0, "l@2": 1, "head": 1}, 2)
    assert len(cut.tied) == 2 and all(set(uses) == {0, 1} for uses in cut.tied)
    stage0 = {id(p) for p in cut.stages[0].parameters()}
    assert len(stage0) == 2  # l.weight and l.bias, whatever calls the outliner kept apart
    assert sorted({stage_split.original_name(k) for k, _ in
                   cut.stages[1].named_parameters()}) == ["head.bias", "head.weight", "l.bias",
                                                          "l.weight"]
    torch.testing.assert_close(_run_stages(cut, (x,)), model(x), rtol=0, atol=0)


def test_no_grad_regions_inside_a_module_are_cut_and_keep_their_mode():
    """A module computing under torch.no_grad() (a Llama rotary embedding) is one region that
    torch.export wraps in a higher-order op; the cut inlines it, its outputs carry no gradient,
    and the caller's grad mode is restored."""
    class Rotary(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("freq", torch.arange(4.0))

        @torch.no_grad()
        def forward(self, x):
            return torch.cos(x[..., :1] * self.freq), torch.sin(x[..., :1] * self.freq)

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.rotary = nn.Linear(4, 4), Rotary()
            self.l0, self.l1 = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            h = self.embed(x)
            cos, sin = self.rotary(h)
            h = self.l0(h * cos + sin)
            return self.l1(h * cos - sin)
    model = Decoder()
    x = torch.randn(2, 4)
    cut = stage_split.split(model, (x,), {}, {"embed": 0, "rotary": 0, "l0": 0, "l1": 1}, 2)
    hops = [n for st in cut.stages for m in st.modules() if hasattr(m, "graph")
            for n in m.graph.nodes if "wrap_with" in str(n.target)]
    assert hops == []
    out = _run_stages(cut, (x,))
    assert torch.is_grad_enabled() and out.requires_grad
    torch.testing.assert_close(out, model(x), rtol=0, atol=0)


def test_autocast_regions_inside_a_module_are_cut_and_keep_their_mode():
    """An autocast block inside a module (bfloat16 matmul) is inlined as the no_grad region
    is; the stages compute what the model does and autocast is off again afterwards."""
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("freq", torch.arange(4.0))

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return torch.cos(x[..., :1] * self.freq) @ torch.ones(4, 4)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.mixed, self.b = nn.Linear(4, 4), Mixed(), nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            return self.b(h * self.mixed(h).float())
    model = Net()
    x = torch.randn(2, 4)
    cut = stage_split.split(model, (x,), {}, {"a": 0, "mixed": 0, "b": 1}, 2)
    out = _run_stages(cut, (x,))
    assert not torch.is_autocast_enabled("cpu")
    torch.testing.assert_close(out, model(x), rtol=0, atol=0)


def test_parameter_free_nodes_may_be_left_out():
    model = small_cnn()
    plan = pipeline_plan(model, dp=1, mp=2, schedule="gpipe", num_microbatches=1)
    plan["assignment"] = [a for a in plan["assignment"] if a["name"] != "pool"]
    spec = parse_plan(plan)
    check_module(spec, model)
    cut = _cut(model, spec.assignment, 2)
    inputs = model.example_inputs(2)
    torch.testing.assert_close(_run_stages(cut, inputs), model(*inputs), rtol=0, atol=0)


def test_pipeline_plans_need_equal_microbatches_and_example_inputs():
    model = small_cnn()
    spec = parse_plan(pipeline_plan(model, dp=1, mp=2, schedule="gpipe", num_microbatches=3,
                                    per_replica_batch=8))
    with pytest.raises(ValueError, match=r"per_replica_batch must be a multiple of "
                                         r"num_microbatches=3: the stages run equal micro-batches"):
        first_microbatch(spec, model.example_inputs(8), 0)
    with pytest.raises(ValueError, match=r"needs apply\(..., example_inputs=\)"):
        first_microbatch(spec, None, 0)


# ---- cross-rank judgement ---------------------------------------------------------------------

def _report(rank, sha="a" * 64, error=None, params=None):
    return RankReport(rank, sha, error, params or [("w", [2, 2], "torch.float32")])


def test_judge_names_disagreeing_ranks():
    assert judge([_report(0), _report(1)]) is None
    msg = judge([_report(0), _report(1), _report(2, sha="b" * 64)])
    assert msg.startswith("hybridplan.apply: rank 0 and rank 2 hold different plans")
    msg = judge([_report(0, error="plan: boom"), _report(1, error="plan: boom")])
    assert msg == "hybridplan.apply failed on ranks 0, 1: plan: boom"
    msg = judge([_report(0), _report(1, params=[("w", [2, 3], "torch.float32")])])
    assert msg == ("hybridplan.apply: rank 0 and rank 1 hold different models: 'w' is "
                   "torch.float32[2, 2] on rank 0 and torch.float32[2, 3] on rank 1")
    assert param_signature(nn.Linear(2, 3))[0] == ("weight", [3, 2], "torch.float32")


def test_hand_plans_name_the_nodes_the_profiler_does():
    """A module called twice is a node per call; a parameter-free one (a shared ReLU) is a
    functional op, as in the profiler."""
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.mid, self.act = nn.Linear(4, 4), nn.Linear(4, 4), nn.ReLU()

        def forward(self, x):
            return self.lin(self.act(self.mid(self.act(self.lin(x)))))
    assert nodes_in_call_order(Twice(), torch.randn(2, 4)) == ["lin", "mid", "lin@1"]


def test_recompute_keeps_only_inputs_and_gives_the_same_gradients():
    """autograd.recompute: autograd saves the module's input alone (not the hidden
    activations), the forward runs again in backward, and the gradients are the same."""
    from hybridplan.autograd.recompute import recompute

    torch.manual_seed(0)
    kept = nn.Sequential(nn.Linear(8, 64), nn.GELU(), nn.Dropout(0.5), nn.Linear(64, 8))
    rebuilt = copy.deepcopy(kept)
    recompute(rebuilt)
    recompute(rebuilt)  # idempotent: one checkpoint, not two nested
    x = torch.randn(16, 8)

    def run(module):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(
                lambda t: saved.append(t.numel()) or t, lambda t: t):
            torch.manual_seed(1)  # the same dropout mask for both
            module(x).square().sum().backward()
        return [p.grad for p in module.parameters()], saved

    kept_grads, kept_saved = run(kept)
    calls = []
    rebuilt[0].register_forward_hook(lambda *a: calls.append(1))
    rebuilt_grads, rebuilt_saved = run(rebuilt)
    assert len(calls) == 2  # the forward again in backward
    for a, b in zip(kept_grads, rebuilt_grads):
        assert torch.equal(a, b)
    # kept: the hidden (16, 64) activations; rebuilt: nothing larger than a (16, 8) tensor
    # (the module's input, and square()'s outside it)
    assert max(kept_saved) == 16 * 64
    assert max(rebuilt_saved, default=0) <= 16 * 8
