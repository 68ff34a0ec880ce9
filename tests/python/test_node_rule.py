"""The node rule (profiler/block_list.py, C++ twin csrc/profiler/block_list.h): one definition
of a graph node for the profiler, the executor's checks and the stage cut; what the profiler
records about cutting (pipeline_split, cut_before) and tied weights; and the parity of the two
languages on the same architecture."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hybridplan.executor.checks import check_module
from hybridplan.executor.plan_spec import parse_plan
from hybridplan.hand_plans import hand_plan
from hybridplan.profiler import block_list, profile_dict

import profile_checks as agreement
from twins import bin_dir
from user_models import ViT


def quick_profile(model, inputs):
    return profile_dict(model, inputs, warmup=0, repeats=1, verbose=False)


def test_attention_holding_its_own_weight_is_one_node():
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    model = nn.Sequential(nn.Linear(4, 8), layer)
    nodes = block_list.select_nodes(model)
    assert "1.self_attn" in nodes and "1.self_attn.out_proj" not in nodes
    assert list(nodes) == ["0", "1.self_attn", "1.linear1", "1.dropout", "1.linear2", "1.norm1",
                           "1.norm2", "1.dropout1", "1.dropout2"]
    # what used to fail: a plan made from the profiler's own graph is accepted by the executor
    graph = quick_profile(model, torch.randn(2, 3, 4))
    mha = next(n for n in graph["nodes"] if n["name"] == "1.self_attn")
    assert mha["param_bytes"] == sum(p.numel() * 4 for p in layer.self_attn.parameters())
    plan = hand_plan(model, mode="placement", dp=1, mp=2, example_inputs=torch.randn(2, 3, 4))
    assert {a["name"] for a in plan["assignment"]} == {n["name"] for n in graph["nodes"]}
    check_module(parse_plan(plan), model)


def test_root_parameters_belong_to_no_node_and_go_to_their_reader():
    model = ViT()
    nodes = block_list.select_nodes(model)
    inside = {id(p) for m in nodes.values() for p in m.parameters()}
    assert {n for n, p in model.named_parameters() if id(p) not in inside} == {
        "cls_token", "pos_embed"}
    graph = quick_profile(model, torch.randn(2, 3, 8, 8))
    by_name = {n["name"]: n["param_bytes"] for n in graph["nodes"]}
    root_bytes = (model.cls_token.numel() + model.pos_embed.numel()) * 4
    # the concatenation and the addition read them right before block0's attention runs
    own = sum(p.numel() * 4 for p in model.block0.self_attn.parameters())
    assert by_name["block0.self_attn"] == own + root_bytes
    assert sum(by_name.values()) == sum(p.numel() * 4 for p in model.parameters())
    assert block_list.node_of("block0.self_attn.out_proj.weight", nodes) == "block0.self_attn"
    assert block_list.node_of("cls_token", nodes) is None


def test_tied_weights_are_listed_once_per_parameter():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.mid, self.head = nn.Embedding(8, 4), nn.Linear(4, 4), nn.Linear(4, 8)
            self.head.weight = self.embed.weight

        def forward(self, ids):
            return self.head(self.mid(self.embed(ids)))
    graph = quick_profile(Tied(), torch.randint(0, 8, (2, 3)))
    assert graph["tied_params"] == [{"nodes": [0, 2], "bytes": 8 * 4 * 4}]
    by_name = {n["name"]: n["param_bytes"] for n in graph["nodes"]}
    assert by_name == {"embed": 128, "mid": 80, "head": 32}  # head: its bias only


def test_where_a_stage_can_begin():
    """enc runs on x, then mid, then enc again on y: each call of enc is its own graph node
    (enc, enc@1), so a stage may begin at any of them; the second call's stage holds a tied
    copy of enc's parameters."""
    class Reused(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc, self.mid, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x, y):
            return self.head(self.mid(self.enc(x)) + self.enc(y))
    graph = quick_profile(Reused(), (torch.randn(2, 4), torch.randn(2, 4)))
    assert graph["pipeline_split"] == {"supported": True, "reason": ""}
    assert {n["name"]: n.get("cut_before", True) for n in graph["nodes"]} == {
        "enc": True, "mid": True, "enc@1": True, "head": True}
    assert [t["nodes"] for t in graph["tied_params"]] == [[0, 2], [0, 2]]


def test_a_model_torch_export_cannot_cut_is_recorded_with_module_and_cause(capsys):
    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            return h if h.sum() > 0 else -h  # data-dependent control flow

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.gate = nn.Linear(4, 4), Gate()

        def forward(self, x):
            return self.gate(self.stem(x))
    graph = profile_dict(Net(), torch.randn(2, 4), warmup=0, repeats=1, verbose=True)
    split = graph["pipeline_split"]
    assert split["supported"] is False
    assert split["reason"].startswith("profile: Net cannot be cut into pipeline stages: in "
                                      "module 'gate' (Gate): ")
    assert "no pipeline plans: profile: Net cannot be cut" in capsys.readouterr().err


# ---- parity with the C++ profiler ----------------------------------------------------------

class SelfAttention(nn.Module):
    """csrc/models/attention_mlp.h SelfAttention: in_proj_weight held, out_proj's weight read."""

    def __init__(self, dim):
        super().__init__()
        self.in_proj_weight = nn.Parameter(torch.randn(3 * dim, dim) * 0.1)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x):
        q, k, v = F.linear(x, self.in_proj_weight).chunk(3, -1)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(x.shape[-1]), -1)
        return F.linear(weights @ v, self.out_proj.weight, self.out_proj.bias)


def attention_mlp():
    return nn.Sequential(nn.Linear(8, 16), SelfAttention(16), nn.ReLU(), nn.Linear(16, 4))


@pytest.mark.skipif(not (bin_dir() / "profile_model").exists(),
                    reason="profile_model is not built (make build)")
def test_cpp_and_python_give_the_same_nodes_for_the_same_architecture():
    cpp = agreement.cpp_profile("attention_mlp", 4, 1, "wall")
    python = profile_dict(attention_mlp(), torch.randn(4, 6, 8), warmup=0, repeats=1,
                          verbose=False, name="attention_mlp")
    assert [n["name"] for n in cpp["nodes"]] == ["0", "1", "2", "3"]
    assert agreement.structure(cpp) == agreement.structure(python)
