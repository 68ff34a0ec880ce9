"""The executor's pure parts, without a process group: plan parsing, the stage cut, schedules,
gradient buckets and the cross-rank judgement."""

import copy
import json

import pytest
import torch
from torch import nn

import hybridplan.models as models
from hybridplan import _grad_sync, _schedules
from hybridplan._dist_checks import RankReport, judge, param_signature
from hybridplan._pipeline import split_microbatches
from hybridplan._plan_spec import parse_plan, sha256_hex
from hybridplan._stage_split import build_program, get_attr, stage_parameters
from hybridplan.executor import _check_module, _local_checks
from plan_builders import leaves_in_call_order, pipeline_plan, placement_plan


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
    assert (spec.dp_group_ranks(1), spec.replica_ranks(1)) == ([1, 3], [2, 3])
    assert (spec.replica_of(3), spec.stage_of(3)) == (1, 1)


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

def test_assignment_names_must_be_leaf_modules():
    model = small_cnn()
    plan = placement_plan(model, dp=1, mp=2)
    plan["assignment"][0]["name"] = "stem.convv"
    with pytest.raises(ValueError) as e:
        _check_module(parse_plan(plan), model)
    assert "assignment names must be leaf modules of BranchyCNN (got 1 unknown: ['stem.convv'])" \
        in str(e.value)


def test_every_leaf_with_parameters_must_be_assigned():
    model = small_cnn()
    plan = placement_plan(model, dp=1, mp=2)
    plan["assignment"] = [a for a in plan["assignment"] if a["name"] != "fc"]
    with pytest.raises(ValueError, match=r"missing 1 of BranchyCNN: \['fc'\]"):
        _check_module(parse_plan(plan), model)


def test_world_size_must_match_the_mode():
    model = small_cnn()
    spec = parse_plan(placement_plan(model, dp=2, mp=2))
    with pytest.raises(ValueError, match=r"placement plan needs world size 2 \(one process per "
                                         r"replica, world = dp; dp=2, mp=2\) \(got world size 4\)"):
        _local_checks(spec, model, None, 4)
    assert _local_checks(spec, model, None, 2) is None


def test_graph_hash_must_match():
    model = small_cnn()
    spec = parse_plan(placement_plan(model, dp=1, mp=1))

    class GraphLike:  # what hybridplan.planner.Graph offers: its canonical JSON's sha256
        sha256 = "ab" * 32
    with pytest.raises(ValueError, match="graph.sha256 must match the graph applied"):
        _local_checks(spec, model, GraphLike(), 1)


def test_apply_outside_a_distributed_job_says_so(monkeypatch):
    import hybridplan
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    model = small_cnn()
    with pytest.raises(ValueError, match=r"must run inside a torch.distributed job \(launch with "
                                         r"torchrun\): environment variables \['RANK'"):
        hybridplan.apply(placement_plan(model, dp=1, mp=1), model)


def test_decreasing_stages_are_rejected():
    model = small_cnn()
    names = leaves_in_call_order(model)
    stages = {n: 0 for n in names}
    stages["stem.conv"] = 1  # stem.norm (stage 0) reads stem.conv's output
    with pytest.raises(ValueError) as e:
        build_program(model, stages, 2)
    assert "assignment stage of 'stem.norm' must be >= the stage of its input 'stem_conv'" \
        in str(e.value)


# ---- the stage cut ----------------------------------------------------------------------------

@pytest.mark.parametrize("name,mp", [("branchy_cnn", 3), ("gnmt_lstm", 3), ("biglstm", 2)])
def test_stages_compose_to_the_original_forward(name, mp):
    kwargs = {"branchy_cnn": dict(width=4, image_size=8),
              "gnmt_lstm": dict(vocab_size=32, hidden_size=8, src_len=4, tgt_len=4),
              "biglstm": dict(vocab_size=64, embed_size=8, hidden_size=16, seq_len=4)}[name]
    model = models.get(name, seed=0, **kwargs)
    plan = pipeline_plan(model, dp=1, mp=mp, schedule="gpipe", num_microbatches=1)
    program = build_program(model, parse_plan(plan).assignment, mp)
    inputs = model.example_inputs(3)
    values = {}
    for s in range(mp):
        def resolve(key):
            return {"input": lambda: inputs[key[1]], "attr": lambda: get_attr(model, key[1]),
                    "stage": lambda: values[key]}[key[0]]()
        for i, out in enumerate(program.submodules[s](*map(resolve, program.stage_inputs[s]))):
            values[("stage", s, i)] = out
    torch.testing.assert_close(values[program.output], model(*inputs), rtol=0, atol=0)
    # every value a stage reads from another stage is sent to it by exactly its producer
    for s in range(mp):
        for key in program.stage_inputs[s]:
            if key[0] == "stage" or (key[0] == "input" and s > 0):
                assert s in program.consumers[key] and program.producer[key] != s
    # the stages' parameters partition the model's parameters
    owned = [k for s in range(mp) for k, _ in stage_parameters(model, program, s)]
    assert sorted(owned) == sorted(model.state_dict())


def test_skip_connection_is_sent_straight_to_its_consumer():
    """x from stage 0 is read by stage 2: it travels 0 -> 2, not through stage 1."""
    class Skip(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            return self.b(h) + self.c(h)  # c (stage 2) reads h (stage 0) directly
    program = build_program(Skip(), {"a": 0, "b": 1, "c": 2}, 3)
    h = ("stage", 0, 0)
    assert program.consumers[h] == [1, 2]
    assert program.received_by(1) == [h] and program.sent_by(1) == [("stage", 1, 0)]
    assert program.received_by(2) == [h, ("stage", 1, 0)]


def test_parameter_free_leaves_may_be_left_out():
    model = small_cnn()
    plan = pipeline_plan(model, dp=1, mp=2, schedule="gpipe", num_microbatches=1)
    plan["assignment"] = [a for a in plan["assignment"] if a["name"] != "pool"]
    spec = parse_plan(plan)
    _check_module(spec, model)
    program = build_program(model, spec.assignment, 2)
    assert "pool" in dict(program.submodules[1].named_modules())


# ---- schedules, micro-batches, buckets --------------------------------------------------------

def test_gpipe_and_1f1b_action_orders():
    assert _schedules.actions("gpipe", 2, 0, 3) == [("F", 0), ("F", 1), ("F", 2),
                                                    ("B", 0), ("B", 1), ("B", 2)]
    # stage 0 of 2: one warmup forward, then 1F1B, then drain
    assert _schedules.actions("1f1b", 2, 0, 3) == [("F", 0), ("F", 1), ("B", 0), ("F", 2),
                                                   ("B", 1), ("B", 2)]
    assert _schedules.actions("1f1b", 2, 1, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1),
                                                   ("F", 2), ("B", 2)]
    for schedule in _schedules.SCHEDULES:
        for stages, m in [(4, 2), (3, 5)]:
            for s in range(stages):
                acts = _schedules.actions(schedule, stages, s, m)
                assert sorted(acts) == sorted([("F", i) for i in range(m)]
                                              + [("B", i) for i in range(m)])
                assert all(acts.index(("F", i)) < acts.index(("B", i)) for i in range(m))


def test_microbatch_losses_sum_to_the_full_batch_mean():
    x, y = torch.randn(7, 3), torch.randint(0, 3, (7,))
    parts = split_microbatches([x, y, "keep"], 3, 0)
    assert [p[0].shape[0] for p in parts] == [3, 2, 2] and all(p[2] == "keep" for p in parts)
    scaled = sum(nn.functional.cross_entropy(px, py) * px.shape[0] / 7 for px, py, _ in parts)
    torch.testing.assert_close(scaled, nn.functional.cross_entropy(x, y))
    with pytest.raises(ValueError, match="a batch of 2 samples cannot make num_microbatches=3"):
        split_microbatches([x[:2]], 3, 0)


def test_buckets_split_by_size_and_dtype():
    ps = [nn.Parameter(torch.zeros(10)), nn.Parameter(torch.zeros(10)),
          nn.Parameter(torch.zeros(30)), nn.Parameter(torch.zeros(5, dtype=torch.float64))]
    sizes = [[p.numel() for p in b] for b in _grad_sync.buckets(ps, bucket_bytes=80)]
    assert sizes == [[10, 10], [30], [5]]  # 80 bytes = 20 floats; a bigger one stands alone


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
