"""Tensor-parallel layouts (profiler/tensor_parallel.py, docs/tensor_parallel.md): which nodes
split and how, on torch's and Hugging Face's transformers, a plain MLP and a CNN; the simulated
check refusing a split that computes something else; the profiler's "tensor_parallel" fields
through the planner's Graph."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hybridplan.planner import Graph
from hybridplan.profiler import profile_dict
from hybridplan.profiler.tensor_parallel import Collective, detect_layout

F32 = 4


def styles(layout):
    return {name: tp.style for name, tp in layout.items()}


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32,
                        use_cache=False, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def tiny_llama(kv_heads=2, use_cache=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=kv_heads, max_position_embeddings=64,
                         use_cache=use_cache, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    return LlamaForCausalLM(config)


def ids(batch=2, seq=16):
    return {"input_ids": torch.randint(0, 128, (batch, seq),
                                       generator=torch.Generator().manual_seed(1))}


def test_transformer_encoder_layers():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
                            for _ in range(2)])
    layout = detect_layout(model, example_inputs=torch.randn(2, 8, 64))
    expected = {}
    for i in range(2):
        expected.update({f"{i}.linear1": "colwise", f"{i}.dropout": "sharded",
                         f"{i}.linear2": "rowwise"})
    assert styles(layout) == expected
    assert {tp.max_degree for tp in layout.values()} == {128}  # gcd(128, 128)
    assert layout["0.linear1"].split_param_bytes == (128 * 64 + 128) * F32
    assert layout["0.linear2"].split_param_bytes == 128 * 64 * F32  # its bias is not split
    assert layout["0.linear1"].backward_collective == Collective("all_reduce", "input")
    assert layout["0.linear2"].forward_collective == Collective("all_reduce", "output")
    assert layout.regions["0"].rowwise == "0.linear2"
    # nn.MultiheadAttention is one node holding in_proj_weight: not split, and said why
    assert "in_proj_weight" in layout.refused["0.self_attn"]
    assert all(m.training for m in model.modules())  # flags restored


def test_sequence_parallel_lists_each_collective_the_executor_runs():
    """Each collective is one entry, because on a host like this one a collective's fixed cost
    is most of its price: nn.MultiheadAttention(x, x, x) all-gathers each of its three inputs
    (PrepareModuleInput redistributes every argument on its own), and a LayerNorm's weight and
    bias gradients are two all-reduces (DTensor reduces each Partial gradient alone)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
                            for _ in range(2)])
    batch, seq = 2, 8
    graph = profile_dict(model, torch.randn(batch, seq, 64), warmup=0, repeats=1,
                         batch_sizes=(), verbose=False)
    sp = {n["name"]: n["sequence_parallel"] for n in graph["nodes"] if "sequence_parallel" in n}
    activation = batch * seq * 64 * F32
    assert sp["0.self_attn"]["role"] == "gather"
    assert sp["0.self_attn"]["forward_collectives"] == [
        {"op": "all_gather", "bytes": activation}] * 3
    assert sp["1.self_attn"]["backward_collectives"] == [
        {"op": "all_gather", "bytes": activation}]  # its output's gradient
    assert sp["0.self_attn"]["backward_collectives"][-1] == {  # the region's entry (the first)
        "op": "all_gather", "bytes": activation}
    assert sp["1.norm2"]["backward_collectives"] == [
        {"op": "all_reduce", "bytes": 64 * F32, "fixed_bytes": True}] * 2
    assert sp["0.linear1"]["forward_collectives"] == [{"op": "all_gather", "bytes": activation}]
    assert sp["0.linear2"]["forward_collectives"] == [
        {"op": "reduce_scatter", "bytes": activation}]


def test_sequence_parallel_measures_what_a_gather_node_keeps_with_its_inputs_apart():
    """nn.MultiheadAttention(x, x, x) projects x once in one process; under sequence parallelism
    its three inputs are all-gathered apart, so it projects and keeps each: saved_share, the
    ratio of the two measured runs, is what its activations are multiplied by."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0,
                                                       batch_first=True) for _ in range(2)])
    batch, seq = 2, 8
    graph = profile_dict(model, torch.randn(batch, seq, 64), warmup=0, repeats=1,
                         batch_sizes=(), verbose=False)
    nodes = {n["name"]: n for n in graph["nodes"]}
    share = nodes["1.self_attn"]["sequence_parallel"]["saved_share"]
    # two more copies of the input (2 x 4 KiB) over what the attention keeps in one process
    assert share > 1.2
    assert "saved_share" not in nodes["1.norm1"]["sequence_parallel"]
    back = {n["name"]: n for n in Graph.from_dict(graph).to_dict()["nodes"]}
    assert back["1.self_attn"]["sequence_parallel"]["saved_share"] == pytest.approx(share)


def test_gpt2_splits_the_mlp_and_refuses_the_fused_attention():
    model = tiny_gpt2()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    layout = detect_layout(model, example_inputs=ids())
    expected = {"transformer.wte": "vocab_rowwise", "lm_head": "colwise_gather"}
    for i in range(2):
        expected.update({f"transformer.h.{i}.mlp.c_fc": "colwise",
                         f"transformer.h.{i}.mlp.act": "sharded",
                         f"transformer.h.{i}.mlp.c_proj": "rowwise"})
    assert styles(layout) == expected
    assert layout["transformer.h.0.mlp.c_fc"].max_degree == 256  # gcd(4 * 64, 4 * 64)
    # Conv1D (weight (in, out)): c_fc's weight and bias, c_proj's weight
    assert layout["transformer.h.0.mlp.c_fc"].split_param_bytes == (64 * 256 + 256) * F32
    assert layout["transformer.h.0.mlp.c_proj"].split_param_bytes == 256 * 64 * F32
    # c_attn's output is split into q, k, v by a fixed size: the narrowed forward fails
    why = layout.refused["transformer.h.0.attn.c_attn"]
    assert "degree 2" in why and "transformer.h.0.attn" in why, why
    assert "transformer.h.0.attn.c_proj" in layout.refused
    # the tied wte / lm_head weight: split by vocabulary rows in both, counted once (at wte)
    assert "tied with lm_head" in layout["transformer.wte"].note
    assert layout["transformer.wte"].split_param_bytes == 128 * 64 * F32
    assert layout["lm_head"].split_param_bytes == 0
    assert layout["lm_head"].max_degree == layout["transformer.wte"].max_degree == 128
    assert "positions" in layout.refused["transformer.wpe"]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_llama_attention_splits_into_whole_kv_heads(kv_heads):
    model = tiny_llama(kv_heads)
    layout = detect_layout(model, example_inputs=ids())
    expected = {"model.embed_tokens": "vocab_rowwise", "lm_head": "colwise_gather"}
    for i in range(2):
        p = f"model.layers.{i}"
        expected.update({f"{p}.self_attn.q_proj": "colwise", f"{p}.self_attn.k_proj": "colwise",
                         f"{p}.self_attn.v_proj": "colwise", f"{p}.self_attn.o_proj": "rowwise",
                         f"{p}.mlp.gate_proj": "colwise", f"{p}.mlp.act_fn": "sharded",
                         f"{p}.mlp.up_proj": "colwise", f"{p}.mlp.down_proj": "rowwise"})
    assert styles(layout) == expected
    # 4 query heads and `kv_heads` key-value heads of 16: whole kv heads per rank
    assert layout["model.layers.0.self_attn.k_proj"].max_degree == kv_heads
    assert layout["model.layers.0.self_attn.o_proj"].max_degree == kv_heads
    assert layout["model.layers.0.mlp.down_proj"].max_degree == 128
    assert layout["model.layers.0.self_attn.k_proj"].split_param_bytes == \
        64 * 16 * kv_heads * F32
    assert layout.regions["model.layers.1.mlp"].sharded == ["model.layers.1.mlp.act_fn"]
    assert not layout["lm_head"].note  # not tied in this config
    # v_proj is charged what the attention core saves (split by heads); q_proj keeps the
    # replicated hidden state
    assert layout["model.layers.0.self_attn.v_proj"].activation_split
    assert not layout["model.layers.0.self_attn.q_proj"].activation_split
    assert layout["lm_head"].forward_collective == Collective("all_gather", "output")


def test_llama_attention_splits_in_every_layer_with_its_kv_cache_on():
    """LlamaConfig's default use_cache=True: each forward fills a DynamicCache layer by layer,
    so layer 1's attention is called with a cache holding layer 0's keys, computed with
    autograd on. The check and the split timing run each split on a copy of the cache as it
    was when the attention was called (kept as the live object, it refused every layer after
    the first: the narrowed keys did not concatenate with the whole ones the cache held)."""
    model = tiny_llama(kv_heads=2, use_cache=True)
    inputs = ids(2, 8)
    layout = detect_layout(model, example_inputs=inputs)
    assert not [n for n in layout.refused if "self_attn" in n], layout.refused
    for i in range(2):
        attn = f"model.layers.{i}.self_attn"
        assert [layout[f"{attn}.{p}_proj"].style for p in "qkvo"] == ["colwise"] * 3 + ["rowwise"]
        assert layout[f"{attn}.o_proj"].max_degree == 2  # whole key-value heads
    graph = profile_dict(model, inputs, warmup=1, repeats=2, batch_sizes=(), verbose=False)
    o_proj = {n["name"]: n for n in graph["nodes"]}["model.layers.1.self_attn.o_proj"]
    assert [s["degree"] for s in o_proj["tensor_parallel"]["split_times"]] == [2]


def test_bert_regions_span_sibling_modules():
    """BERT's q/k/v sit in attention.self and their row-wise partner in attention.output: the
    region's parent is their lowest common ancestor."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=1,
                        num_attention_heads=4, intermediate_size=128,
                        max_position_embeddings=32, pad_token_id=0)
    layout = detect_layout(BertModel(config, add_pooling_layer=False),
                           example_inputs=ids())
    p = "encoder.layer.0"
    assert styles(layout) == {
        "embeddings.word_embeddings": "vocab_rowwise",
        f"{p}.attention.self.query": "colwise", f"{p}.attention.self.key": "colwise",
        f"{p}.attention.self.value": "colwise", f"{p}.attention.output.dense": "rowwise",
        f"{p}.intermediate.dense": "colwise", f"{p}.intermediate.intermediate_act_fn": "sharded",
        f"{p}.output.dense": "rowwise"}
    assert layout[f"{p}.attention.self.query"].max_degree == 4  # heads
    assert layout.regions[f"{p}.attention"].rowwise == f"{p}.attention.output.dense"
    assert "ids computed in the forward" in layout.refused["embeddings.position_embeddings"]


def test_plain_mlp_and_a_cnn():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    layout = detect_layout(mlp, example_inputs=torch.randn(4, 32))
    assert styles(layout) == {"0": "colwise", "1": "sharded", "2": "rowwise"}
    assert layout["0"].max_degree == 64
    assert layout["2"].split_param_bytes == 64 * 10 * F32
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(8, 10))
    layout = detect_layout(cnn, example_inputs=torch.randn(2, 3, 8, 8))
    assert dict(layout) == {}
    assert "outside any column-then-row pair" in layout.refused["4"]


class FusedQKV(nn.Module):
    """Attention with one q/k/v projection chunked into thirds: split by output features, each
    rank's slice is not (its q, its k, its v), so the split computes something else (a
    column-then-row pair by shape, and the narrowed forward runs)."""

    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        split = lambda t: t.view(*t.shape[:-1], -1, 8).transpose(1, 2)  # noqa: E731
        y = F.scaled_dot_product_attention(split(q), split(k), split(v))
        return self.out(y.transpose(1, 2).flatten(2))


def test_the_check_refuses_a_split_that_computes_something_else():
    torch.manual_seed(0)
    model = nn.Sequential(FusedQKV(), nn.LayerNorm(32))
    layout = detect_layout(model, example_inputs=torch.randn(2, 5, 32))
    assert dict(layout) == {}
    why = layout.refused["0.qkv"]
    assert "do not add up" in why and "0.out" in why, why


class TiedInside(nn.Module):
    """An embedding tied with a projection whose output is not the model's output: the
    projection is not split, so neither may the embedding be."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 16)
        self.proj = nn.Linear(16, 64, bias=False)
        self.proj.weight = self.embed.weight
        self.head = nn.Linear(64, 4)

    def forward(self, ids):
        return self.head(torch.log_softmax(self.proj(self.embed(ids)), dim=-1))


def test_a_tie_with_an_unsplit_node_leaves_the_embedding_whole():
    torch.manual_seed(0)
    layout = detect_layout(TiedInside(), example_inputs=torch.randint(0, 64, (2, 5)))
    assert dict(layout) == {}
    assert "tied with proj" in layout.refused["embed"]


def test_errors():
    mlp = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    with pytest.raises(ValueError, match="example_inputs is required"):
        detect_layout(mlp)
    with pytest.raises(ValueError, match=r"node_names \['nope'\]"):
        detect_layout(mlp, ["nope"], example_inputs=torch.randn(2, 4))


def test_profile_writes_the_fields_and_they_round_trip():
    model = tiny_llama()
    batch, seq, hidden = 2, 8, 64
    inputs = ids(batch, seq)
    graph = profile_dict(model, inputs, warmup=0, repeats=1, batch_sizes=(), verbose=False)
    nodes = {n["name"]: n for n in graph["nodes"]}
    layout = detect_layout(model, example_inputs=inputs)
    assert {n for n, node in nodes.items() if "tensor_parallel" in node} == set(layout)
    activation = batch * seq * hidden * F32
    q = nodes["model.layers.0.self_attn.q_proj"]["tensor_parallel"]
    assert q["style"] == "colwise" and q["max_degree"] == 2
    assert q["backward_collective"] == {"op": "all_reduce", "bytes": activation}
    assert "forward_collective" not in q
    assert [s["degree"] for s in q["split_times"]] == [2]
    o = nodes["model.layers.0.self_attn.o_proj"]["tensor_parallel"]
    assert o["forward_collective"] == {"op": "all_reduce", "bytes": activation}
    down = nodes["model.layers.0.mlp.down_proj"]["tensor_parallel"]
    assert [s["degree"] for s in down["split_times"]] == [2, 4, 8]
    assert all(s["forward_s"] > 0 and s["backward_s"] > 0 for s in down["split_times"])
    head = nodes["lm_head"]["tensor_parallel"]
    assert head["forward_collective"] == {"op": "all_gather", "bytes": batch * seq * 128 * F32}
    assert head["backward_collective"] == {"op": "all_reduce", "bytes": activation}
    assert nodes["model.layers.0.mlp.gate_proj"]["param_bytes"] >= \
        nodes["model.layers.0.mlp.gate_proj"]["tensor_parallel"]["split_param_bytes"]

    back = {n["name"]: n for n in Graph.from_dict(graph).to_dict()["nodes"]}
    for name, node in nodes.items():
        if "tensor_parallel" in node:
            got = back[name]["tensor_parallel"]
            for key, value in node["tensor_parallel"].items():
                if key == "split_times":
                    assert [s["degree"] for s in got[key]] == [s["degree"] for s in value]
                    assert got[key][0]["forward_s"] == pytest.approx(value[0]["forward_s"])
                else:
                    assert got[key] == value, (name, key)
        else:
            assert "tensor_parallel" not in back[name], name

    # sequence parallelism (profiler/sequence_parallel.py): roles and the collectives as the
    # executor runs them; the attention gathers once at its parent, carried by q_proj
    sp = {name: node["sequence_parallel"] for name, node in nodes.items()
          if "sequence_parallel" in node}
    assert sp["model.layers.0.input_layernorm"]["role"] == "per_token"
    assert sp["model.layers.0.input_layernorm"]["max_degree"] == seq
    assert sp["model.layers.0.input_layernorm"]["backward_collectives"] == [
        {"op": "all_reduce", "bytes": hidden * F32, "fixed_bytes": True},  # the norm's weight
        {"op": "all_gather", "bytes": activation}]  # the first block's input gradient
    assert sp["model.layers.0.self_attn.q_proj"]["forward_collectives"] == [
        {"op": "all_gather", "bytes": activation}]
    assert "forward_collectives" not in sp["model.layers.0.self_attn.k_proj"]
    assert sp["model.layers.0.self_attn.o_proj"]["forward_collectives"] == [
        {"op": "reduce_scatter", "bytes": activation}]
    assert sp["model.layers.1.mlp.down_proj"]["forward_collectives"][-1] == \
        {"op": "all_gather", "bytes": activation}  # the last block's output gathered
    assert not any(n.startswith("lm_head") or "embed" in n or n == "model.norm" for n in sp)
    assert {n: v for n, v in back.items() if "sequence_parallel" in v}.keys() == sp.keys()

    plain = profile_dict(model, inputs, warmup=0, repeats=1, batch_sizes=(), verbose=False,
                         tensor_parallel=False)
    assert not any("tensor_parallel" in n or "sequence_parallel" in n for n in plain["nodes"])


def test_the_loss_charged_to_the_head_stays_whole_in_its_split_times(monkeypatch):
    """The profiled step charges the loss to the last node (the LM head); a TP rank narrows the
    head's matrix product but computes the loss whole on the gathered logits, so the split
    times scale the head's own time only (`whole_s`)."""
    from hybridplan.profiler import block_list
    from hybridplan.profiler import tensor_parallel as tp

    class TinyLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(16, 8)
            self.head = nn.Linear(8, 16)  # to the vocabulary: an LM head

        def forward(self, x):
            return self.head(self.embed(x))

    model, inputs = TinyLM(), torch.randint(0, 16, (2, 4))
    nodes = block_list.select_nodes(model)
    monkeypatch.setattr(tp, "_ratios", lambda timed, node, degrees: {2: (0.5, 0.25)})
    times = {"embed": 0.001, "head": 0.010}
    fields, _ = tp.graph_fields(model, nodes, ((inputs,), {}), ["embed", "head"], times,
                                {"embed": 0.002, "head": 0.020}, "wall", 0, 1,
                                whole_s={"head": (0.004, 0.008)})
    assert fields["head"]["style"] == "colwise_gather"
    head = fields["head"]["split_times"][0]
    assert head["forward_s"] == pytest.approx(0.006 * 0.5 + 0.004)
    assert head["backward_s"] == pytest.approx(0.012 * 0.25 + 0.008)
    embed = fields["embed"]["split_times"][0]  # no loss charged: the ratio alone
    assert (embed["forward_s"], embed["backward_s"]) == pytest.approx((0.0005, 0.0005))


def test_loss_times_time_the_loss_alone():
    """On the model's own output, whatever its type (a Hugging Face ModelOutput's `.logits`),
    down to the output's gradient only: the model's graph stays for the step's backward."""
    from transformers.modeling_outputs import CausalLMOutput

    from hybridplan.profiler import block_timing

    linear = nn.Linear(8, 512)
    logits = linear(torch.randn(64, 8))
    target = torch.randint(0, 512, (64,))
    forward, backward = block_timing.loss_times(
        CausalLMOutput(logits=logits), lambda out: F.cross_entropy(out.logits, target),
        "thread", repeats=3)
    assert 0 < forward < 0.5 and 0 < backward < 0.5
    assert linear.weight.grad is None  # nothing of the model ran backward
    logits.sum().backward()  # and its graph is still there
    assert linear.weight.grad is not None
