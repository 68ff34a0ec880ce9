"""Models whose sizes no power of two divides (docs/tensor_parallel.md "Awkward sizes"):
profile -> the graph validates -> plans on the localhost-cpu preset with 2 and 4 devices ->
every plan kind the planner offers trains on Gloo ranks equal to one-process training
(torch.allclose(rtol=1e-4, atol=1e-6)), and hybridplan.parallelize applies its own choice.

    gpt2_odd    GPT2LMHeadModel from a config: vocabulary 101 (a prime: the embedding and the
                tied LM head run whole), width 48 in 3 heads (the fused c_attn runs whole
                anyway), MLP width 100 (max_degree 100: splits at 2 and 4)
    llama_odd   LlamaForCausalLM: vocabulary 100 (8 does not divide it), width 48 in 3 query
                heads over 1 key-value head (the attention runs whole), MLP width 50
                (max_degree 50: splits at 2, runs whole at 4)
    plain_odd   torch modules: nn.Embedding(101, 50), an MLP 50 -> 100 -> 50 (max_degree 100)
                and one 50 -> 50 -> 50 (max_degree 50), an LM head 50 -> 101

Plan kinds: every distinct (mode, dp, mp, tp, sequence parallel, sharding, schedule) among the
planner's top 50 plans on 2 devices, and the best plan it offers at each tensor-parallel degree
(tp = 2 for every model), trained in one 2-rank launch; plain_odd's and llama_odd's best tp = 4
plans on 4 ranks in one more launch (a node there, max_degree 50, runs whole on every rank).
`make test` trains the reduced form (in_reduced): on every model its tensor-parallel, DP and
1F1B plans, each other pipeline schedule on one model; the other kinds and the 4-rank launch
run in the test marked `full` (`make test-full`, run by `make bench`; test_tensor_parallel.py
trains a tp = 4 plan whose attention runs whole on 4 ranks in make test).
Under tp > 1 the parameters split on the ranks are those of the nodes whose max_degree tp
divides (the planner's rule, applied by the executor), the others whole.
`pytest -s -k equality_table` prints model x plan kind -> max |difference| from one process.
"""

import functools
import math
import os
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dist_harness import run_cases
from plan_builders import share
from user_models import train_one_process

STEPS, PROFILE_BATCH, SEQ, LR, MOMENTUM = 3, 4, 6, 0.05, 0.9
TOP_K = 50


# ---- models -----------------------------------------------------------------------------------

def _lm_batch(vocab):
    def batch(n, seed):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (n, SEQ + 1), generator=g)
        return {"input_ids": ids[:, :-1]}, ids[:, 1:]
    return batch


def _hf_loss(output, target):
    return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())


def gpt2_odd():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=48, n_head=3, n_inner=100, vocab_size=101,
                        n_positions=SEQ, use_cache=False, resid_pdrop=0.0, embd_pdrop=0.0,
                        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config), _lm_batch(101), _hf_loss


def llama_odd():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=100, hidden_size=48, intermediate_size=50,
                         num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
                         max_position_embeddings=2 * SEQ, use_cache=False,
                         attention_dropout=0.0, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    return LlamaForCausalLM(config), _lm_batch(100), _hf_loss


class Mlp(nn.Module):
    def __init__(self, width, inner):
        super().__init__()
        self.fc_in = nn.Linear(width, inner)
        self.act = nn.GELU()
        self.fc_out = nn.Linear(inner, width)

    def forward(self, x):
        return x + self.fc_out(self.act(self.fc_in(x)))


class PlainOdd(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(101, 50)
        self.mlp1 = Mlp(50, 100)
        self.mlp2 = Mlp(50, 50)
        self.head = nn.Linear(50, 101)

    def forward(self, input_ids):
        return self.head(self.mlp2(self.mlp1(self.embed(input_ids))))


def plain_odd():
    torch.manual_seed(0)

    def loss(output, target):
        return F.cross_entropy(output.flatten(0, 1), target.flatten())
    return PlainOdd(), _lm_batch(101), loss


FACTORIES = {"gpt2_odd": gpt2_odd, "llama_odd": llama_odd, "plain_odd": plain_odd}
# what the profiler must find: node -> max_degree (None: no tensor_parallel)
EXPECTED_DEGREES = {
    "gpt2_odd": {"transformer.wte": None, "lm_head": None, "transformer.h.0.attn.c_attn": None,
                 "transformer.h.0.mlp.c_fc": 100, "transformer.h.1.mlp.c_proj": 100},
    "llama_odd": {"model.embed_tokens": 100, "lm_head": 100,
                  "model.layers.0.self_attn.k_proj": None, "model.layers.0.mlp.up_proj": 50,
                  "model.layers.1.mlp.down_proj": 50},
    "plain_odd": {"embed": None, "head": None, "mlp1.fc_in": 100, "mlp1.fc_out": 100,
                  "mlp2.fc_in": 50, "mlp2.fc_out": 50},
}
FOUR_RANKS = ("plain_odd", "llama_odd")  # their tp = 4 plans: a node of max_degree 50 whole
# make test: the other pipeline schedules each on one model (all of them: the `full` test)
ONE_MODEL = {"gpipe": "plain_odd", "interleaved-1f1b": "gpt2_odd", "interleaved-zb": "llama_odd",
             "zbv": "gpt2_odd"}


def in_reduced(name, kind):
    """Whether `make test` trains model `name` under plan kind `kind` (see the module doc)."""
    words = kind.split()
    if words[3] == "tp4":
        return False  # 4 ranks
    if words[0] != "pipeline" or words[3] != "tp1":
        return True  # DP, placement, tensor parallelism
    return words[-1] == "1f1b" or ONE_MODEL.get(words[-1]) == name


def sgd(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def localhost_cpu(devices):
    import hybridplan
    cluster = hybridplan.load_cluster("localhost-cpu").to_dict()
    cluster.update(devices_per_node=devices, name=f"localhost-cpu-{devices}")
    return cluster


def kind_of(plan):
    """A plan's kind: "<mode> dp<d> mp<m> tp<t>" and its sequence parallelism, sharding and
    schedule where it has them."""
    words = [plan["mode"], f"dp{plan['dp']}", f"mp{plan['mp']}", f"tp{plan.get('tp', 1)}"]
    if plan.get("sequence_parallel"):
        words.append("sp")
    if plan.get("sharding", "none") != "none":
        words.append(plan["sharding"])
    if plan["mode"] == "pipeline":
        words.append(plan["schedule"])
    return " ".join(words)


def offered(graph, devices):
    """{kind: the planner's best plan of that kind} on `devices` devices: the kinds among its
    top TOP_K plans, and its best plan at each tensor-parallel degree it allows (a TP plan can
    rank below TOP_K on a CPU cluster, where the collectives are dear)."""
    import hybridplan
    cluster = localhost_cpu(devices)
    found = list(hybridplan.search(graph, cluster, None, devices=devices, top_k=TOP_K).plans)
    degrees = [t for t in range(2, devices + 1) if devices % t == 0]
    for t in degrees:
        try:
            found += list(hybridplan.search(graph, cluster, None, devices=devices, top_k=1,
                                            tensor_degrees=[t]).plans)
        except ValueError:  # the graph allows no split at t: no such plan to offer
            continue
    kinds = {}
    for plan in found:
        kinds.setdefault(kind_of(plan.to_dict()), plan.to_dict())
    return kinds


# ---- rank side --------------------------------------------------------------------------------

def train_cases(cases_file, out_dir, parallelize):
    """Trains every case of `cases_file` in turn on this rank and saves its state; then, with
    `parallelize`, one step of each model under hybridplan.parallelize's own plan."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    import hybridplan
    from hybridplan.executor import destroy_groups
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    for case in torch.load(cases_file):
        started = time.monotonic()
        model, batch, loss_fn = FACTORIES[case["model"]]()
        plan = case["plan"]
        global_batch = plan["global_batch"]
        example = share(batch(global_batch, 100)[0], plan["dp"], 0)
        hp = hybridplan.apply(plan, model, loss_fn=loss_fn, optimizer=sgd, timeout_s=120,
                              graph=case["graph"], example_inputs=example)
        for step in range(STEPS):
            hp.step(*hp.shard(*batch(global_batch, 100 + step)))
        split = sorted({n.rsplit(".", 1)[0] for n, p in hp.module.named_parameters()
                        if isinstance(p, DTensor) and "Shard" in str(p.placements)})
        torch.save({"state": hp.state_dict(), "split": split,
                    "seconds": time.monotonic() - started},
                   os.path.join(out_dir, f"{case['id']}.rank{dist.get_rank()}.pt"))
        hp.close()
    chosen = {}
    for name in (FACTORIES if parallelize else ()):
        started = time.monotonic()
        model, batch, loss_fn = FACTORIES[name]()
        inputs, _ = batch(PROFILE_BATCH, 0)
        hp = hybridplan.parallelize(model, inputs, optimizer=sgd, loss_fn=loss_fn,
                                    cluster=localhost_cpu(dist.get_world_size()),
                                    cache_dir=False, verbose=False, timeout_s=120,
                                    profile_options={"warmup": 0, "repeats": 1})
        plan = hp.parallelized.plan.to_dict()
        loss = hp.step(*hp.shard(*batch(plan["global_batch"], 7)))
        chosen[name] = (kind_of(plan), float(loss), time.monotonic() - started)
        hp.close()
    if parallelize:
        torch.save(chosen, os.path.join(out_dir, f"parallelized.rank{dist.get_rank()}.pt"))
    destroy_groups()


# ---- test side --------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def reference_state(name, global_batch):
    """One process on the global batch (every plan's loss is the mean over the global batch:
    its micro-batches and replicas are equal shares)."""
    torch.set_num_threads(1)
    return train_one_process(FACTORIES[name], global_batch, STEPS, sgd)


def _needs_planner():
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")


@pytest.fixture(scope="module")
def graphs():
    """{model: its profiled Graph}: the Python profiler's, validated by the C++ Graph."""
    _needs_planner()
    import hybridplan
    from hybridplan.profiler import profile_dict
    torch.set_num_threads(1)
    out = {}
    for name, factory in FACTORIES.items():
        model, batch, _ = factory()
        d = profile_dict(model, batch(PROFILE_BATCH, 0)[0], warmup=0, repeats=1,
                         verbose=False, name=name)
        out[name] = (d, hybridplan.planner.Graph.from_dict(d, f"{name} graph"))
    return out


def test_timed_degrees_are_the_divisors():
    from hybridplan.profiler.tensor_parallel import timed_degrees
    assert timed_degrees(100) == [2, 4]   # a vocabulary of 100: not 8
    assert timed_degrees(50) == [2]       # a width of 50: not 4
    assert timed_degrees(6) == [2]
    assert timed_degrees(192) == [2, 4, 8]
    assert timed_degrees(2) == [2]


def test_timed_degrees_are_the_split_times_the_graph_accepts():
    """The profiler's rule (timed_degrees) and the graph's (graph.cc validate_split_times):
    for every even max_degree up to 64, the degrees the profiler times validate, and each
    other degree of (2, 4, 8) is refused with the graph's message."""
    _needs_planner()
    import hybridplan
    from hybridplan.profiler.tensor_parallel import kTimedDegrees, timed_degrees
    torch.set_num_threads(1)
    model, batch, _ = plain_odd()
    base = hybridplan.profiler.profile_dict(model, batch(2, 0)[0], warmup=0, repeats=1,
                                            verbose=False, name="plain_odd")
    at = next(i for i, n in enumerate(base["nodes"]) if n["name"] == "mlp1.fc_in")

    def graph_with(max_degree, degrees):
        tp = dict(base["nodes"][at]["tensor_parallel"], max_degree=max_degree,
                  split_times=[{"degree": d, "forward_s": 1e-4, "backward_s": 2e-4}
                               for d in degrees])
        nodes = [dict(n) for n in base["nodes"]]
        nodes[at] = dict(nodes[at], tensor_parallel=tp)
        return hybridplan.planner.Graph.from_dict(dict(base, nodes=nodes))

    for max_degree in range(2, 65, 2):
        graph_with(max_degree, timed_degrees(max_degree))
        for d in set(kTimedDegrees) - set(timed_degrees(max_degree)):
            with pytest.raises(ValueError, match=rf"nodes\[{at}\]\.tensor_parallel\."
                               rf"split_times\[0\]\.degree must be >= 2 and divide max_degree"
                               rf" = {max_degree} \(got {d}\)"):
                graph_with(max_degree, [d])


def test_profiled_degrees_divide_and_odd_sizes_run_whole(graphs):
    from hybridplan.profiler.tensor_parallel import detect_layout
    for name, (d, graph) in graphs.items():
        nodes = {n["name"]: n for n in d["nodes"]}
        for node, want in EXPECTED_DEGREES[name].items():
            tp = nodes[node].get("tensor_parallel")
            assert (tp and tp["max_degree"]) == want, (name, node, tp)
        for node in nodes.values():
            tp = node.get("tensor_parallel")
            if tp:  # every split time at a degree that divides the node's max_degree
                degrees = [s["degree"] for s in tp.get("split_times", [])]
                assert degrees and all(tp["max_degree"] % x == 0 for x in degrees), node
    # why the odd ones run whole, for the user
    model, batch, _ = plain_odd()
    refused = detect_layout(model, example_inputs=batch(2, 0)[0]).refused
    assert "no even common divisor (greatest common divisor 101)" in refused["embed"]
    assert "no even common divisor (greatest common divisor 101)" in refused["head"]
    model, batch, _ = llama_odd()
    refused = detect_layout(model, example_inputs=batch(2, 0)[0]).refused
    assert "splitting at degree 2 fails" in refused["model.layers.0.self_attn.k_proj"]


def test_planner_offers_tensor_parallelism_on_2_and_4_devices(graphs):
    """tp = 2 and tp = 4 for every model (each has a node of max_degree 100); the explanation
    of a tp = 4 plan names the nodes of max_degree 50 that run whole, and only those."""
    import hybridplan
    for name, (_, graph) in graphs.items():
        assert any(" tp2" in k for k in offered(graph, 2)), name
        with_tp4 = [p for k, p in offered(graph, 4).items() if " tp4" in k]
        assert with_tp4, name
        for plan in with_tp4:
            text = hybridplan.planner.explain(plan, graph, localhost_cpu(4))
            whole = [line for line in text.splitlines() if line.startswith("  run whole")]
            if name == "gpt2_odd":  # its MLPs split; the odd embedding has no tensor_parallel
                assert not whole, text
            elif name == "plain_odd":
                assert whole == ["  run whole, tp 4 does not divide their max_degree 50: "
                                 "mlp2.fc_in, mlp2.act, mlp2.fc_out"], text
            else:
                assert len(whole) == 1 and "max_degree 50: model.layers.0.mlp" in whole[0], text


@pytest.fixture(scope="module")
def trained(graphs, tmp_path_factory, selected_cases):
    """The 2-rank launch (its reduced form unless the `full` test is selected), and then the
    4-rank one where the `full` test is selected."""
    out_dir = tmp_path_factory.mktemp("awkward_shapes")
    full = bool(selected_cases("test_every_offered_kind_and_tp4_on_4_ranks"))
    worlds = (2, 4) if full else (2,)
    plans, by_world = {}, {w: [] for w in worlds}
    for name, (_, graph) in graphs.items():
        for world, kinds in [(w, offered(graph, w)) for w in worlds]:
            for kind, plan in kinds.items():
                if world == 4 and not (name in FOUR_RANKS and " tp4" in kind):
                    continue
                if not (full or in_reduced(name, kind)):
                    continue
                case_id = f"{name}: {kind}"
                plans[case_id] = plan
                by_world[world].append({"model": name, "plan": plan, "id": case_id,
                                        "graph": graph.to_dict()})
    loaded, failures = run_cases("test_awkward_shapes:train_cases", by_world, out_dir,
                                 timeout_s=600,
                                 kwargs_for=lambda world: {"parallelize": world == 2})
    parallelized = out_dir / "parallelized.rank0.pt"
    loaded["parallelized"] = (torch.load(parallelized) if parallelized.exists()
                              else failures.get(2, "no output"))
    return loaded, plans


def _difference(outs, want):
    return max((out["state"][k].float() - v.float()).abs().max().item()
               for out in outs for k, v in want.items())


def _check_trained(graphs, outs, plans):
    """Each case's split parameters are those the planner's rule names, and its state equals
    one process's."""
    bad = []
    for case_id, plan in plans.items():
        if isinstance(outs[case_id], str):
            pytest.fail(f"the ranks did not finish {case_id}:\n{outs[case_id]}")
        name = case_id.split(": ")[0]
        tp = plan.get("tp", 1)
        if tp > 1:  # split: the nodes holding parameters whose max_degree tp divides
            nodes = graphs[name][1].nodes
            expected = sorted(n["name"] for n in nodes if n.get("tensor_parallel")
                              and n["tensor_parallel"]["max_degree"] % tp == 0
                              and n["tensor_parallel"]["style"] != "sharded")
            assert all(out["split"] == expected for out in outs[case_id]), (
                case_id, outs[case_id][0]["split"], expected)
        want = reference_state(name, plan["global_batch"])
        assert all(list(out["state"]) == list(want) for out in outs[case_id]), case_id
        if not all(torch.allclose(out["state"][k], v, rtol=1e-4, atol=1e-6)
                   for out in outs[case_id] for k, v in want.items()):
            bad.append(f"{case_id}: differs by {_difference(outs[case_id], want):.3g}")
    assert not bad, bad


def test_offered_kinds_train_like_one_process(graphs, trained):
    """The reduced form: tensor-parallel, DP and 1F1B plans on every model, each other pipeline
    schedule on one."""
    outs, plans = trained
    plans = {c: p for c, p in plans.items() if in_reduced(*c.split(": "))}
    for name in FACTORIES:  # tp = 2 on every model
        assert any(c.startswith(f"{name}: ") and " tp2" in c for c in plans), sorted(plans)
    _check_trained(graphs, outs, plans)


@pytest.mark.full
def test_every_offered_kind_and_tp4_on_4_ranks(graphs, trained):
    """The rest: every other kind offered on 2 devices, and the tp = 4 plans on 4 ranks."""
    outs, plans = trained
    plans = {c: p for c, p in plans.items() if not in_reduced(*c.split(": "))}
    four = [c for c in plans if " tp4" in c]
    assert all(len(outs[c]) == 4 for c in four if not isinstance(outs[c], str)), four
    for name in FOUR_RANKS:  # a node of max_degree 50 runs whole on every rank
        assert any(c.startswith(f"{name}: ") for c in four), sorted(plans)
    _check_trained(graphs, outs, plans)


def test_parallelize_applies_its_own_plan(trained):
    outs, _ = trained
    chosen = outs["parallelized"]
    if isinstance(chosen, str):
        pytest.fail(f"parallelize failed:\n{chosen}")
    assert set(chosen) == set(FACTORIES)
    for name, (kind, loss, _) in chosen.items():
        assert math.isfinite(loss), (name, kind)


def test_equality_table(trained):
    """model x plan kind -> max |difference| from one process, as a markdown table."""
    outs, plans = trained
    rows = ["| model | plan kind | ranks | max abs difference | seconds (rank 0) |",
            "|---|---|---|---|---|"]
    for case_id, plan in plans.items():
        assert not isinstance(outs[case_id], str), f"{case_id} did not run"
        name, kind = case_id.split(": ")
        diff = _difference(outs[case_id], reference_state(name, plan["global_batch"]))
        rows.append(f"| {name} | {kind} | {len(outs[case_id])} | {diff:.1e} | "
                    f"{outs[case_id][0]['seconds']:.1f} |")
    chosen = outs["parallelized"]
    rows += [f"| {name} | parallelize: {kind} | 2 | loss {loss:.4f} | {seconds:.1f} |"
             for name, (kind, loss, seconds) in chosen.items()]
    print("\n" + "\n".join(rows))
