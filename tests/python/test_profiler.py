"""hybridplan.profile: nodes, edges (torch.fx and the hook fallback), times, bytes, errors."""

import json
import os
import platform
import subprocess
import sys
import time

import pytest
import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from hybridplan import models
from hybridplan.profiler import block_list
from hybridplan.profiler import block_timing as _timing
from hybridplan.profiler import dataflow as _tracing
from hybridplan.__main__ import main as cli_main
from hybridplan.profiler import profile_dict

import profile_checks

BATCH = 8


@pytest.fixture
def one_thread():
    # One intra-op thread: kernels then run on the calling thread, which the "thread" clock
    # measures, and timings do not depend on how many cores the other processes leave free.
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


class Branchy(nn.Module):
    """stem -> {left, right_a -> act -> right_b}; head reads cat(left + stem, right_b)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.left = nn.Linear(8, 8)
        self.right_a = nn.Linear(8, 4)
        self.act = nn.ReLU()
        self.right_b = nn.Linear(4, 8)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        s = self.stem(x)
        r = self.right_b(self.act(self.right_a(s)))
        y = torch.cat([self.left(s) + s, r], dim=1)  # skip connection stem -> head
        return self.head(torch.flatten(y, 1))


class UntraceableBranchy(Branchy):
    """The same dataflow behind a data-dependent `if`, which torch.fx cannot trace."""

    def forward(self, x):
        s = self.stem(x)
        if float(s.detach().abs().sum()) >= 0:  # always true at run time; a Proxy to fx
            r = self.right_b(self.act(self.right_a(s)))
        else:
            r = self.right_a(s)
        y = torch.cat([self.left(s) + s, r], dim=1)
        return self.head(torch.flatten(y, 1))


# bytes of one float32 (BATCH, n) activation
def _act(n):
    return BATCH * n * 4


BRANCHY_EDGES = {  # (src, dst, bytes): worked out by hand from Branchy.forward
    ("stem", "right_a", _act(8)), ("stem", "left", _act(8)), ("stem", "head", _act(8)),
    ("right_a", "act", _act(4)), ("act", "right_b", _act(4)),
    ("left", "head", _act(8)), ("right_b", "head", _act(8)),
}


def _edges(graph):
    names = {n["id"]: n["name"] for n in graph["nodes"]}
    return {(names[e["src"]], names[e["dst"]], e["bytes"]) for e in graph["edges"]}


def test_branchy_edges_exact_with_fx(capsys):
    graph = profile_dict(Branchy(), torch.randn(BATCH, 8), warmup=0, repeats=2, verbose=True)
    assert "(torch.fx)" in capsys.readouterr().err
    assert _edges(graph) == BRANCHY_EDGES
    assert [n["name"] for n in graph["nodes"]] == ["stem", "right_a", "act", "right_b", "left",
                                                   "head"]
    assert graph["profiled"] == {"device": "cpu", "batch_size": BATCH, "dtype": "float32",
                                 "input_bytes": BATCH * 8 * 4}  # the (BATCH, 8) float32 input


def test_fallback_hooks_give_the_same_edges_where_fx_fails(capsys):
    model = UntraceableBranchy()
    with pytest.raises(Exception):  # the premise: fx really cannot trace it
        torch.fx.symbolic_trace(model)
    graph = profile_dict(model, torch.randn(BATCH, 8), warmup=0, repeats=2, verbose=True)
    assert "forward hooks; torch.fx could not trace" in capsys.readouterr().err
    assert _edges(graph) == BRANCHY_EDGES


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: one in-place ReLU module called twice, in-place +=."""

    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        out = self.conv2(self.relu(self.conv1(x)))
        out += x
        return self.relu(out)


class ResNetish(nn.Module):
    def __init__(self, untraceable=False):
        super().__init__()
        self.untraceable = untraceable
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.layer = nn.Sequential(BasicBlock(4), BasicBlock(4))
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        x = self.layer(self.stem(x))
        if self.untraceable and float(x.detach().mean()) > -1e30:  # a Proxy to fx
            x = x * 1.0
        return self.fc(x.mean((2, 3)))


@pytest.mark.parametrize("untraceable", [False, True])
def test_shared_relu_and_inplace_residual(untraceable, capsys):
    graph = profile_dict(ResNetish(untraceable), torch.randn(2, 3, 8, 8), warmup=0, repeats=1)
    err = capsys.readouterr().err
    assert "treated as functional ops: layer.0.relu, layer.1.relu" in err
    assert ("forward hooks" in err) == untraceable
    act = 2 * 4 * 8 * 8 * 4  # one (2, 4, 8, 8) float32 activation
    # the residual `out += x` adds the block input's producer; the first block's result is a
    # functional value (relu(conv2 + stem)) that layer.1.conv1 reads first, so fc's edge for it
    # comes from layer.1.conv1, not from stem and layer.0.conv2 again
    assert _edges(graph) == {
        ("stem", "layer.0.conv1", act), ("layer.0.conv1", "layer.0.conv2", act),
        ("stem", "layer.1.conv1", act), ("layer.0.conv2", "layer.1.conv1", act),
        ("layer.1.conv1", "layer.1.conv2", act),
        ("layer.1.conv1", "fc", act), ("layer.1.conv2", "fc", act),
    }


class ResidualStream(nn.Module):
    """x = x + f(x) at every layer, as transformers' residual streams are."""

    def __init__(self, untraceable=False):
        super().__init__()
        self.untraceable = untraceable
        self.embed = nn.Linear(4, 8)
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(4))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = x + layer(x)
            if self.untraceable and float(x.detach().mean()) > -1e30:  # a Proxy to fx
                x = x * 1.0
        return self.head(x)


@pytest.mark.parametrize("untraceable", [False, True])
def test_residual_stream_is_read_from_its_first_reader(untraceable, capsys):
    """Each layer's sum is a functional value its next layer reads first: later readers get it
    from that layer, once, as the executor's cut carries it; not an edge from every earlier
    layer (which charged a pipeline boundary for each)."""
    graph = profile_dict(ResidualStream(untraceable), torch.randn(BATCH, 4), warmup=0, repeats=1,
                         batch_sizes=[])
    assert ("forward hooks" in capsys.readouterr().err) == untraceable
    act = BATCH * 8 * 4
    assert _edges(graph) == {
        ("embed", "layers.0", act), ("embed", "layers.1", act), ("layers.0", "layers.1", act),
        # the stream (first read by the layer before) and that layer's output
        ("layers.1", "layers.2", 2 * act), ("layers.2", "layers.3", 2 * act),
        ("layers.3", "head", 2 * act),
    }


class TwoReaders(nn.Module):
    """Two branches read one concatenation: neither is upstream of the other."""

    def __init__(self, untraceable=False):
        super().__init__()
        self.untraceable = untraceable
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        self.c1, self.c2 = nn.Linear(8, 8), nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        h = torch.cat([self.a(x), self.b(x)], dim=1)
        if self.untraceable and float(h.detach().mean()) > -1e30:  # a Proxy to fx
            h = h * 1.0
        return self.head(self.c1(h) + self.c2(h))


@pytest.mark.parametrize("untraceable", [False, True])
def test_a_value_two_branches_read_keeps_its_producers(untraceable):
    """c1 reads the concatenation first, but c2 does not depend on c1: an edge c1 -> c2 would
    serialise the branches that placement runs side by side."""
    graph = profile_dict(TwoReaders(untraceable), torch.randn(BATCH, 4), warmup=0, repeats=1,
                         batch_sizes=[], verbose=False)
    half, act = BATCH * 4 * 4, BATCH * 8 * 4
    assert _edges(graph) == {("a", "c1", half), ("b", "c1", half), ("a", "c2", half),
                             ("b", "c2", half), ("c1", "head", act), ("c2", "head", act)}


def test_loss_backward_bytes_are_measured_with_the_loss():
    """Cross-entropy's backward holds the gradients of its log-softmax and of the logits at once:
    twice the logits (the memory model's last-node workspace); no loss, no field."""
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 512))
    x, target = torch.randn(BATCH, 4), torch.randint(0, 512, (BATCH,))
    logits = BATCH * 512 * 4
    with_loss = profile_dict(model, x, warmup=0, repeats=1, batch_sizes=[], verbose=False,
                             loss_fn=F.cross_entropy, target=target)
    assert 2 * logits <= with_loss["profiled"]["loss_backward_bytes"] < 2.5 * logits
    without = profile_dict(model, x, warmup=0, repeats=1, batch_sizes=[], verbose=False)
    assert "loss_backward_bytes" not in without["profiled"]


def test_backward_workspace_is_each_nodes_gradients_above_what_is_held():
    """Each node's measured backward workspace: its output's gradient, its input's gradient and
    its parameters' gradients (before autograd adds them into .grad), byte for byte, on a chain
    whose first input needs no gradient."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    graph = profile_dict(model, torch.randn(BATCH, 8), warmup=0, repeats=1, batch_sizes=[],
                         verbose=False)
    ws = {n["name"]: n["backward_workspace_bytes"] for n in graph["nodes"]}
    hidden, out = BATCH * 16 * 4, BATCH * 4 * 4
    assert ws["0"] == hidden + (8 * 16 + 16) * 4              # no input gradient
    assert ws["1"] == hidden + hidden                         # ReLU: output and input
    assert ws["2"] == out + hidden + (16 * 4 + 4) * 4
    assert all(p.grad is None for p in model.parameters())   # the profile leaves none behind


class _TinyLstmLm(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        # with a projection, as BigLSTM's: torch then runs it step by step, not as one fused
        # kernel
        self.lstm = nn.LSTM(16, 32, batch_first=True, proj_size=16)
        self.act = nn.Tanh()
        self.head = nn.Linear(16, 50)

    def forward(self, tokens):
        hidden, _ = self.lstm(self.emb(tokens))
        return self.head(self.act(hidden))


def test_split_backward_is_measured_where_an_input_carries_a_gradient():
    """Each node's backward under the zero-bubble split, its weight gradient's share and the
    split's own cost, for the nodes with parameters whose inputs carry a gradient (not the
    embedding, which reads the batch's tokens, nor the parameter-free Tanh)."""
    torch.manual_seed(0)
    model = _TinyLstmLm()
    graph = profile_dict(model, torch.randint(0, 50, (BATCH, 16)), warmup=0, repeats=3,
                         batch_sizes=[], verbose=False)
    shares = {n["name"]: n["weight_backward_fraction"] for n in graph["nodes"]
              if "weight_backward_fraction" in n}
    extra = {n["name"]: n["split_backward_extra_s"] for n in graph["nodes"]
             if "split_backward_extra_s" in n}
    assert set(shares) == set(extra) == {"lstm", "head"}
    # I records for W the projected LSTM's gate gradients of every step, 4 x 32 per step against
    # its output's 16; a Linear's output gradient, its output's size
    nodes = {n["name"]: n for n in graph["nodes"]}
    assert nodes["lstm"]["split_held_bytes"] > 4 * nodes["lstm"]["output_bytes"]
    assert nodes["head"]["split_held_bytes"] == nodes["head"]["output_bytes"]
    assert all(0 < f < 1 for f in shares.values())
    # the split walks the LSTM's autograd nodes, several per step, in Python: far more than the
    # Linear's few (about 40 against 0.4 ms here)
    assert extra["lstm"] > extra["head"] >= 0
    assert all(p.grad is None for p in model.parameters())   # the profile leaves none behind


@pytest.mark.parametrize("name",
                         sorted(set(models.MODELS) - {"transformer_lm", "llama_lm"}))
def test_hook_edges_equal_fx_edges_on_builtin_models(name):
    model = models.get(name)
    nodes = block_list.select_nodes(model)
    inputs = model.example_inputs(2)
    flow, _ = _tracing.record_dataflow(model, nodes, inputs)
    assert flow.edges == _tracing.fx_edges(model, nodes, flow, inputs)
    assert len(flow.edges) >= len(nodes) - 2  # connected: one edge into each non-input node


def test_torch_transformer_layers_take_their_edges_from_hooks():
    """nn.TransformerEncoderLayer cannot be traced by torch.fx with its children as leaves (it
    canonicalises the mask proxy); the profiler falls back to the hooked run's edges."""
    model = models.transformer_lm(vocab_size=16, d_model=8, num_heads=2, num_layers=2,
                                  seq_len=4)
    nodes = block_list.select_nodes(model)
    flow, _ = _tracing.record_dataflow(model, nodes, model.example_inputs(2))
    with pytest.raises(Exception):
        _tracing.fx_edges(model, nodes, flow, model.example_inputs(2))
    graph = profile_dict(model, model.example_inputs(2), warmup=0, repeats=1, verbose=False,
                         batch_sizes=[])
    assert len(graph["edges"]) == len(flow.edges) and graph["pipeline_split"]["supported"]


def test_lstm_edge_carries_only_the_output_it_reads():
    model = models.biglstm(vocab_size=50, embed_size=8, hidden_size=16, seq_len=5)
    graph = profile_dict(model, model.example_inputs(2), warmup=0, repeats=1, verbose=False)
    nodes = {n["name"]: n for n in graph["nodes"]}
    edges = {(s, d): b for s, d, b in _edges(graph)}
    # lstm0 returns (output (2, 5, 8), (h (1, 2, 8), c (1, 2, 16))); lstm1 reads output only
    assert edges[("lstm0", "lstm1")] == 2 * 5 * 8 * 4
    assert nodes["lstm0"]["output_bytes"] == (2 * 5 * 8 + 2 * 8 + 2 * 16) * 4
    assert nodes["softmax"]["param_bytes"] == (8 * 50 + 50) * 4
    assert nodes["softmax"]["flops"] == 2 * (2 * 5) * 8 * 50  # one matmul, 2*M*K*N


def test_rnn_flops_formula_matches_the_counter_and_fills_fused_lstms():
    from torch.utils.flop_counter import FlopCounterMode

    # An LSTM with proj_size runs decomposed on CPU, so the counter sees its matmuls:
    # per step and sample 2*4*16*(8 + 8) gate FLOPs + 2*16*8 projection FLOPs = 2304
    lstm = nn.LSTM(8, 16, proj_size=8, batch_first=True)
    x = torch.randn(3, 5, 8)
    with FlopCounterMode(display=False) as counter:
        lstm(x)
    assert _timing.rnn_flops(lstm, x.shape) == counter.get_total_flops() == 2304 * 3 * 5
    # GNMT's plain LSTMs run fused (oneDNN) where the counter sees nothing: the formula counts
    model = models.gnmt_lstm()
    graph = profile_dict(model, model.example_inputs(2), warmup=0, repeats=1, verbose=False)
    flops = {n["name"]: n["flops"] for n in graph["nodes"]}
    assert flops["enc_lstm1"] == 2 * 4 * 64 * (64 + 64) * 2 * 12
    assert flops["enc_lstm0"] == 2 * 4 * 32 * (64 + 32) * 2 * 2 * 12  # bidirectional


def test_node_selection_and_orphan_parameters():
    class Attention(nn.Module):  # own weight + parameter-free child: one node
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.eye(4))
            self.softmax = nn.Softmax(dim=-1)

        def forward(self, x):
            return self.softmax(x @ self.weight)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Parameter(torch.zeros(4))  # held beside parameterised children
            self.attn = Attention()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(self.attn(x + self.pos))

    model = Model()
    assert list(block_list.select_nodes(model)) == ["attn", "fc"]
    graph = profile_dict(model, torch.randn(3, 4), warmup=0, repeats=1, verbose=False)
    bytes_by_name = {n["name"]: n["param_bytes"] for n in graph["nodes"]}
    # pos (4 floats) goes to the first node that runs: attn (16 floats of its own)
    assert bytes_by_name == {"attn": (16 + 4) * 4, "fc": (16 + 4) * 4}
    # ...and its tensor to the optimizer's count there: attn's weight plus pos; fc's weight and
    # bias. A frozen parameter is no tensor the optimizer updates.
    assert {n["name"]: n["param_tensors"] for n in graph["nodes"]} == {"attn": 2, "fc": 2}
    model.fc.bias.requires_grad_(False)
    graph = profile_dict(model, torch.randn(3, 4), warmup=0, repeats=1, verbose=False)
    assert {n["name"]: n["param_tensors"] for n in graph["nodes"]} == {"attn": 2, "fc": 1}
    assert [n["op"] for n in graph["nodes"]] == ["attention", "linear"]


# ---- times ----------------------------------------------------------------------------------

def _node_sum_over_reference(model, inputs, rounds=5, steps=10):
    """Median over rounds of sum(profiled node fwd+bwd) / whole-step time, each round's profile
    compared with the plain steps measured right before and after it (thread clock); the
    measurement make bench reports (profile_checks.node_sum_ratio, bench/bench_profiler.py)."""
    ratio, low, high, *_ = profile_checks.node_sum_ratio(model, inputs, "thread", rounds, steps)
    return ratio, (low, high)


@pytest.mark.parametrize("name", sorted(models.MODELS))
def test_node_times_add_up_to_the_whole_step(name, one_thread):
    """Tolerance 15%: every moment of a step is charged to one node, so the sum differs from a
    plain step only by the hooks' own cost (measured 1-7%: a few Python calls per node, most for
    branchy_cnn's 36 nodes) and by noise. The "thread" clock (CPU time of this thread) keeps
    other processes' use of the 2 shared cores out, but their cache and memory-bandwidth
    pressure still moves a step's CPU time by ~10% over seconds; comparing each profile with
    plain steps measured right before and after it, and taking the median over rounds, keeps
    that drift out of the ratio. Losing a whole kind of time (functional ops between modules,
    the seed gradient, the backward tail) or counting one twice would exceed 15%."""
    model = models.get(name)
    inputs = model.example_inputs(BATCH)
    ratio, ratios = _node_sum_over_reference(model, inputs)
    if abs(ratio - 1) > 0.15:  # a burst of load on a shared machine: measure once more
        ratio, ratios = _node_sum_over_reference(model, inputs)
    assert abs(ratio - 1) <= 0.15, f"node sum / whole step = {ratio:.3f} (min, max {ratios})"


class _SleepInBackward(torch.autograd.Function):
    """Identity whose backward sleeps: a backward of known length."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


class _Sleepy(nn.Module):
    """A leaf module (so one node) whose forward and backward sleep for given seconds."""

    def __init__(self, forward_s, backward_s):
        super().__init__()
        self.weight = nn.Parameter(torch.eye(4))
        self.forward_s, self.backward_s = forward_s, backward_s

    def forward(self, x):
        time.sleep(self.forward_s)
        return _SleepInBackward.apply(x @ self.weight, self.backward_s)


def test_each_node_is_charged_its_own_forward_and_backward():
    """Three nodes whose forward and backward sleep for known, neighbour-distinct times (the C++
    profiler's twin test is in tests/cpp/torch/test_profiler.cc): an interval charged to the
    wrong node (the previous or next one) would be off by >= 20 ms, so up to 19 ms of Linear,
    hooks and a loaded machine's oversleeping is allowed above the sleep."""
    sleeps = [(0.030, 0.010), (0.010, 0.050), (0.050, 0.030)]
    model = nn.Sequential(*[_Sleepy(f, b) for f, b in sleeps])
    graph = profile_dict(model, torch.randn(2, 4), warmup=1, repeats=3, verbose=False,
                         clock="wall")
    by_name = {n["name"]: n for n in graph["nodes"]}
    for i, (forward_s, backward_s) in enumerate(sleeps):
        node = by_name[str(i)]
        assert forward_s <= node["forward_s"] <= forward_s + 0.019, node
        assert backward_s <= node["backward_s"] <= backward_s + 0.019, node


def test_a_node_that_returns_its_input_takes_none_of_its_producers_backward():
    """nn.Dropout(p=0) and nn.Identity return their input: the output's autograd node is the
    node before them's. Marked for both, the later mark took the producer's whole backward
    (a transformer layer's attention went to its dropout=0.0, and across a pipeline cut
    between them to the wrong stage); each pass-through here follows a node whose backward
    sleeps 40 ms, and that node keeps it."""
    model = nn.Sequential(_Sleepy(0.0, 0.040), nn.Dropout(0.0), _Sleepy(0.0, 0.010),
                          nn.Identity(), _Sleepy(0.0, 0.040))
    graph = profile_dict(model, torch.randn(2, 4), warmup=1, repeats=3, verbose=False,
                         clock="wall")
    by_name = {n["name"]: n for n in graph["nodes"]}
    assert set(by_name) == {"0", "1", "2", "3", "4"}
    for producer, passthrough in (("0", "1"), ("2", "3")):
        sleep_s = 0.040 if producer == "0" else 0.010
        assert sleep_s <= by_name[producer]["backward_s"] <= sleep_s + 0.019, by_name[producer]
        assert by_name[passthrough]["backward_s"] <= 0.005, by_name[passthrough]


def test_wall_clock_times_are_positive_and_per_node(one_thread):
    model = models.gnmt_lstm()
    graph = profile_dict(model, model.example_inputs(4), warmup=1, repeats=3, verbose=False)
    for n in graph["nodes"]:
        assert n["forward_s"] > 0 and n["backward_s"] > 0, n
    lstm = {n["name"]: n for n in graph["nodes"]}["enc_lstm1"]
    embed = {n["name"]: n for n in graph["nodes"]}["enc_embed"]
    assert lstm["forward_s"] > embed["forward_s"]  # 12 recurrent steps vs one gather


def test_quiet_when_not_verbose(capfd):
    profile_dict(Branchy(), torch.randn(BATCH, 8), warmup=0, repeats=1, verbose=False)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


@pytest.mark.parametrize("name", ["branchy", "lstm"])
def test_a_profile_warns_nothing_that_is_not_the_users_to_act_on(name):
    """Tracing the pipeline cut (every profile and every rank's apply), torch's pipeline() warns
    that pytree's LeafSpec is deprecated, and export that nn.LSTM assigns its _flat_weights;
    the profiler filters both where they arise."""
    import warnings

    class Lstm(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm, self.head = nn.LSTM(8, 8, batch_first=True), nn.Linear(8, 2)

        def forward(self, x):
            return self.head(self.lstm(x)[0])
    model, x = ((Branchy(), torch.randn(BATCH, 8)) if name == "branchy"
                else (Lstm(), torch.randn(BATCH, 3, 8)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graph = profile_dict(model, x, warmup=0, repeats=1, verbose=False, batch_sizes=())
    assert graph["pipeline_split"]["supported"]  # the cut was traced
    torch_notes = [str(w.message) for w in caught  # (a busy host's timing note may stand)
                   if not str(w.message).startswith("profile")]
    assert torch_notes == []


def test_profile_returns_a_validated_graph():
    pytest.importorskip("hybridplan._C", reason="the compiled planner is not built")
    import hybridplan

    graph = hybridplan.profile(Branchy(), torch.randn(BATCH, 8), repeats=1, verbose=False)
    assert graph.node_names == ["stem", "right_a", "act", "right_b", "left", "head"]
    assert graph.batch_size == BATCH


# ---- bad input ------------------------------------------------------------------------------

def test_wrong_input_shape_names_the_module_and_shapes():
    model = models.branchy_cnn()
    with pytest.raises(ValueError, match=r"forward failed in module 'stem\.conv' \(Conv2d\) "
                                         r"with input shapes \[\[8, 1, 32, 32\]\].*channels"):
        profile_dict(model, torch.randn(8, 1, 32, 32), verbose=False)


def test_module_without_parameters():
    with pytest.raises(ValueError, match="Sequential has no trainable parameters: nothing to "
                                         "train or plan"):
        profile_dict(nn.Sequential(nn.ReLU()), torch.randn(2, 3), verbose=False)
    frozen = nn.Sequential(nn.Linear(3, 3))
    frozen.requires_grad_(False)
    with pytest.raises(ValueError, match="has no trainable parameters"):
        profile_dict(frozen, torch.randn(2, 3), verbose=False)


def test_output_that_needs_no_gradient():
    class Argmax(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            return self.fc(x).argmax(dim=1)

    with pytest.raises(ValueError, match=r"no output of Argmax requires grad \(got output "
                                         r"shapes \[\[2\]\]\)"):
        profile_dict(Argmax(), torch.randn(2, 3), verbose=False)


@pytest.mark.parametrize("device, message", [
    ("cuda:99", r"device 'cuda:99' does not exist here; devices here: cpu"),
    ("gpu0", r"device 'gpu0' is not a device name .*devices here: cpu"),
])
def test_device_that_does_not_exist(device, message):
    with pytest.raises(ValueError, match=message):
        profile_dict(Branchy(), torch.randn(2, 8), device=device, verbose=False)


def test_no_submodule_runs():
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return F.linear(x, self.fc.weight, self.fc.bias)

    with pytest.raises(ValueError, match="none of Functional's 1 graph nodes ran"):
        profile_dict(Functional(), torch.randn(2, 4), verbose=False)


def test_a_module_called_twice_is_a_node_per_call_sharing_its_parameters():
    """a(b(a(x))): graph nodes a, b, a@1 in execution order (no cycle); a's parameters count
    once, at its first call, and both calls' nodes list them as tied."""
    class Reuse(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return self.a(self.b(self.a(x)))

    graph = profile_dict(Reuse(), torch.randn(2, 4), warmup=0, repeats=1, verbose=False,
                         batch_sizes=[])
    assert [n["name"] for n in graph["nodes"]] == ["a", "b", "a@1"]
    assert [(e["src"], e["dst"], e["bytes"]) for e in graph["edges"]] == [(0, 1, 32), (1, 2, 32)]
    assert [n["param_bytes"] for n in graph["nodes"]] == [80, 80, 0]
    assert [n["param_tensors"] for n in graph["nodes"]] == [2, 2, 0]
    assert graph["tied_params"] == [{"nodes": [0, 2], "bytes": 64}, {"nodes": [0, 2], "bytes": 16}]
    assert all(n["forward_s"] > 0 and n["backward_s"] > 0 for n in graph["nodes"])
    assert graph["pipeline_split"] == {"supported": True, "reason": ""}


def test_a_module_under_two_names_is_one_node():
    """`shared` is also `enc.embed`: one node named `shared`, a node per call."""
    class Half(nn.Module):
        def __init__(self, embed):
            super().__init__()
            self.embed, self.fc = embed, nn.Linear(4, 4)

    class TwoNames(nn.Module):
        def __init__(self):
            super().__init__()
            self.shared = nn.Embedding(8, 4)
            self.enc, self.dec = Half(self.shared), Half(self.shared)

        def forward(self, src, tgt):
            memory = self.enc.fc(self.enc.embed(src))
            return self.dec.fc(self.dec.embed(tgt) + memory)

    model = TwoNames()
    assert block_list.module_aliases(model) == {"enc.embed": "shared", "dec.embed": "shared"}
    assert list(block_list.select_nodes(model)) == ["shared", "enc.fc", "dec.fc"]
    ids = torch.randint(0, 8, (2, 3))
    graph = profile_dict(model, (ids, ids), warmup=0, repeats=1, verbose=False, batch_sizes=[])
    assert [n["name"] for n in graph["nodes"]] == ["shared", "enc.fc", "shared@1", "dec.fc"]
    assert graph["pipeline_split"] == {"supported": True, "reason": ""}
    assert graph["tied_params"] == [{"nodes": [0, 2], "bytes": 128}]


def test_call_names():
    assert block_list.call_name("layer", 0) == "layer" and block_list.call_name("l", 2) == "l@2"
    assert block_list.split_call_name("enc.layer@12") == ("enc.layer", 12)
    assert block_list.split_call_name("a@b") == ("a@b", 0)
    assert block_list.module_name("x@1") == "x" and block_list.module_name("x") == "x"
    assert block_list.canonical_name("dec.embed.weight", {"dec.embed": "shared"}) == (
        "shared.weight")
    assert block_list.node_of("dec.embed", ["shared"], {"dec.embed": "shared"}) == "shared"


def test_bad_clock_and_repeats():
    with pytest.raises(ValueError, match="clock must be one of auto, wall, thread, cuda"):
        profile_dict(Branchy(), torch.randn(2, 8), clock="sundial", verbose=False)
    with pytest.raises(ValueError, match=r"repeats >= 1 \(got 3, 0\)"):
        profile_dict(Branchy(), torch.randn(2, 8), repeats=0, verbose=False)


# ---- command line ---------------------------------------------------------------------------

def test_cli_profile_writes_a_graph(tmp_path, one_thread):
    out = tmp_path / "g.json"
    rc = cli_main(["profile", "hybridplan.models:branchy_cnn", "--input-shape", "2,3,32,32",
                   "--warmup", "0", "--repeats", "1", "--quiet", "--out", str(out)])
    assert rc == 0
    graph = json.loads(out.read_text())
    assert graph["kind"] == "hybridplan.graph" and graph["name"] == "branchy_cnn"
    assert graph["profiled"]["batch_size"] == 2 and len(graph["nodes"]) == 36


def test_cli_profile_uses_the_models_example_inputs(capsys, one_thread):
    rc = cli_main(["profile", "hybridplan.models:biglstm", "--batch-size", "3", "--warmup", "0",
                   "--repeats", "1", "--quiet"])
    assert rc == 0
    graph = json.loads(capsys.readouterr().out)
    assert graph["profiled"]["batch_size"] == 3
    assert [n["name"] for n in graph["nodes"]] == ["embed", "lstm0", "lstm1", "softmax"]


@pytest.mark.parametrize("argv, message", [
    (["profile", "no_such_module:f"], "cannot import 'no_such_module'"),
    (["profile", "hybridplan.models"], "factory must be MODULE:FACTORY"),
    (["profile", "hybridplan.models:nothing"], "has no attribute 'nothing'"),
    (["profile", "hybridplan.models:branchy_cnn", "--input-shape", "2,3,32,32",
      "--input-dtype", "float99"], "--input-dtype 'float99' is not a torch dtype"),
])
def test_cli_bad_input_exits_2(argv, message, capsys):
    assert cli_main(argv) == 2
    assert message in capsys.readouterr().err


def test_busy_cpu_warning_only_for_threaded_wall_clock_cpu_profiles(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(_timing.os, "getloadavg", lambda: (float(_timing.os.cpu_count()), 0, 0))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert "torch.set_num_threads(1)" in _timing.busy_cpu_warning(cpu, "wall")
    assert _timing.busy_cpu_warning(cpu, "thread") is None
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert _timing.busy_cpu_warning(cpu, "wall") is None
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(_timing.os, "getloadavg", lambda: (0.0, 0, 0))
    assert _timing.busy_cpu_warning(cpu, "wall") is None


def test_retain_freed_memory_sets_glibc_thresholds():
    # On glibc (this machine, CI) mallopt accepts both settings; elsewhere nothing is changed.
    import platform
    assert _timing.retain_freed_memory() == (platform.libc_ver()[0] == "glibc")


_FREED_KEPT = """
import ctypes, sys
from hybridplan.profiler import block_timing
if sys.argv[1] == "return":
    assert block_timing.return_freed_memory()
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks",
                                               "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = MallInfo2
libc.free(libc.malloc(16 << 20))  # glibc's own threshold rises to the 16 MiB block freed
blocks, kept = [], []
for _ in range(10):  # 8 MiB blocks, each below a live 256 KiB one in the heap
    blocks.append(libc.malloc(8 << 20))
    kept.append(libc.malloc(256 << 10))
for block in blocks:
    libc.free(block)
print(libc.mallinfo2().fordblks >> 20)  # MiB freed but kept by malloc
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc policy")
def test_return_freed_memory_gives_large_blocks_back():
    """glibc's default keeps freed 8 MiB blocks in its heap once a larger block freed has raised
    its mmap threshold; return_freed_memory (apply's retain_freed_memory=False) mmaps them, so
    freeing gives them back. Each policy in a process of its own (mallopt is process-wide)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.join(os.path.dirname(__file__), "..", "..", "python"),
         os.environ.get("PYTHONPATH", "")]))
    kept = {policy: int(subprocess.run([sys.executable, "-c", _FREED_KEPT, policy], env=env,
                                       check=True, capture_output=True, text=True).stdout)
            for policy in ("default", "return")}
    assert kept["default"] >= 70 and kept["return"] <= 4, kept


def test_a_profile_with_the_loss_charges_it_to_the_last_node():
    """With loss_fn and target each step back-propagates from the loss: cross-entropy's saved
    log-probabilities (the logits' size) are the last node's, and its time is in the steps."""
    model = models.biglstm(vocab_size=512, embed_size=8, hidden_size=16, seq_len=5)
    inputs, target = model.example_inputs(4), model.example_target(4)
    plain = profile_dict(model, inputs, warmup=0, repeats=1, verbose=False, batch_sizes=[])
    with_loss = profile_dict(model, inputs, warmup=0, repeats=1, verbose=False,
                             batch_sizes=[2], loss_fn=model.loss, target=target)
    logits = 4 * 5 * 512 * 4
    assert with_loss["nodes"][-1]["saved_bytes"] - plain["nodes"][-1]["saved_bytes"] >= logits
    assert [n["saved_bytes"] for n in with_loss["nodes"][:-1]] == [
        n["saved_bytes"] for n in plain["nodes"][:-1]]
    assert all(p["forward_s"] > 0 for p in with_loss["nodes"][-1]["batch_times"])  # target sliced
    with pytest.raises(ValueError, match="loss_fn and target go together"):
        profile_dict(model, inputs, verbose=False, loss_fn=model.loss)


def test_selective_recompute_keeps_the_matmul_outputs_and_reruns_the_rest():
    """profile measures what selective recompute keeps per node (the outputs of the saved ops,
    autograd.recompute.SAVED_OPS) and what share of the forward it runs again: a Linear keeps
    exactly its output and reruns little, a LayerNorm keeps nothing and reruns all, an LSTM
    (fused: the dispatch mode cannot see into it) is left unmeasured."""
    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 32)
            self.norm = nn.LayerNorm(32)
            self.rnn = nn.LSTM(32, 8, batch_first=True)

        def forward(self, x):
            return self.rnn(self.norm(torch.relu(self.fc(x))))[0].sum(-1)

    graph = profile_dict(Net(), (torch.randn(4, 5, 16),), warmup=0, repeats=1, verbose=False)
    nodes = {n["name"]: n for n in graph["nodes"]}
    assert nodes["fc"]["selective_saved_bytes"] == 4 * 5 * 32 * 4  # addmm's output
    assert 0 <= nodes["fc"]["selective_recompute_fraction"] < 1
    assert nodes["norm"]["selective_saved_bytes"] == 0
    assert nodes["norm"]["selective_recompute_fraction"] == 1.0  # relu (before it) and the norm
    # the aten ops each forward dispatches (selective recompute's policy sees each twice):
    # the Linear's addmm (and its view/transpose glue), relu + layer norm
    assert 1 <= nodes["fc"]["selective_ops"] <= 6 and 2 <= nodes["norm"]["selective_ops"] <= 6
    assert "selective_saved_bytes" not in nodes["rnn"] and "selective_ops" not in nodes["rnn"]
    from hybridplan.planner import Graph
    assert Graph.from_dict(graph).to_dict()["nodes"][0]["selective_saved_bytes"] == 2560
    assert Graph.from_dict(graph).to_dict()["nodes"][0]["selective_ops"] == \
        nodes["fc"]["selective_ops"]


def _allocation_profile(events):
    """A stand-in for a finished torch.profiler run holding these (time_ns, bytes, address)
    allocation events (negative bytes: a free), one under the other's children."""
    from types import SimpleNamespace

    from torch._C._profiler import _EventType

    nodes = [SimpleNamespace(tag=_EventType.Allocation, start_time_ns=t, children=[],
                             extra_fields=SimpleNamespace(alloc_size=n, ptr=p))
             for t, n, p in events]
    root = SimpleNamespace(tag=_EventType.TorchOp, name="root", start_time_ns=0,
                           children=nodes[1:], extra_fields=None)
    tree = [root, nodes[0]]
    return SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(
        experimental_event_tree=lambda: tree)))


def test_allocation_peak_counts_a_block_reallocated_at_its_address_as_freed():
    """A free on a thread the profiler does not run on (Gloo's, dropping a collective's buffer)
    is not reported; a later allocation at the same address shows it happened."""
    events = [(1, 100, 0xA), (2, 50, 0xB), (3, -50, 0xB), (4, 100, 0xA), (5, 30, 0xC)]
    assert _timing.allocation_peak_bytes(_allocation_profile(events)) == 150  # not 230
    # `since_ns`: from then on, with what the run still holds then
    assert _timing.allocation_peak_bytes(_allocation_profile(events), since_ns=4) == 130
    assert _timing.allocation_peak_bytes(_allocation_profile(events), since_ns=5) == 130
    # a free reported for a block allocated before the run lowers what is live
    assert _timing.allocation_peak_bytes(_allocation_profile(
        [(1, -40, 0xD), (2, 60, 0xE)])) == 20


def test_allocation_peak_frees_a_collectives_buffers_when_its_wait_returns():
    """Gloo's thread often drops a functional collective's input and output last, and that
    free is not reported: they count freed when the collective's wait_tensor returned, not
    until the run ends; a free that is reported stays where it is."""
    from types import SimpleNamespace

    from torch._C._profiler import _EventType

    def alloc(t, n, ptr):
        return SimpleNamespace(tag=_EventType.Allocation, name="[memory]", start_time_ns=t,
                               children=[], extra_fields=SimpleNamespace(alloc_size=n, ptr=ptr))

    def op(name, start, end, inputs, children=()):
        return SimpleNamespace(tag=_EventType.TorchOp, name=name, start_time_ns=start,
                               end_time_ns=end, children=list(children),
                               extra_fields=SimpleNamespace(inputs=[
                                   SimpleNamespace(storage_data_ptr=p) for p in inputs]))

    def run(*later):
        tree = [alloc(10, 40, 0xA),  # the shard the collective gathers
                op("_c10d_functional::all_gather_into_tensor", 20, 25, [0xA],
                   [alloc(21, 80, 0xB)]),  # its output
                op("_c10d_functional::wait_tensor", 30, 40, [0xB]),
                alloc(50, 100, 0xC)] + list(later)
        return SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(
            experimental_event_tree=lambda: tree)))

    assert _timing.allocation_peak_bytes(run()) == 120  # not 220
    assert [f[:4] for f in _timing.unreported_collective_frees(list(_timing.profiler_events(run())))] == [
        (40, 0xA, 10, 40), (40, 0xB, 21, 80)]
    # the shard's free reported after its wait (something else held it): counted until then
    assert _timing.allocation_peak_bytes(run(alloc(60, -40, 0xA))) == 140
    # since a time after the wait: neither is held any more
    assert _timing.allocation_peak_bytes(run(), since_ns=45) == 100


def test_allocation_peak_since_a_time_counts_what_the_run_still_holds_then():
    """Blocks allocated before `since_ns` and not freed by then are alive as the measured step
    starts (last step's output), unless the caller counts them itself (`counted`: parameters,
    gradients); their frees after it are reported and lower what is live."""
    events = [(1, 64, 0xA),   # the warm-up step's output, held until the next replaces it
              (2, 16, 0xF0),   # a gradient the warm-up step set (the caller counts it)
              (5, 100, 0xB), (6, -64, 0xA), (7, 50, 0xC)]
    prof = _allocation_profile(events)
    assert _timing.allocation_peak_bytes(prof, since_ns=5, counted={0xF0}) == 164
    assert _timing.allocation_peak_bytes(prof, since_ns=5) == 180
    # no event after it: what is held then
    assert _timing.allocation_peak_bytes(prof, since_ns=9, counted={0xF0}) == 150


def test_resize_batch_cuts_or_repeats_only_the_batch():
    """One definition of bringing an example to a plan's batch (the front door, a switch): cyclic
    repetition along the batch dimension; with `have`, tensors of another size there are left
    alone (a mask of fixed length is not a batch); 0-d and empty tensors pass through."""
    x = torch.arange(6.0).reshape(3, 2)
    mask = torch.ones(5, 3)
    out = _tracing.resize_batch({"x": x, "mask": mask, "s": torch.tensor(1.0), "e": torch.ones(0)},
                                5, 0, have=3)
    assert out["x"].tolist() == [[0, 1], [2, 3], [4, 5], [0, 1], [2, 3]]
    assert out["mask"] is mask and out["s"].dim() == 0 and out["e"].numel() == 0
    cut = _tracing.resize_batch((x, [x.t()]), 2, 0)
    assert cut[0].tolist() == [[0, 1], [2, 3]] and isinstance(cut[1], list)
    assert cut[1][0].shape == (2, 3)  # every tensor with the dimension, without `have`
    assert _tracing.resize_batch(x.t(), 4, 1)[:, 3].tolist() == [0, 1]
