"""Sequence-parallel fields of a fake profile (profiler.fake_tensor_parallel.sequence_fields):
the check runs on a miniature with values, the sizes come from the model's own shapes under
fake tensors; the fields must be those a real profile of the same model writes."""

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from hybridplan.planner import Graph
from hybridplan.profiler import profile_dict

transformers = pytest.importorskip("transformers",
                                   reason="scripts/install-deps.sh installs transformers")

# odd sizes: a vocabulary 8 does not divide (250), a hidden width (60) and an MLP width (100)
# 8 does not divide, grouped-query attention (6 query over 2 key-value heads of 10 features)
ODD = dict(vocab_size=250, hidden_size=60, intermediate_size=100, num_attention_heads=6,
           num_key_value_heads=2, head_dim=10)


def _llama(layers, device="meta", **shape):
    config = transformers.LlamaConfig(num_hidden_layers=layers, max_position_embeddings=64,
                                      tie_word_embeddings=False, **{**ODD, **shape})
    torch.manual_seed(0)
    with torch.device(device):
        return transformers.LlamaForCausalLM(config)


def _fields(graph):
    return {n["name"]: n["sequence_parallel"] for n in graph["nodes"]
            if "sequence_parallel" in n}


def test_sequence_parallel_fields_of_a_meta_llama_agree_with_its_real_profile():
    """A meta-built Llama of odd sizes, fake-profiled, against the same configuration really
    profiled with values: the same nodes carry sequence-parallel fields, and every field is
    equal, node by node (roles, the max degree, the collectives and their bytes). The
    sequence, 20 tokens, is not the miniature's (16), nor are its widths: the max degree and
    the bytes are the model's."""
    seq = 20
    ids = torch.randint(0, ODD["vocab_size"], (2, seq), generator=torch.Generator().manual_seed(0))
    loss = lambda out, y: F.cross_entropy(out.logits.flatten(0, 1), y.flatten())  # noqa: E731
    common = dict(verbose=False, batch_sizes=(), loss_fn=loss, target=ids, name="llama")
    real = profile_dict(_llama(2, "cpu"), ids, repeats=1, warmup=0, **common)
    fake = profile_dict(_llama(2), ids, device_model="H100", **common)
    Graph.from_dict(fake)
    theirs, ours = _fields(real), _fields(fake)
    # per layer: the two norms, q/k/v/o and gate/up/down (act_fn runs on features, "sharded")
    assert len(theirs) == 2 * 9
    assert list(ours) == list(theirs)
    for name, field in theirs.items():
        assert ours[name] == field, name
    q = ours["model.layers.0.self_attn.q_proj"]
    assert q["max_degree"] == seq
    # the attention's input gathered once, at the model's shape: 2 x 20 tokens x 60 x float32
    assert q["forward_collectives"] == [{"op": "all_gather", "bytes": 2 * seq * 60 * 4}]
    norm = ours["model.layers.1.input_layernorm"]
    assert norm["role"] == "per_token"
    assert norm["backward_collectives"] == [{"op": "all_reduce", "bytes": 60 * 4,
                                             "fixed_bytes": True}]


class _EncoderStack(nn.Module):
    """torch's encoder layers: nn.MultiheadAttention holds its projections itself and runs
    whole, a "gather" node under sequence parallelism (with a saved_share)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(
            12, 2, 20, dropout=0.0, batch_first=True) for _ in range(2)])
        self.head = nn.Linear(12, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x.mean(dim=1))


def test_gather_nodes_of_a_fake_profile_agree_with_the_real_profile():
    """A model with values fake-profiled (its own miniature): the attention left whole gathers
    its three inputs, and its saved_share, measured by running it under fake tensors, is the
    real profile's."""
    torch.manual_seed(0)
    model = _EncoderStack()
    x = torch.randn(2, 10, 12)
    common = dict(verbose=False, batch_sizes=(), name="stack")
    fake = profile_dict(model, x, device_model="H100", **common)
    real = profile_dict(model, x, repeats=1, warmup=0, **common)
    theirs, ours = _fields(real), _fields(fake)
    assert theirs and ours == theirs
    attention = ours["layers.0.self_attn"]
    assert attention["role"] == "gather" and attention["saved_share"] > 1.0


def test_refused_sequence_parallelism_stays_refused(capfd):
    """GPT-2's attention core runs between its whole c_attn and its c_proj: refused in the
    real profile and in the fake one (the miniature shows it). A Llama at 17 tokens: the
    miniature's 16 split, the model's sequence does not, so the fake profile refuses it as the
    real one does (each writes its tensor-parallel fields)."""
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100,
                                     n_positions=64, bos_token_id=0, eos_token_id=0)
    ids = torch.zeros(2, 16, dtype=torch.long)
    torch.manual_seed(0)
    real = profile_dict(transformers.GPT2LMHeadModel(config), ids, repeats=1, warmup=0,
                        verbose=False, batch_sizes=())
    with torch.device("meta"):
        gpt2 = transformers.GPT2LMHeadModel(config)
    fake = profile_dict(gpt2, ids, device_model="H100", verbose=True, batch_sizes=())
    for graph in (real, fake):
        assert any("tensor_parallel" in n for n in graph["nodes"])
        assert not _fields(graph)
    assert "no sequence parallelism: the input 0 of node transformer.h.0.attn.c_proj" in \
        capfd.readouterr().err

    odd = torch.zeros(1, 17, dtype=torch.long)
    fake = profile_dict(_llama(2), odd, device_model="H100", verbose=True, batch_sizes=())
    assert any("tensor_parallel" in n for n in fake["nodes"]) and not _fields(fake)
    assert ("no sequence parallelism: the sequence length 17 (dimension 1 of the hidden "
            "states) is not divisible by 2") in capfd.readouterr().err


def test_repeated_layers_carry_the_sequence_parallel_fields():
    """layer_repeat copies the fields: a 3-layer fake profile repeated to 5 layers has the
    5-layer profile's sequence-parallel fields on every node (the entry's gather on layer 0,
    the exit's on layer 4's last node); a region that is not every layer is refused."""
    from hybridplan.profiler.layer_repeat import repeat_layers

    ids = torch.zeros(2, 16, dtype=torch.long)
    common = dict(device_model="H100", verbose=False, batch_sizes=(), name="llama")
    shallow = profile_dict(_llama(3), ids, **common)
    deep = profile_dict(_llama(5), ids, **common)
    repeated = repeat_layers(shallow, "model.layers.", 5)
    Graph.from_dict(repeated)
    assert len(_fields(deep)) == 5 * 9
    assert _fields(repeated) == _fields(deep)
    holed = {**shallow, "nodes": [{k: v for k, v in n.items() if k != "sequence_parallel"}
                                  if n["name"].startswith("model.layers.2.") else n
                                  for n in shallow["nodes"]]}
    with pytest.raises(ValueError, match=r"layers 0 and 2 carry sequence-parallel fields on "
                                         r"different nodes"):
        repeat_layers(holed, "model.layers.", 5)
