"""Tensor parallelism applied (executor/tensor_parallel.py, docs/tensor_parallel.md "Applied"):
training under a plan with tp = 2 equals one-process training (same seed, same data, a few
steps) for a stack of torch's nn.TransformerEncoderLayer, Hugging Face's GPT2LMHeadModel and
LlamaForCausalLM from tiny configs, under each composition:

    tp        placement dp=1 x tp=2                       2 ranks
    tp+rc     the same, every node recomputed             2 ranks
    dp.tp     placement dp=2 x tp=2 (FSDP2 replicate)     4 ranks
    dp.tp+z2  / +z3: sharded over the dp dimension        4 ranks
    pp.tp     pipeline 1F1B mp=2 x tp=2                   4 ranks
    +sp       with sequence parallelism (tp+sp, tp+sp+rc: 2 ranks; dp.tp+sp+z3: 4 ranks)

`make test` trains every model under tp and each other composition on one model (REDUCED);
the other cases are marked `full` (`make test-full`, run by `make bench`).

The splits are the profiler's (detect_layout, which apply() calls on the module). A TP run's
consolidated checkpoint resumes under a non-TP plan and back, training on equal to one process.
`pytest -s -k equality_table` prints the table docs/tensor_parallel.md holds.
"""

import os
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dist_harness import format_results, run_ranks
from plan_builders import pipeline_plan, placement_plan, share
from user_models import call, train_one_process

STEPS, LR, MOMENTUM, BATCH, SEQ, VOCAB, D = 3, 0.05, 0.9, 4, 6, 32, 16


# ---- models -----------------------------------------------------------------------------------

class EncoderStack(nn.Module):
    """torch's nn.TransformerEncoderLayer x 2 between an input projection and a classifier."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, D)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(D, 2, 32, dropout=0.0, batch_first=True)
            for _ in range(2))
        self.head = nn.Linear(D, 4)

    def forward(self, x):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h.mean(dim=1))


def encoder_stack():
    torch.manual_seed(0)

    def batch(n, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(n, SEQ, 8, generator=g), torch.randint(0, 4, (n,), generator=g)
    return EncoderStack(), batch, F.cross_entropy


def _lm_batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g)
    return {"input_ids": ids[:, :-1]}, ids[:, 1:]


def _lm_loss(output, target):
    return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=D, n_head=2, vocab_size=VOCAB, n_positions=SEQ,
                        use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config), _lm_batch, _lm_loss


def _llama(layers, heads, kv_heads, use_cache=False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=D, intermediate_size=32,
                         num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, max_position_embeddings=2 * SEQ,
                         use_cache=use_cache, attention_dropout=0.0, pad_token_id=0, bos_token_id=0,
                         eos_token_id=0)
    return LlamaForCausalLM(config), _lm_batch, _lm_loss


def llama():
    return _llama(layers=2, heads=2, kv_heads=2)


def llama_gqa_pipe():
    """Llama with grouped-query attention (4 query heads over 2 key-value heads), two layers:
    a pipeline stage traced at one TP rank's shapes (repeat_kv's literal head count)."""
    return _llama(layers=2, heads=4, kv_heads=2)


def llama_cache():
    """Llama with grouped-query attention and LlamaConfig's default use_cache=True: each
    forward fills a KV cache layer by layer, which every layer's split attention reads."""
    return _llama(layers=2, heads=4, kv_heads=2, use_cache=True)


MODELS = {"encoder_stack": encoder_stack, "gpt2": gpt2, "llama": llama,
          "llama_gqa": llama_gqa_pipe, "llama_cache": llama_cache}
# composition -> (mode, dp, mp, sharding, recompute); ranks = dp * mp * 2
COMPOSITIONS = {
    "tp": ("placement", 1, 1, "none", False),
    "tp+rc": ("placement", 1, 1, "none", True),
    "dp.tp": ("placement", 2, 1, "none", False),
    "dp.tp+z2": ("placement", 2, 1, "zero2", False),
    "dp.tp+z3": ("placement", 2, 1, "zero3", False),
    "pp.tp": ("pipeline", 1, 2, "none", False),
    # "+sp": sequence parallelism (the plan's "sequence_parallel")
    "tp+sp": ("placement", 1, 1, "none", False),
    "tp+sp+rc": ("placement", 1, 1, "none", True),
    "dp.tp+sp+z3": ("placement", 2, 1, "zero3", False),
}
TP = 2
CASES = [(m, c) for m in MODELS if m != "llama_cache" for c in ("tp", "dp.tp", "pp.tp")] + [
    ("llama_cache", "tp"),
    ("llama", "tp+rc"), ("encoder_stack", "tp+rc"), ("gpt2", "dp.tp+z2"),
    ("llama", "dp.tp+z3"), ("encoder_stack", "tp+sp"), ("llama", "tp+sp"),
    ("encoder_stack", "tp+sp+rc"), ("llama", "dp.tp+sp+z3")]
# `make test` trains these (the rest is marked `full`: `make test-full`, run by `make bench`):
# every model under tp (2 ranks), and each other composition on one model.
REDUCED = {(m, "tp") for m in MODELS} | {
    ("gpt2", "dp.tp"), ("llama", "pp.tp"), ("llama", "tp+rc"), ("gpt2", "dp.tp+z2"),
    ("llama", "dp.tp+z3"), ("encoder_stack", "tp+sp"), ("llama", "tp+sp"),
    ("encoder_stack", "tp+sp+rc"), ("llama", "dp.tp+sp+z3")}
assert REDUCED <= set(CASES)


def ranks_of(composition):
    mode, dp, mp, _, _ = COMPOSITIONS[composition]
    return dp * mp * TP


def with_tp(plan, tp):
    """`plan` with tensor-parallel degree `tp`: world size, mesh (each entry the first device
    of its TP group) and devices per node scaled (docs/tensor_parallel.md "In the plan")."""
    world = plan["world_size"] * tp
    return dict(plan, tp=tp, world_size=world,
                mesh=[[d * tp for d in row] for row in plan["mesh"]],
                cluster=dict(plan["cluster"], devices_per_node=world, num_nodes=1))


def plan_for(name, composition, tp=TP):
    model, batch, _ = MODELS[name]()
    mode, dp, mp, sharding, recompute = COMPOSITIONS[composition]
    example = batch(BATCH, 0)[0]
    if mode == "placement":
        plan = placement_plan(model, dp=dp, mp=mp, per_replica_batch=BATCH)
    else:
        plan = pipeline_plan(model, dp=dp, mp=mp, schedule="1f1b", num_microbatches=2,
                             per_replica_batch=BATCH, example_inputs=example)
    if recompute:
        plan["assignment"] = [dict(a, recompute=True) for a in plan["assignment"]]
    if sharding != "none":
        plan["sharding"] = sharding
    if "+sp" in composition:
        plan["sequence_parallel"] = True
    return with_tp(plan, tp) if tp > 1 else plan


def sgd(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


# ---- rank side --------------------------------------------------------------------------------

def train_cases(cases, out_dir):
    """Trains each (model, composition) of `cases` in turn on this rank; saves the state."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    import hybridplan
    from hybridplan.executor import destroy_groups
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # one job, the cases applied in turn
    for name, composition in cases:
        model, batch, loss_fn = MODELS[name]()
        plan = plan_for(name, composition)
        global_batch = plan["dp"] * BATCH
        hp = hybridplan.apply(plan, model, loss_fn=loss_fn, optimizer=sgd, timeout_s=120,
                              example_inputs=share(batch(global_batch, 100)[0], plan["dp"], 0))
        tokens = []  # sequence parallelism: the tokens each per-token node runs on
        sequence = getattr(hp, "_tp_sequence", None)
        hooks = [hp.module.get_submodule(n).register_forward_hook(
                     lambda m, a, out: tokens.append(  # (a DTensor's: its local shard)
                         getattr(a[0], "_local_tensor", a[0]).shape[1]))
                 for n, role in (sequence.roles.items() if sequence else ())
                 if role == "per_token"]
        for step in range(STEPS):
            hp.step(*hp.shard(*batch(global_batch, 100 + step)))
        for h in hooks:
            h.remove()
        split = sorted({n.rsplit(".", 1)[0] for n, p in hp.module.named_parameters()
                        if isinstance(p, DTensor) and p.device_mesh.ndim >= 1
                        and "Shard" in str(p.placements)})
        result = {"state": hp.state_dict(), "split": split, "tokens": sorted(set(tokens))}
        hp.close()
        torch.save(result, os.path.join(out_dir, f"{name}-{composition}.rank{dist.get_rank()}.pt"))
    destroy_groups()


def checkpoint_round_trip(out_dir):
    """GPT-2 on 2 ranks, one job: 2 steps under tp=2 (dp=1), saved (consolidated and sharded);
    1 step under a non-TP plan (dp=2) resumed from the consolidated file, saved; 1 step under
    tp=2 again resumed from that. The global batch is 2 * BATCH throughout. Also the state a
    non-TP plan resumes from the TP run's sharded checkpoint."""
    import torch.distributed as dist
    import hybridplan
    from hybridplan.executor import destroy_groups
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    _, batch, loss_fn = gpt2()
    tp_plan = with_tp(placement_plan(gpt2()[0], dp=1, mp=1, per_replica_batch=2 * BATCH), TP)
    dp_plan = placement_plan(gpt2()[0], dp=2, mp=1, per_replica_batch=BATCH)
    ckpt = os.path.join(out_dir, "tp.pt")
    report = {}

    def run(plan, steps, resume_from=None, save=None, sharded=None):
        model = gpt2()[0]
        hp = hybridplan.apply(plan, model, loss_fn=loss_fn, optimizer=sgd, timeout_s=120,
                              example_inputs=share(batch(2 * BATCH, 0)[0], plan["dp"], 0),
                              resume_from=resume_from)
        resumed = hp.state_dict()
        for step in steps:
            hp.step(*hp.shard(*batch(2 * BATCH, 100 + step)))
        if save:
            hp.save_checkpoint(save)
        if sharded:
            hp.save_sharded(sharded)
        state = hp.state_dict()
        hp.close()
        return resumed, state
    run(tp_plan, [0, 1], save=ckpt, sharded=os.path.join(out_dir, "sharded"))
    report["resumed_dp"], _ = run(dp_plan, [2], resume_from=ckpt, save=ckpt)
    report["resumed_dp_sharded"], _ = run(dp_plan, [], resume_from=os.path.join(out_dir,
                                                                              "sharded"))
    _, report["final"] = run(tp_plan, [3], resume_from=ckpt)
    torch.save(report, os.path.join(out_dir, f"round_trip.rank{dist.get_rank()}.pt"))
    destroy_groups()


# ---- test side --------------------------------------------------------------------------------

def reference_state(name, global_batch):
    torch.set_num_threads(1)
    return train_one_process(MODELS[name], global_batch, STEPS, sgd)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, selected_cases):
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    out_dir = tmp_path_factory.mktemp("tensor_parallel")
    wanted = (set(selected_cases("test_tensor_parallel_trains_like_one_process", "name",
                                 "composition")) or REDUCED)  # the table alone: the reduced
    by_world = {}
    for case in [c for c in CASES if c in wanted]:
        by_world.setdefault(ranks_of(case[1]), []).append(case)
    failures = {}
    for world, cases in by_world.items():
        results = run_ranks("test_tensor_parallel:train_cases", world,
                            {"cases": cases, "out_dir": str(out_dir)}, timeout_s=600)
        if not all(r.returncode == 0 for r in results):
            failures[world] = format_results(results)
    loaded = {}
    for world, cases in by_world.items():
        for name, composition in cases:
            paths = [out_dir / f"{name}-{composition}.rank{r}.pt" for r in range(world)]
            loaded[(name, composition)] = ([torch.load(p) for p in paths]
                                           if all(p.exists() for p in paths)
                                           else failures.get(world, "no output"))
    return loaded


def test_ranks_put_tp_innermost():
    """Placement rank = r * tp + t, pipeline rank = (r * mp + s) * tp + t; every group kind
    partitions the world, and tp = 1 gives the old ranks."""
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    from hybridplan.executor.layout import Layout
    from hybridplan.executor.plan_spec import parse_plan
    model = encoder_stack()[0]
    pipe = parse_plan(with_tp(pipeline_plan(model, dp=2, mp=2, schedule="1f1b",
                                            num_microbatches=2, per_replica_batch=BATCH), 2))
    assert pipe.tp == 2 and pipe.num_processes == 8
    pipe = Layout.of(pipe)  # where each rank sits
    for rank in range(8):
        r, s, t = pipe.replica_of(rank), pipe.stage_of(rank), pipe.tp_rank_of(rank)
        assert rank == (r * 2 + s) * 2 + t == pipe.rank_of(r, s, t)
        assert rank in pipe.tp_group_ranks(r, s) and rank in pipe.dp_group_ranks(s, t)
        assert rank in pipe.replica_ranks(r, t)
    assert pipe.tp_group_ranks(1, 0) == [4, 5] and pipe.dp_group_ranks(1, 1) == [3, 7]
    assert pipe.replica_ranks(0, 1) == [1, 3]
    for groups in ([pipe.tp_group_ranks(r, s) for r in range(2) for s in range(2)],
                   [pipe.dp_group_ranks(s, t) for s in range(2) for t in range(2)],
                   [pipe.replica_ranks(r, t) for r in range(2) for t in range(2)]):
        assert sorted(x for g in groups for x in g) == list(range(8))
    place = parse_plan(with_tp(placement_plan(model, dp=2, mp=1, per_replica_batch=BATCH), 2))
    assert place.num_processes == 4
    place = Layout.of(place)
    assert [place.replica_of(x) for x in range(4)] == [0, 0, 1, 1]
    assert [place.tp_rank_of(x) for x in range(4)] == [0, 1, 0, 1]
    assert place.dp_group_ranks(0, 1) == [1, 3] and place.tp_group_ranks(1) == [2, 3]
    old = parse_plan(pipeline_plan(model, dp=2, mp=2, schedule="1f1b", num_microbatches=2,
                                   per_replica_batch=BATCH))
    assert old.tp == 1 and old.num_processes == 4
    old = Layout.of(old)
    assert [old.replica_of(x) for x in range(4)] == [0, 0, 1, 1]
    assert old.dp_group_ranks(1) == [1, 3] and old.replica_ranks(1) == [2, 3]


def reference_steps(name, global_batch, steps):
    """The state after each step (0: before any) of one-process training."""
    torch.set_num_threads(1)
    model, batch, loss_fn = MODELS[name]()
    opt = sgd(model.parameters())
    states = [{k: v.clone() for k, v in model.state_dict().items()}]
    for step in range(steps):
        inputs, target = batch(global_batch, 100 + step)
        opt.zero_grad()
        loss_fn(call(model, inputs), target).backward()
        opt.step()
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    return states


def test_checkpoint_moves_between_tp_and_non_tp_plans(tmp_path):
    """A TP run's consolidated checkpoint holds whole tensors: a dp=2 plan resumes from it
    (and from its sharded checkpoint) and a tp=2 plan resumes from the dp=2 run's; training
    goes on equal to one process."""
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    results = run_ranks("test_tensor_parallel:checkpoint_round_trip", 2,
                        {"out_dir": str(tmp_path)}, timeout_s=300)
    assert all(r.returncode == 0 for r in results), format_results(results)
    expected = reference_steps("gpt2", 2 * BATCH, 4)
    for rank in range(2):
        report = torch.load(tmp_path / f"round_trip.rank{rank}.pt")
        for what, want in (("resumed_dp", expected[2]), ("resumed_dp_sharded", expected[2]),
                           ("final", expected[4])):
            got = report[what]
            assert list(got) == list(want), what
            diff = max((got[k] - v).abs().max().item() for k, v in want.items())
            assert diff < 1e-6, f"{what}: differs by {diff:.3g} on rank {rank}"


def worst(outs, expected):
    return max((out["state"][k].float() - v.float()).abs().max().item()
               for out in outs for k, v in expected.items())


@pytest.mark.parametrize("name,composition", [
    pytest.param(m, c, id=f"{m}-{c}", marks=() if (m, c) in REDUCED else pytest.mark.full)
    for m, c in CASES])
def test_tensor_parallel_trains_like_one_process(trained, name, composition):
    outs = trained[(name, composition)]
    if isinstance(outs, str):
        pytest.fail(f"the ranks did not finish {name}-{composition}:\n{outs}")
    mode, dp, _, _, _ = COMPOSITIONS[composition]
    expected = reference_state(name, dp * BATCH)
    initial = MODELS[name]()[0].state_dict()
    assert any(not torch.equal(expected[k], initial[k]) for k in initial)  # it trained
    for out in outs:
        assert out["split"], f"{name}-{composition}: no parameter was split"
        if name.startswith("llama"):  # every layer's attention splits (whole kv heads), as
            # its MLP does: q/k/v column-wise, o row-wise
            # (a pipeline stage's names carry its own prefix)
            layers = {m.group(0) for n in out["split"]
                      for m in [re.search(r"model\.layers\.\d+\.", n)] if m}
            assert layers and all(any(n.endswith(f"{layer}self_attn.{p}_proj")
                                      for n in out["split"])
                                  for layer in layers for p in "qkvo"), out["split"]
        # with sequence parallelism every per-token node ran on 1/tp of the sequence
        assert out["tokens"] == ([SEQ // TP] if "+sp" in composition else [])
        assert list(out["state"]) == list(expected)
        for key, want in expected.items():
            assert torch.allclose(out["state"][key], want, rtol=1e-4, atol=1e-6), (
                f"{name}-{composition}: {key} differs by "
                f"{(out['state'][key] - want).abs().max().item():.3g}")


def test_equality_table(trained):
    """model x composition -> max |difference| from one process, as a markdown table: of the
    cases this run trained (all of them without -m)."""
    rows = ["| model | composition | ranks | max abs difference |", "|---|---|---|---|"]
    for name, composition in [c for c in CASES if c in trained]:
        outs = trained[(name, composition)]
        assert not isinstance(outs, str), f"{name}-{composition} did not run"
        diff = worst(outs, reference_state(name, COMPOSITIONS[composition][1] * BATCH))
        rows.append(f"| {name} | {composition} | {ranks_of(composition)} | {diff:.1e} |")
    print("\n" + "\n".join(rows))


# ---- a node tp does not divide runs whole -------------------------------------------------------

def llama_gqa():
    """Llama with 4 query heads over 2 key-value heads: its attention splits at most in two
    (max_degree 2), its MLP, embedding and head in more."""
    return _llama(layers=1, heads=4, kv_heads=2)


def test_split_nodes_is_the_planners_rule():
    """executor.tensor_parallel.split_nodes: tp divides the node's max_degree, a tied group
    splits as one (hybridplan._C.tp_split_mask, the cost model's function)."""
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    from hybridplan.executor import tensor_parallel as tpx
    from hybridplan.profiler.tensor_parallel import TpNode

    def node(style, degree):
        return TpNode(style=style, max_degree=degree, split_param_bytes=0,
                      activation_split=False, region="")
    layout = tpx.NodeLayout({"wte": node("vocab_rowwise", 8), "fc1": node("colwise", 4),
                             "fc2": node("rowwise", 4), "head": node("colwise_gather", 2)},
                            [["wte", "head"]])
    assert tpx.split_nodes(layout, 2) == ["wte", "fc1", "fc2", "head"]
    assert tpx.split_nodes(layout, 4) == ["fc1", "fc2"]  # head whole, so wte (tied) too
    assert tpx.split_nodes(tpx.NodeLayout(layout), 4) == ["wte", "fc1", "fc2"]  # untied
    assert tpx.split_nodes({"fc1": "colwise"}, 8) == ["fc1"]  # a style alone: any degree
    assert tpx.check_layout(layout, 4, "plan") == {"fc1": "colwise", "fc2": "rowwise"}
    with pytest.raises(ValueError, match=r"plan: tp=8 must divide the max_degree of a node"):
        tpx.check_layout(layout, 8, "plan")


def test_detect_gives_the_tied_groups_and_the_attention_runs_whole():
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    from hybridplan.executor import tensor_parallel as tpx
    model, batch, _ = gpt2()
    layout = tpx.detect(model, None, batch(2, 0)[0])
    assert layout.tied_groups == [["transformer.wte", "lm_head"]]
    model, batch, _ = llama_gqa()
    layout = tpx.detect(model, None, batch(2, 0)[0])
    styles = tpx.check_layout(layout, 4, "plan")
    assert not any("self_attn" in n for n in styles)
    assert {"model.embed_tokens", "model.layers.0.mlp.down_proj", "lm_head"} <= set(styles)


def train_partial_split(out_dir):
    """llama_gqa on 4 ranks, placement dp=1 x tp=4: the attention (max_degree 2) runs whole on
    every rank, the rest split."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    import hybridplan
    from hybridplan.executor import destroy_groups
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model, batch, loss_fn = llama_gqa()
    plan = with_tp(placement_plan(model, dp=1, mp=1, per_replica_batch=BATCH), 4)
    hp = hybridplan.apply(plan, model, loss_fn=loss_fn, optimizer=sgd, timeout_s=120,
                          example_inputs=batch(BATCH, 100)[0])
    for step in range(STEPS):
        hp.step(*hp.shard(*batch(BATCH, 100 + step)))
    split = sorted({n.rsplit(".", 1)[0] for n, p in hp.module.named_parameters()
                    if isinstance(p, DTensor) and "Shard" in str(p.placements)})
    torch.save({"state": hp.state_dict(), "split": split},
               os.path.join(out_dir, f"partial.rank{dist.get_rank()}.pt"))
    hp.close()
    destroy_groups()


def test_a_node_tp_does_not_divide_runs_whole_and_trains_like_one_process(tmp_path):
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    results = run_ranks("test_tensor_parallel:train_partial_split", 4,
                        {"out_dir": str(tmp_path)}, timeout_s=300)
    assert all(r.returncode == 0 for r in results), format_results(results)
    torch.set_num_threads(1)
    model, batch, loss_fn = llama_gqa()
    opt = sgd(model.parameters())
    for step in range(STEPS):
        inputs, target = batch(BATCH, 100 + step)
        opt.zero_grad()
        loss_fn(call(model, inputs), target).backward()
        opt.step()
    expected = model.state_dict()
    for rank in range(4):
        out = torch.load(tmp_path / f"partial.rank{rank}.pt")
        assert out["split"] and not any("self_attn" in n for n in out["split"]), out["split"]
        assert any("mlp" in n for n in out["split"]), out["split"]
        for key, want in expected.items():
            assert torch.allclose(out["state"][key], want, rtol=1e-4, atol=1e-6), (
                f"{key} differs by {(out['state'][key] - want).abs().max().item():.3g}")


# ---- sequence parallelism: where it applies ---------------------------------------------------

def _sequence_layout(name, tp=TP):
    from hybridplan.executor import tensor_parallel as etp

    model, batch, _ = MODELS[name]()
    example = batch(BATCH, 0)[0]
    layout = etp.detect(model, None, example)
    return model, etp.detect_sequence(model, layout, tp, None, example, source="p.json")


def test_sequence_parallel_roles_come_from_the_check():
    """Llama: norms per token, the attention and MLP gather at their parent's inputs (their
    glue reads the input's shape), the blocks between; torch's encoder layer: its
    MultiheadAttention (left whole) gathers and chunks its output again, linear1 gathers."""
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    _, sp = _sequence_layout("llama")
    assert sp.blocks == ["model.layers.0", "model.layers.1"] and sp.max_degree == SEQ
    layer = "model.layers.0"
    assert sp.roles[f"{layer}.input_layernorm"] == "per_token"
    assert sp.roles[f"{layer}.self_attn.q_proj"] == "colwise"
    assert sp.roles[f"{layer}.self_attn.o_proj"] == "rowwise"
    assert sp.gather_at[f"{layer}.self_attn.k_proj"] == f"{layer}.self_attn"
    assert sp.gather_at[f"{layer}.mlp.up_proj"] == f"{layer}.mlp"
    assert sp.inputs[f"{layer}.self_attn"].keywords == ("hidden_states",)
    _, sp = _sequence_layout("encoder_stack")
    assert sp.roles["layers.1.self_attn"] == "gather"
    assert sp.inputs["layers.1.self_attn"].positions == (0, 1, 2)  # query, key, value
    assert sp.roles["layers.1.linear1"] == "colwise" and "layers.1.linear1" not in sp.gather_at
    assert sp.roles["layers.1.norm2"] == "per_token"


def test_sequence_parallel_is_refused_where_glue_needs_the_whole_sequence():
    """GPT-2's attention is left whole (its fused c_attn does not split), and the attention
    core between c_attn and c_proj is code, not a node: it would see one rank's tokens. The
    refusal names the node whose input shows it, and the plan."""
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    with pytest.raises(ValueError, match=r"p\.json: sequence_parallel does not apply to "
                                         r"GPT2LMHeadModel at tp=2: .*attn\.c_proj"):
        _sequence_layout("gpt2")
    with pytest.raises(ValueError, match="sequence length 6 .* not divisible by 4"):
        _sequence_layout("llama", tp=4)
