"""The fake profile (profiler/fake_profile.py, device_model.py): the same graph structure as a
real profile, chosen for a meta-device model, priced by the device model's rules, and a Hugging
Face Llama profiled on the meta device without allocating its parameters."""

import resource

import pytest
import torch
from torch import nn

import hybridplan
from hybridplan.planner import Graph
from hybridplan.profiler import device_model as dm_lib
from hybridplan.profiler import profile_dict
from hybridplan.profiler.from_config import DEVICES, GemmDevice, gemm_time

# A CPU device model with round numbers (no measurement: the tests hold the pricing rules).
CPU = dm_lib.DeviceModel("test-cpu", GemmDevice("test-cpu", 1e11, 1e11, 1e10, 1, (1, 1)),
                         1e11, 2e-6)


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.norm = nn.LayerNorm(32)
        self.b = nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.relu(self.norm(self.a(x))))


STRUCTURE = ("name", "op", "param_bytes", "param_tensors", "output_bytes", "saved_bytes",
             "flops", "selective_saved_bytes")


def test_fake_profile_has_the_real_profiles_structure():
    torch.manual_seed(0)
    model, x = Small(), torch.randn(8, 16)
    real = profile_dict(model, x, verbose=False, repeats=1, warmup=0, batch_sizes=(),
                        tensor_parallel=False)
    fake = profile_dict(model, x, mode="fake", device_model=CPU, verbose=False, batch_sizes=())
    Graph.from_dict(fake)
    assert [{k: n.get(k) for k in STRUCTURE} for n in fake["nodes"]] == \
        [{k: n.get(k) for k in STRUCTURE} for n in real["nodes"]]
    assert fake["edges"] == real["edges"]
    assert fake["pipeline_split"] == real["pipeline_split"]
    assert fake["profiled"]["device"] == "test-cpu"
    # the module is left as it was: real parameters, no gradients from the fake step
    assert all(type(p) is nn.Parameter and p.grad is None for p in model.parameters())
    # the first Linear's forward: addmm (8 x 16) @ (16 x 32) at the model's matmul rate, beside
    # the node's other op (none: its bias is fused in addmm), above the floor
    assert fake["nodes"][0]["forward_s"] == pytest.approx(
        max(gemm_time(8, 32, 16, CPU.gemm, 1, 1.0, 4), CPU.kernel_floor_s))


def test_meta_model_is_fake_profiled_without_asking():
    with torch.device("meta"):
        model = Small()
    graph = hybridplan.profile(model, torch.randn(8, 16), device_model=CPU, verbose=False,
                               batch_sizes=(4,))
    nodes = graph.to_dict()["nodes"]
    assert [n["name"] for n in nodes] == ["a", "norm", "b"]
    assert all(n["forward_s"] > 0 and n["backward_s"] > 0 for n in nodes)
    assert [b["batch_size"] for b in nodes[0]["batch_times"]] == [4]
    assert all(p.device.type == "meta" for p in model.parameters())


def test_mode_is_checked():
    with pytest.raises(ValueError, match=r"mode must be \"auto\", \"real\" or \"fake\" "
                                         r"\(got 'fast'\)"):
        profile_dict(Small(), torch.randn(2, 16), mode="fast")
    with pytest.raises(ValueError, match="device_model prices a fake profile"):
        profile_dict(Small(), torch.randn(2, 16), mode="real", device_model=CPU)


def test_op_prices():
    aten = torch.ops.aten
    a, b = torch.empty(64, 128), torch.empty(128, 256)
    out = a @ b
    # a matrix product: from_config's GEMM model (one definition)
    assert CPU.op_s(aten.mm.default, (a, b), {}, out) == gemm_time(64, 256, 128, CPU.gemm, 1,
                                                                     1.0, 4)
    # a view runs no kernel; a small add costs the floor; a large one its bytes
    assert CPU.op_s(aten.view.default, (a, [128, 64]), {}, a.view(128, 64)) == 0.0
    small = torch.empty(4)
    assert CPU.op_s(aten.add.Tensor, (small, small), {}, small) == CPU.kernel_floor_s
    big = torch.empty(1 << 20)
    assert CPU.op_s(aten.add.Tensor, (big, big), {}, big) == pytest.approx(3 * 4 * 2**20 / 1e10)


def test_device_models_from_presets_and_clusters():
    h100 = dm_lib.device_model("dgx-h100")
    assert h100.gemm.mamf_flops == DEVICES["H100"].mamf_flops and h100.gemm.sms == 132
    assert h100.kernel_floor_s == 2e-5  # the preset's call_floor_s
    assert h100.matmul_flops(torch.float32) < h100.matmul_flops(torch.bfloat16)
    with pytest.raises(ValueError, match=r"cluster 'x' device.memory_bandwidth_bytes_per_s and "
                                         r"device.peak_flops must be given \(got None, 1\.0\)"):
        dm_lib.device_model({"name": "x", "device": {"type": "cpu", "peak_flops": 1.0}})


def test_llama_on_meta_is_profiled_without_allocating_it():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                      num_hidden_layers=2, num_attention_heads=16,
                                      num_key_value_heads=4, max_position_embeddings=128,
                                      tie_word_embeddings=False)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert param_bytes > 850e6  # the check below would see it had it been allocated
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    graph = profile_dict(model, torch.zeros(1, 64, dtype=torch.long),
                         device_model="dgx-h100", verbose=False, batch_sizes=())
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    assert grown < 300e6, f"peak resident memory grew by {grown / 1e6:.0f} MB"
    Graph.from_dict(graph)
    names = [n["name"] for n in graph["nodes"]]
    assert "model.layers.0.self_attn.q_proj" in names and "lm_head" in names
    assert sum(n["param_bytes"] for n in graph["nodes"]) == param_bytes
    assert all(p.device.type == "meta" for p in model.parameters())


def test_gpt_matrix_products_agree_with_graph_from_config():
    """The fake profile of a Hugging Face GPT-2 block at GPT-3 6.7B's width on H100 against
    graph-from-config for the same configuration: their matrix-product nodes (the QKV and first
    MLP projections forward and backward, the LM head's backward) within 5 %. Both price a
    product with from_config.gemm_time; the fake profile adds what the model runs beside it
    (the bias gradient's sum, the kernel floor). Not compared: the LM head's forward, which
    carries the step's all-ones output gradient as a real profile's does (block_timing: what
    runs after the last node is the last node's), the nodes after the attention core and the
    element-wise ones, where the two graphs cut the model differently (HF charges the
    attention core to c_proj, from_config gives it its own node)."""
    transformers = pytest.importorskip("transformers")
    from hybridplan.profiler.from_config import TransformerConfig, graph_from_config

    h, heads, seq, vocab = 4096, 32, 2048, 50304
    config = transformers.GPT2Config(n_embd=h, n_head=heads, n_layer=1, n_positions=seq,
                                     vocab_size=vocab, torch_dtype=torch.bfloat16)
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config).to(torch.bfloat16)
    fake = profile_dict(model, torch.zeros(1, seq, dtype=torch.long), device_model="H100",
                        verbose=False, batch_sizes=())
    planned = graph_from_config(TransformerConfig("gpt", layers=1, hidden=h, heads=heads,
                                                  seq_len=seq, vocab=vocab), device="H100",
                                batch_multiples=())
    by_name = {n["name"]: n for n in fake["nodes"]}
    ours = {n["name"]: n for n in planned["nodes"]}
    pairs = {("transformer.h.0.attn.c_attn", "layers.0.qkv"): ("forward_s", "backward_s"),
             ("transformer.h.0.mlp.c_fc", "layers.0.fc1"): ("forward_s", "backward_s"),
             ("lm_head", "lm_head"): ("backward_s",)}
    for (hf, theirs), fields in pairs.items():
        for field in fields:
            assert by_name[hf][field] == pytest.approx(ours[theirs][field], rel=0.05), \
                (hf, field, by_name[hf][field], ours[theirs][field])
