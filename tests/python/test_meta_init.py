"""Models built on the meta device (executor/materialize.py) and pretrained weights loaded straight
into a rank's pieces (executor/pretrained.py).

In this process: hybridplan.materialize's rule (each module initialised, children first, from a
seed of its name) is deterministic, keeps ties, lets a parent's initialiser write its
children's tensors (nn.MultiheadAttention zeroes out_proj.bias, GPT-2's attention rescales
c_proj.weight) and refuses, naming the tensors, an initialiser that leaves a tensor unset or
replaces it; Pretrained refuses a directory without safetensors, an index naming a missing
file, a missing tensor and a mis-shaped one, naming the file and the tensor.

One launch of 2 Gloo ranks (dist_harness.run_cases) applies a meta-built model under DDP
(dp=2), zero3 (FSDP2 shards) and tensor parallelism (tp=2); each rank's weights after apply
equal the one-process reference hybridplan.materialize(model) exactly, and after one step they
equal one-process training on the global batch (float reassociation). So does a pipeline of a
meta-built model, cut on the meta device: GPT-2 under 1F1B (2 stages, its tied wte/lm_head on
both; a switch reusing its module, whose tensors stay on the meta device, is refused), and
(marker `full`, a launch of its own) Llama under ZB-V (4 stages on 2 ranks, rank 0 holding the
first and the last) and under a placement of each replica's nodes over 2 devices; and
(marker `full`, 4 ranks) a Llama of 4 query over 2 key-value heads under a 1F1B pipeline of 2
stages x TP 2 and under 2 replicas of a 2-stage pipeline whose stages are sharded zero2. What
each rank materialised is checked too: a pipeline rank holds storage for its own stages'
tensors and for nothing else (the other stages and the original module stay on the meta
device), and a zero3 rank's parameters take 1/2 of the whole model's bytes (each tensor's
shard, dim-0 rows rounded up). Two more cases load a
Hugging Face safetensors directory (a meta-built Llama from shards with an index, under zero3;
a real GPT-2 from one file, under a 1F1B pipeline of 2 stages, its tied wte/lm_head on both),
train zero steps and export: the exported tensors equal the files read. And
hybridplan.parallelize, given the meta-built GPT-2 (a fake profile, then the planner's plan),
passes init_seed on to apply: the same weights.
"""

import os

import pytest
import torch
from torch import nn

from dist_harness import run_cases
from plan_builders import pipeline_plan, placement_plan, share

BATCH = 4      # per replica
LR = 0.1
SEED = 3


def llama_gqa():
    """user_models' Llama with 4 query heads over 2 key-value heads (user_models.llama has one
    key-value head, so its attention runs whole under tp = 2; this one splits it)."""
    import user_models
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = user_models._decoder_config(LlamaConfig)
    config.num_attention_heads, config.num_key_value_heads = 4, 2
    config.head_dim = user_models.D_MODEL // 4
    return (LlamaForCausalLM(config), user_models._causal_lm_batch,
            user_models._next_token_loss)


def _builder(name):
    import user_models
    return llama_gqa if name == "llama_gqa" else getattr(user_models, name)


def meta_model(name):
    """(model built on the meta device, batch, loss) of user_models' `name` (or llama_gqa)."""
    with torch.device("meta"):
        return _builder(name)()


def real_model(name):
    return _builder(name)()


def with_tp(plan, tp):
    world = plan["world_size"] * tp
    return dict(plan, tp=tp, world_size=world,
                mesh=[[d * tp for d in row] for row in plan["mesh"]],
                cluster=dict(plan["cluster"], devices_per_node=world, num_nodes=1))


def plan_for(name, kind):
    model, batch, _ = real_model(name)  # the plan reads module structure and call order only
    if kind == "ddp":
        return placement_plan(model, dp=2, mp=1, per_replica_batch=BATCH)
    if kind == "place2":  # each replica's nodes over 2 devices of its one process
        return placement_plan(model, dp=2, mp=2, per_replica_batch=BATCH)
    if kind == "zero3":
        return dict(placement_plan(model, dp=2, mp=1, per_replica_batch=BATCH), sharding="zero3")
    if kind == "tp":
        return with_tp(placement_plan(model, dp=1, mp=1, per_replica_batch=BATCH), 2)
    if kind == "pipe_tp":  # each of 2 stages split over 2 TP ranks: 4 ranks
        return with_tp(pipeline_plan(model, dp=1, mp=2, schedule="1f1b", num_microbatches=2,
                                     per_replica_batch=BATCH,
                                     example_inputs=batch(BATCH, 0)[0]), 2)
    if kind == "pipe_zero2":  # 2 replicas of 2 stages, each stage sharded over its 2 replicas
        return dict(pipeline_plan(model, dp=2, mp=2, schedule="1f1b", num_microbatches=2,
                                  per_replica_batch=BATCH, example_inputs=batch(BATCH, 0)[0]),
                    sharding="zero2")
    if kind == "zbv":  # 4 stages on 2 ranks, along a V
        return pipeline_plan(model, dp=1, mp=2, schedule="zbv", num_microbatches=2,
                             virtual_stages=2, per_replica_batch=BATCH,
                             example_inputs=batch(BATCH, 0)[0])
    assert kind == "pipe"
    return pipeline_plan(model, dp=1, mp=2, schedule="1f1b", num_microbatches=2,
                         per_replica_batch=BATCH, example_inputs=batch(BATCH, 0)[0])


def _bytes(tensors):
    """Bytes of storage the (local parts of the) tensors hold, each tensor once; meta: 0."""
    from torch.distributed.tensor import DTensor
    seen, total = set(), 0
    for t in list(tensors):  # alive while counted: ids are not reused
        if id(t) in seen:
            continue
        seen.add(id(t))
        local = t.to_local() if isinstance(t, DTensor) else t
        if not local.is_meta:
            total += local.numel() * local.element_size()
    return total


def holdings(hp, model):
    """What this rank materialised: its own part's bytes and every other tensor's it can reach
    (a pipeline: the other stages' and the original module's), and the whole model's."""
    whole = sum(p.numel() * p.element_size() for p in model.parameters())
    if hp.plan.mode == "pipeline":
        mine = {id(t) for t in list(hp.module.parameters()) + list(hp.module.buffers())}
        others = [t for i, stage in enumerate(hp._cut.stages) if i not in hp.stages
                  for t in list(stage.parameters()) + list(stage.buffers())]
        others += list(model.parameters()) + list(model.buffers())
        return {"own": _bytes(hp.module.parameters()), "whole": whole,
                "elsewhere": _bytes(t for t in others if id(t) not in mine),
                "stages": list(hp.stages)}
    return {"own": _bytes(hp.module.parameters()), "whole": whole}


def sgd(params):
    return torch.optim.SGD(params, lr=LR)


# ---- rank side --------------------------------------------------------------------------------

def meta_cases(cases_file, out_dir):
    import torch.distributed as dist
    import hybridplan
    from hybridplan.executor import destroy_groups
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    for case in torch.load(cases_file):
        model, batch, loss_fn = (real_model if case.get("real") else meta_model)(case["model"])
        if case.get("parallelize"):  # the front door passes the options on to apply
            inputs, target = batch(BATCH, 0)
            hp = hybridplan.parallelize(model, inputs, example_target=target, loss_fn=loss_fn,
                                        optimizer=sgd, cluster="localhost-cpu",
                                        modes=("placement",), cache_dir=False, verbose=False,
                                        init_seed=SEED)
            plan = hp.plan.to_dict()
        else:
            plan = case["plan"]
            example = share(batch(plan["dp"] * BATCH, 0)[0], plan["dp"], 0)
            try:
                hp = hybridplan.apply(plan, model, loss_fn=loss_fn, optimizer=sgd,
                                      timeout_s=120, example_inputs=example,
                                      load_pretrained=case.get("pretrained"),
                                      **({} if case.get("real") else {"init_seed": SEED}))
            except ValueError as e:  # refused on every rank alike
                torch.save({"refused": str(e)},
                           os.path.join(out_dir, f"{case['id']}.rank{dist.get_rank()}.pt"))
                continue
        result = {"applied": hp.state_dict(), "mode": plan["mode"]}
        if not case.get("real") and not case.get("parallelize"):
            result["holdings"] = holdings(hp, model)
        if case.get("parallelize"):
            pass
        elif case.get("export"):
            hp.export_pretrained(case["export"])
        else:
            hp.step(*hp.shard(*batch(plan["dp"] * BATCH, 1)))
            result["stepped"] = hp.state_dict()
            if case.get("switch"):  # the module is still on the meta device: refused, intact
                try:
                    hp.switch(plan)
                except ValueError as e:
                    result["switch_refused"] = str(e)
        hp.close()
        torch.save(result, os.path.join(out_dir, f"{case['id']}.rank{dist.get_rank()}.pt"))
    destroy_groups()


# ---- test side --------------------------------------------------------------------------------

def reference(name, global_batch):
    """The one-process twin: materialized from the same seed, then one SGD step on the
    global batch."""
    import hybridplan
    model, batch, loss_fn = meta_model(name)
    hybridplan.materialize(model, init_seed=SEED)
    applied = {k: v.clone() for k, v in model.state_dict().items()}
    inputs, target = batch(global_batch, 1)
    loss = loss_fn(model(**inputs), target)
    loss.backward()
    sgd(model.parameters()).step()
    return applied, {k: v.clone() for k, v in model.state_dict().items()}


def read_dir(directory):
    from safetensors.torch import load_file
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(directory, name)))
    return out


def test_every_plan_kind_materialises_the_one_process_weights(tmp_path):
    import hybridplan
    sources = {}
    for name, shard_size in (("llama", "8KB"), ("gpt2", "5GB")):
        model, _, _ = meta_model(name)
        hybridplan.materialize(model, init_seed=SEED + 1)  # other values than apply's seed
        directory = str(tmp_path / f"{name}-source")
        model.save_pretrained(directory, max_shard_size=shard_size)
        sources[name] = directory
    assert os.path.exists(os.path.join(sources["llama"], "model.safetensors.index.json"))
    cases = [{"id": f"{name}-{kind}", "model": name, "plan": plan_for(name, kind),
              "switch": kind == "pipe"}
             for name, kind in (("llama", "ddp"), ("llama", "zero3"), ("gpt2", "tp"),
                                ("gpt2", "pipe"))]
    # a meta model under zero3; a real one under the pipeline (its stages read the files)
    cases += [{"id": f"{name}-{kind}-pretrained", "model": name, "plan": plan_for(name, kind),
               "pretrained": sources[name], "export": str(tmp_path / f"{name}-{kind}-export"),
               "real": kind == "pipe"}
              for name, kind in (("llama", "zero3"), ("gpt2", "pipe"))]
    cases.append({"id": "gpt2-parallelize", "model": "gpt2", "parallelize": True,
                  "plan": {"dp": 1}})
    check_cases(cases, tmp_path, sources)


@pytest.mark.full
def test_meta_model_under_more_plan_kinds(tmp_path):
    """The same checks for a zero-bubble multi-stage pipeline (ZB-V) and a placement of each
    replica's nodes over 2 devices (make test-full: another 2-rank launch)."""
    check_cases([{"id": f"llama-{kind}", "model": "llama", "plan": plan_for("llama", kind)}
                 for kind in ("zbv", "place2")], tmp_path, {})


@pytest.mark.full
def test_meta_model_under_tensor_parallel_pipelines_and_zero2_stages(tmp_path):
    """On 4 Gloo ranks, a meta-built Llama with grouped-query attention (4 query over 2
    key-value heads) under a 1F1B pipeline of 2 stages with each stage split over 2 TP ranks
    (each TP rank traces its stage at its own heads and fills its slices), and the same model
    under 2 replicas of a 2-stage pipeline whose stages are sharded zero2 over their replicas
    (each stage filled whole on its own ranks only, then sharded). After apply, every rank's
    gathered weights equal the one-process materialisation; after one step, one-process
    training on the global batch. Each rank materialised its own stage's tensors and nothing
    of the other stage: under zero2 the two ranks of a stage hold a half of it each, under TP
    the attention's and MLP's weights are halved while the norms stay whole."""
    cases = [{"id": f"llama_gqa-{kind}", "model": "llama_gqa",
              "plan": plan_for("llama_gqa", kind)} for kind in ("pipe_tp", "pipe_zero2")]
    results = check_cases(cases, tmp_path, {}, ranks=4)
    model, _, _ = meta_model("llama_gqa")
    stage_of = _stage_bytes(cases[0]["plan"], model)
    held = [r["holdings"] for r in results["llama_gqa-pipe_zero2"]]
    # ranks (r * mp + s): replica r's stage s; zero2 shards a stage over its 2 replicas
    assert [h["stages"] for h in held] == [[0], [1], [0], [1]]
    for s in (0, 1):
        pair = [held[s]["own"], held[2 + s]["own"]]
        assert sum(pair) == stage_of[s], (s, pair, stage_of)
        assert all(0 < own < stage_of[s] for own in pair), (s, pair)
    held = [r["holdings"] for r in results["llama_gqa-pipe_tp"]]
    # ranks (s * tp + t): stage s, TP rank t
    assert [h["stages"] for h in held] == [[0], [0], [1], [1]]
    for s in (0, 1):
        own = [held[2 * s]["own"], held[2 * s + 1]["own"]]
        assert own[0] == own[1] and stage_of[s] / 2 < own[0] < stage_of[s], (s, own, stage_of)
    for h in held + [r["holdings"] for r in results["llama_gqa-pipe_zero2"]]:
        assert h["elsewhere"] == 0, h


def _stage_bytes(plan, model):
    """{stage: bytes of the parameters of the nodes the plan assigns to it}."""
    from hybridplan.profiler import block_list
    nodes = block_list.select_nodes(model)
    out = {}
    for a in plan["assignment"]:
        mod = nodes[a["name"]]
        out[a["device"]] = out.get(a["device"], 0) + sum(
            p.numel() * p.element_size() for p in mod.parameters(recurse=True))
    return out


def check_cases(cases, tmp_path, sources, ranks=2):
    """Runs `cases` on `ranks` ranks (meta_cases) and checks each against the one-process twin;
    returns the ranks' results."""
    results, failures = run_cases("test_meta_init:meta_cases", {ranks: cases}, tmp_path,
                                  timeout_s=240)
    assert not failures, failures
    refs = {}
    for case in cases:
        got = results[case["id"]]
        assert isinstance(got, list), got
        name, plan = case["model"], case["plan"]
        for rank_result in got:
            assert "refused" not in rank_result, (case["id"], rank_result)
        if case["id"] in ("gpt2-pipe", "llama-zbv"):  # a rank holds its stages and no more
            held = [r["holdings"] for r in got]
            assert [h["stages"] for h in held] == ([[0], [1]] if case["id"] == "gpt2-pipe"
                                                   else [[0, 3], [1, 2]])
            for h in held:
                assert h["elsewhere"] == 0 and 0 < h["own"] < h["whole"], (case["id"], h)
            # gpt2's tied wte is on both ranks; llama's stages share nothing
            extra = 0 if name == "llama" else got[0]["applied"][
                "transformer.wte.weight"].numel() * 4
            assert sum(h["own"] for h in held) == held[0]["whole"] + extra, (case["id"], held)
        if case.get("switch"):  # a switch cannot reuse a module whose weights are stages'
            for rank_result in got:
                assert "was built on the meta device" in rank_result["switch_refused"]
        if case["id"] == "llama-zero3":  # each rank's shards: half of each tensor's dim 0
            model, _, _ = meta_model(name)
            halves = sum(-(-p.shape[0] // 2) * (p.numel() // p.shape[0]) * p.element_size()
                         for p in model.parameters())
            held = [r["holdings"] for r in got]
            assert sum(h["own"] for h in held) == held[0]["whole"], held
            assert all(h["own"] <= halves for h in held), (held, halves)
        if "pretrained" in case:
            source, exported = read_dir(sources[name]), read_dir(case["export"])
            assert sorted(exported) == sorted(source), case["id"]
            for key, value in source.items():
                assert torch.equal(exported[key], value), (case["id"], key)
            continue
        if (name, plan["dp"]) not in refs:
            refs[name, plan["dp"]] = reference(name, plan["dp"] * BATCH)
        applied, stepped = refs[name, plan["dp"]]
        for rank_result in got:
            assert sorted(rank_result["applied"]) == sorted(applied)
            for key, value in applied.items():
                assert torch.equal(rank_result["applied"][key], value), (case["id"], key)
            if "parallelize" in case:
                continue
            for key, value in stepped.items():
                torch.testing.assert_close(rank_result["stepped"][key], value, rtol=1e-5,
                                           atol=1e-5, msg=lambda m: f"{case['id']} {key}: {m}")
    return results


# ---- the rule, in this process -----------------------------------------------------------------

class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.attn = nn.MultiheadAttention(8, 2)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, ids):
        x = self.embed(ids)
        x = self.attn(x, x, x)[0]
        return self.head(self.norm(x))


def test_materialize_rule():
    import hybridplan
    from hybridplan.executor.materialize import Initializer, seed_of

    def built(seed):
        with torch.device("meta"):
            m = Small()
        return hybridplan.materialize(m, init_seed=seed)
    a, b, c = built(0), built(0), built(1)
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    assert not torch.equal(a.embed.weight, c.embed.weight)
    assert a.head.weight is a.embed.weight  # still tied
    assert not a.embed.weight.is_meta and a.embed.weight.abs().sum() > 0
    # the parent's initialiser writes its child's tensor, after the child's own (post-order)
    assert torch.equal(a.attn.out_proj.bias, torch.zeros(8))
    # one module's values do not depend on which others are initialised
    with torch.device("meta"):
        m = Small()
    init = Initializer(m, seed=0)
    only = dict(init.values({"norm.weight", "attn.in_proj_weight"}))
    assert sorted(only) == ["attn.in_proj_weight", "norm.weight"]
    assert torch.equal(only["attn.in_proj_weight"], a.attn.in_proj_weight)
    assert seed_of(0, "attn") != seed_of(0, "norm") and seed_of(0, "a") == seed_of(0, "a")


def test_hugging_face_initialiser_writes_children():
    """GPT-2's _init_weights(GPT2Attention) rescales c_proj.weight by 1/sqrt(2 n_layer) after
    c_proj's own normal(0.02) init: recorded as a write of the attention module."""
    from hybridplan.executor.materialize import Initializer
    model, _, _ = meta_model("gpt2")
    init = Initializer(model, seed=0)
    writers = {name: writes for name, _, writes in init.calls}
    assert "transformer.h.0.attn.c_proj.weight" in writers["transformer.h.0.attn"]
    assert "transformer.h.0.attn.c_proj.weight" in writers["transformer.h.0.attn.c_proj"]
    model2, _, _ = meta_model("llama")
    init2 = Initializer(model2, seed=0)
    assert "model.rotary_emb.inv_freq" in {n for _, _, w in init2.calls for n in w}
    assert not init2.unwritten


class Unset(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))  # no reset_parameters: nothing writes it
        self.lin = nn.Linear(3, 3)


class Replacing(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))

    def reset_parameters(self):
        self.w = nn.Parameter(torch.zeros(3))


def test_materialize_refuses_what_it_cannot_initialise():
    import hybridplan
    with torch.device("meta"):
        unset, replacing = Unset(), Replacing()
    with pytest.raises(ValueError, match=r"set by no initialiser.*'scale'"):
        hybridplan.materialize(unset)
    with pytest.raises(ValueError, match=r"replaced tensors .*\['w'\]"):
        hybridplan.materialize(replacing)
    assert replacing.w.is_meta  # left as it was
    # a callable initialiser that does set it
    hybridplan.materialize(unset, init_weights=lambda m: (
        nn.init.ones_(m.scale) if isinstance(m, Unset) else
        m.reset_parameters() if hasattr(m, "reset_parameters") else None))
    assert torch.equal(unset.scale, torch.ones(3))


def test_pretrained_errors_name_the_file_and_tensor(tmp_path):
    import json
    from safetensors.torch import save_file
    from hybridplan.executor.materialize import canonical_names
    from hybridplan.executor.pretrained import Pretrained

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2))
    names = canonical_names(model)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"empty: holds neither model.safetensors nor"):
        Pretrained(str(empty), model, names)
    good = {"0.weight": torch.ones(3, 4), "0.bias": torch.ones(3), "1.weight": torch.ones(2, 3),
            "1.bias": torch.ones(2)}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    save_file({k: good[k] for k in ("0.weight", "0.bias")},
              str(sharded / "model-00001-of-00002.safetensors"))
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "0.weight": "model-00001-of-00002.safetensors",
        "0.bias": "model-00001-of-00002.safetensors",
        "1.weight": "model-00002-of-00002.safetensors",
        "1.bias": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(ValueError, match=r"index.json: names model-00002-of-00002.safetensors, "
                                         r"which is missing"):
        Pretrained(str(sharded), model, names)
    missing = tmp_path / "missing"
    missing.mkdir()
    save_file({k: v for k, v in good.items() if k != "1.bias"},
              str(missing / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing/model.safetensors: 1 tensors of Sequential "
                                         r"are missing: \['1.bias'\]"):
        Pretrained(str(missing), model, names)
    shaped = tmp_path / "shaped"
    shaped.mkdir()
    save_file(dict(good, **{"1.weight": torch.ones(3, 2)}), str(shaped / "model.safetensors"))
    with pytest.raises(ValueError, match=r"shaped/model.safetensors: tensor 1.weight has shape "
                                         r"\[3, 2\]; the model's 1.weight is \[2, 3\]"):
        Pretrained(str(shaped), model, names)
    ok = tmp_path / "ok"
    ok.mkdir()
    save_file(good, str(ok / "model.safetensors"))
    assert Pretrained(str(ok), model, names).holds() == set(good)


def test_apply_refuses_init_weights_on_a_real_model():
    from hybridplan.executor.materialize import Weights
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"init_weights applies to a model built on the meta"):
        Weights.of(model, lambda m: None, 0, None, "plan.json")
    assert Weights.of(model, None, 0, None, "plan.json") is None


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_meta_cut_runs_on_the_stage_device(name):
    """A meta-built model is cut on the meta device; the graphs name the meta device where the
    trace made tensors (Llama's and GPT-2's arange, Llama's rotary `.to(device)`) until
    stage_on rewrites them; stages given storage and values run as the one-process twin."""
    import copy
    import torch.fx as fx
    import hybridplan
    from hybridplan.executor.materialize import Weights
    from hybridplan.profiler import stage_split
    model, batch, _ = meta_model(name)
    twin = hybridplan.materialize(copy.deepcopy(model), init_seed=SEED)
    inputs, _ = batch(2, 0)
    plan = plan_for(name, "pipe")
    cut = stage_split.split(model, (), inputs, {a["name"]: a["device"]
                                                for a in plan["assignment"]}, 2)
    assert cut.on_meta

    def meta_args(stage):
        found = []
        for mod in stage.modules():
            graph = getattr(mod, "graph", None)
            if isinstance(graph, fx.Graph):
                for node in graph.nodes:
                    fx.node.map_aggregate((node.args, node.kwargs), lambda v: found.append(
                        node.name) if isinstance(v, torch.device) and v.type == "meta" else v)
        return found
    assert meta_args(cut.stages[0])  # the trace's device, in the graph
    weights = Weights.of(model, None, SEED, None, "plan.json", "pipeline")
    stages = []
    for s in range(2):
        stage = cut.stage_on(s, torch.device("cpu"))
        assert not meta_args(stage)
        weights.fill_module(nn.ModuleList([stage]), lambda _n: torch.device("cpu"),
                            lambda n: stage_split.original_name(n.split(".", 1)[1]))
        stages.append(stage)
    assert all(p.is_meta for p in model.parameters())  # the original keeps no storage
    out = cut.unflatten_outputs(stages[1](*stages[0](*cut.flatten_inputs((), inputs))))
    assert torch.equal(out.logits, twin(**inputs).logits)
