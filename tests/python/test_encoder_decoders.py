"""Models with several outputs, some computed from others, and encoder-decoders whose
embedding is one weight held by several modules, one of them never called: profile -> plan
(the planner's search on the localhost-cpu preset, 2 devices) -> apply on 2 Gloo ranks -> the
trained state_dict equals one-process training (torch.allclose(rtol=1e-4, atol=1e-6)).

    t5         Hugging Face T5ForConditionalGeneration: `shared`, `encoder.embed_tokens`,
               `decoder.embed_tokens` and `lm_head` are four modules holding one Parameter;
               `shared` is never called. Returns logits and encoder_last_hidden_state, the
               second upstream of the first
    bart       Hugging Face BartForConditionalGeneration: the same tie (model.shared never
               called), learned positions, a root buffer (final_logits_bias)
    tuple_out  a plain torch model returning (embedding, logits computed from it); the loss
               reads both
    dict_out   a plain torch model returning {"hidden", "logits", "pooled"}, each computed from
               the one before; the loss reads all three

Each factory returns (model, batch_fn, loss_fn) in tests/python/user_models.py's shape. Plan
kinds, each on 2 ranks: DP (dp=2), placement (dp=1 x mp=2 on 2 devices declared GPUs: the
planner offers no placement on CPU devices), pipeline GPipe and 1F1B (dp=1 x mp=2).
"""

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dist_harness import format_results, run_ranks
from plan_builders import share

D_MODEL, SEQ, VOCAB = 16, 6, 48
STEPS, PROFILE_BATCH, LR, MOMENTUM = 3, 8, 0.05, 0.9


def _generator(seed):
    return torch.Generator().manual_seed(seed)


def _seq2seq_batch(n, seed):
    """input_ids, attention_mask (the last source position masked in odd samples),
    decoder_input_ids (the labels shifted right behind token 0), and the labels."""
    g = _generator(seed)
    src = torch.randint(1, VOCAB, (n, SEQ), generator=g)
    labels = torch.randint(1, VOCAB, (n, SEQ), generator=g)
    mask = torch.ones(n, SEQ, dtype=torch.long)
    mask[1::2, -1] = 0
    decoder_ids = torch.cat([torch.zeros(n, 1, dtype=torch.long), labels[:, :-1]], dim=1)
    return ({"input_ids": src, "attention_mask": mask, "decoder_input_ids": decoder_ids},
            labels)


def _logits_loss(output, target):
    return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())


def t5():
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(vocab_size=VOCAB, d_model=D_MODEL, d_kv=8, d_ff=32, num_layers=2,
                      num_decoder_layers=2, num_heads=2, dropout_rate=0.0, use_cache=False,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(config)
    assert model.shared.weight is model.encoder.embed_tokens.weight is model.lm_head.weight
    return model, _seq2seq_batch, _logits_loss


def bart():
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    config = BartConfig(vocab_size=VOCAB, d_model=D_MODEL, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=2, decoder_attention_heads=2,
                        encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=16,
                        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                        use_cache=False, pad_token_id=0, bos_token_id=0, eos_token_id=2,
                        decoder_start_token_id=0, forced_eos_token_id=None)
    model = BartForConditionalGeneration(config)
    assert model.model.shared.weight is model.model.decoder.embed_tokens.weight
    return model, _seq2seq_batch, _logits_loss


class TupleOut(nn.Module):
    """(embedding, logits of a layer over it): the first output is upstream of the second."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.body = nn.Linear(D_MODEL, D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, ids):
        e = self.embed(ids)
        return e, self.head(torch.tanh(self.body(e)))


def _token_batch(n, seed):
    g = _generator(seed)
    return (torch.randint(0, VOCAB, (n, SEQ), generator=g),), torch.randint(
        0, VOCAB, (n, SEQ), generator=g)


def tuple_out():
    torch.manual_seed(0)

    def loss(output, target):
        embedding, logits = output
        return (F.cross_entropy(logits.flatten(0, 1), target.flatten())
                + 0.1 * embedding.pow(2).mean())
    return TupleOut(), _token_batch, loss


class DictOut(nn.Module):
    """{"hidden", "logits", "pooled"}: each computed from the one before."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.body = nn.Linear(D_MODEL, D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)
        self.pool = nn.Linear(VOCAB, 4)

    def forward(self, ids):
        hidden = torch.tanh(self.body(self.embed(ids)))
        logits = self.head(hidden)
        return {"hidden": hidden, "logits": logits, "pooled": self.pool(logits.mean(dim=1))}


def dict_out():
    torch.manual_seed(0)

    def loss(output, target):
        return (F.cross_entropy(output["logits"].flatten(0, 1), target.flatten())
                + 0.1 * output["hidden"].pow(2).mean() + output["pooled"].pow(2).mean())
    return DictOut(), _token_batch, loss


FACTORIES = {"t5": t5, "bart": bart, "tuple_out": tuple_out, "dict_out": dict_out}


def call(model, inputs):
    return model(**inputs) if isinstance(inputs, dict) else model(*inputs)


# ---- one process: the loss's timing, the node rule, the messages ----------------------------

def quick_profile(model, inputs, **kwargs):
    from hybridplan.profiler import profile_dict
    return profile_dict(model, inputs, warmup=0, repeats=1, verbose=False, batch_sizes=(),
                        **kwargs)


def test_the_loss_is_timed_on_outputs_computed_from_others():
    """The embedding is upstream of the logits: a backward from the loss to both ran the body
    and the head, freeing their graph, and the second repeat failed."""
    from hybridplan.profiler import block_timing
    model, batch, loss_fn = tuple_out()
    inputs, target = batch(4, 0)
    output = call(model, inputs)
    forward_s, backward_s = block_timing.loss_times(output, lambda o: loss_fn(o, target),
                                                    "wall", repeats=2)
    assert forward_s > 0 and backward_s > 0
    assert block_timing.loss_backward_bytes(output, lambda o: loss_fn(o, target)) > 0
    loss_fn(output, target).backward()  # the model's own graph is still whole
    assert model.embed.weight.grad is not None and model.body.weight.grad is not None


def test_a_tied_module_that_never_runs_goes_with_its_callers():
    """T5's `shared` holds the weight encoder.embed_tokens, decoder.embed_tokens and lm_head
    run with: the graph leaves it out, and a plan of that graph is accepted."""
    from hybridplan.executor.executor import _check_module
    from hybridplan.executor.plan_spec import parse_plan
    from hybridplan.hand_plans import even_split, hand_plan
    from hybridplan.profiler import block_list
    model, batch, loss_fn = t5()
    inputs, target = batch(2, 0)
    graph = quick_profile(model, inputs, loss_fn=loss_fn, target=target)
    called = {block_list.module_name(n["name"]) for n in graph["nodes"]}
    assert "shared" not in called
    tied, untied = block_list.uncalled_nodes(block_list.select_nodes(model), called)
    assert (tied, untied) == ({"shared": ["decoder.embed_tokens", "encoder.embed_tokens",
                                          "lm_head"]}, [])
    ids = {n["name"]: n["id"] for n in graph["nodes"]}
    assert [t["nodes"] for t in graph["tied_params"]] == [
        [ids["encoder.embed_tokens"], ids["decoder.embed_tokens"], ids["lm_head"]]]
    names = [n["name"] for n in graph["nodes"]]  # what a planned assignment places
    plan = hand_plan(model, mode="placement", dp=1, mp=2, assignment=even_split(names, 2))
    _check_module(parse_plan(plan), model)


class Unused(nn.Module):
    """`spare` (parameters of its own) and `stats` (buffers only) never run."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(4, 8), nn.Linear(8, 2)
        self.spare = nn.Linear(8, 8)
        self.stats = nn.BatchNorm1d(8, affine=False)

    def forward(self, x):
        return self.head(self.embed(x))


def test_a_module_that_never_runs_is_named_with_the_way_out():
    from hybridplan.executor.executor import _check_module
    from hybridplan.executor.plan_spec import parse_plan
    from hybridplan.hand_plans import even_split, hand_plan
    model, x = Unused(), torch.randn(2, 4)
    with pytest.warns(UserWarning, match=r"profile unused: \['spare', 'stats'\] hold "
                                         r"parameters or buffers but never ran in forward.*"
                                         r"delete it \(del model.<name>\)"):
        graph = quick_profile(model, x)
    names = [n["name"] for n in graph["nodes"]]
    assert names == ["embed", "head"]
    plan = hand_plan(model, mode="placement", dp=1, mp=2, assignment=even_split(names, 2))
    with pytest.raises(ValueError) as e:
        _check_module(parse_plan(plan), model)
    assert ("assignment must place every graph node that holds parameters or buffers; missing "
            "2 of Unused: ['spare', 'stats']. A profiled graph holds the modules that ran in "
            "forward; for one that never runs, delete it (del model.<name>)") in str(e.value)
    assert "or tie its parameters to a module that runs" in str(e.value)


def test_state_kept_across_forwards_gets_a_message():
    """The one backward per step cannot reach a freed graph unless the forward reads a tensor
    an earlier step built."""
    class Carry(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.out, self.state = nn.Linear(4, 4), nn.Linear(4, 2), None

        def forward(self, x):
            h = self.fc(x)
            if isinstance(self.state, torch.Tensor):
                h = h + self.state
            self.state = h  # not detached: the next step's backward runs into this one's
            return self.out(h)
    from hybridplan.profiler import profile_dict
    with pytest.raises(ValueError, match=r"^profile: Carry's backward reached a graph an "
                                         r"earlier step already freed: .* store it detached"):
        profile_dict(Carry(), torch.randn(2, 4), warmup=1, repeats=1, verbose=False,
                     batch_sizes=())


# ---- 2 ranks: every model under every plan kind ------------------------------------------------

KINDS = {  # kind -> (mode, planner devices, dp, mp, schedule); every kind runs on 2 ranks
    "dp": ("placement", 2, 2, 1, None),
    "placement": ("placement", 4, 2, 2, None),
    "gpipe": ("pipeline", 2, 1, 2, "gpipe"),
    "1f1b": ("pipeline", 2, 1, 2, "1f1b"),
}
CASES = [(m, k) for m in FACTORIES for k in KINDS]


def sgd(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


# ---- rank side --------------------------------------------------------------------------------

def train_cases(cases_file, out_dir):
    """Trains every case of `cases_file` in turn on this rank; saves <out_dir>/<id>.rank<r>.pt."""
    import torch.distributed as dist
    import hybridplan
    from hybridplan.executor import destroy_groups
    torch.set_num_threads(1)
    for case in torch.load(cases_file):
        model, batch, loss_fn = FACTORIES[case["model"]]()
        plan = case["plan"]
        example = share(batch(plan["global_batch"], 100)[0], plan["dp"], 0)
        hp = hybridplan.apply(plan, model, loss_fn=loss_fn, optimizer=sgd, timeout_s=120,
                              graph=case["graph"], example_inputs=example)
        for step in range(STEPS):
            hp.step(*hp.shard(*batch(plan["global_batch"], 100 + step)))
        torch.save({"state": hp.state_dict()},
                   os.path.join(out_dir, f"{case['id']}.rank{dist.get_rank()}.pt"))
        hp.close()
    destroy_groups()


# ---- test side --------------------------------------------------------------------------------

def reference_state(name, global_batch):
    """One process on the global batch (a pipeline's equal micro-batches' mean losses average
    to the same loss, so the same gradient)."""
    torch.set_num_threads(1)
    model, batch, loss_fn = FACTORIES[name]()
    opt = sgd(model.parameters())
    for step in range(STEPS):
        inputs, target = batch(global_batch, 100 + step)
        opt.zero_grad()
        loss_fn(call(model, inputs), target).backward()
        opt.step()
    return model.state_dict()


def localhost_cpu(devices, mode):
    """The localhost-cpu preset with `devices` CPU ranks; for placement they are declared GPUs
    (on CPU devices the planner offers no placement MP; the executor runs it on CPU all the
    same, as tests/python/test_user_models.py does)."""
    import hybridplan
    cluster = hybridplan.load_cluster("localhost-cpu").to_dict()
    cluster.update(devices_per_node=devices, name=f"localhost-cpu-{devices}")
    if mode == "placement":
        cluster["device"] = dict(cluster["device"], type="cuda")
    return cluster


def planned(graph, kind):
    """The planner's best plan of this kind, its schedule switched where the planner ranks
    the other schedule first (a stale prediction, which the executor does not read)."""
    import hybridplan
    mode, devices, dp, mp, schedule = KINDS[kind]
    found = hybridplan.search(graph, localhost_cpu(devices, mode), None, devices=devices,
                              top_k=50, modes=[mode]).plans
    fits = [p.to_dict() for p in found
            if p.dp == dp and p.mp == mp and p.to_dict().get("sharding", "none") == "none"]
    assert fits, f"the planner proposed no {mode} plan with dp={dp}, mp={mp}: {found}"
    if schedule is None:
        return fits[0]
    same = [p for p in fits if p["schedule"] == schedule]
    return same[0] if same else dict(fits[0], schedule=schedule)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    import hybridplan
    from hybridplan.profiler import profile_dict
    out_dir = tmp_path_factory.mktemp("encoder_decoders")
    torch.set_num_threads(1)
    cases, plans = [], {}
    for name in FACTORIES:
        model, batch, loss_fn = FACTORIES[name]()
        inputs, target = batch(PROFILE_BATCH, 0)
        graph = profile_dict(model, inputs, warmup=0, repeats=1, verbose=False, name=name,
                             batch_sizes=(), loss_fn=loss_fn, target=target)
        assert graph["pipeline_split"] == {"supported": True, "reason": ""}, name
        graph = hybridplan.planner.Graph.from_dict(graph)
        for kind in KINDS:
            case_id = f"{name}-{kind}"
            plans[case_id] = planned(graph, kind)
            cases.append({"model": name, "plan": plans[case_id], "graph": graph.to_dict(),
                          "id": case_id})
    cases_file = out_dir / "cases.pt"
    torch.save(cases, cases_file)  # one launch for every case: all run on 2 ranks
    results = run_ranks("test_encoder_decoders:train_cases", 2,
                        {"cases_file": str(cases_file), "out_dir": str(out_dir)},
                        timeout_s=600)
    failure = None if all(r.returncode == 0 for r in results) else format_results(results)
    loaded = {}
    for case in cases:
        paths = [out_dir / f"{case['id']}.rank{r}.pt" for r in range(2)]
        loaded[case["id"]] = ([torch.load(p)["state"] for p in paths]
                              if all(p.exists() for p in paths) else failure or "no output")
    return loaded, plans


def _max_difference(states, want):
    return max((state[k].float() - want[k].float()).abs().max().item()
               for state in states for k in want)


@pytest.mark.parametrize("name,kind", CASES, ids=[f"{m}-{k}" for m, k in CASES])
def test_plan_trains_like_one_process(trained, name, kind):
    outs, plans = trained
    states, plan = outs[f"{name}-{kind}"], plans[f"{name}-{kind}"]
    if isinstance(states, str):
        pytest.fail(f"the ranks did not finish {name}-{kind}:\n{states}")
    mode, _, dp, mp, schedule = KINDS[kind]
    assert (plan["mode"], plan["dp"], plan["mp"]) == (mode, dp, mp)
    want = reference_state(name, plan["global_batch"])
    initial = FACTORIES[name]()[0].state_dict()
    assert any(not torch.equal(want[k], initial[k]) for k in initial)  # it trained
    for state in states:
        assert list(state) == list(want)
        for key in want:
            assert torch.allclose(state[key], want[key], rtol=1e-4, atol=1e-6), (
                f"{name}-{kind}: {key} differs by "
                f"{(state[key] - want[key]).abs().max().item():.3g}")


def test_equality_table(trained):
    """Model x plan kind -> max |difference| from one process over both ranks and every state
    entry, printed as a markdown table (`pytest -s -k equality_table`)."""
    outs, plans = trained
    rows = ["| model | " + " | ".join(KINDS) + " |", "|---" * (len(KINDS) + 1) + "|"]
    for name in FACTORIES:
        cells = []
        for kind in KINDS:
            states = outs[f"{name}-{kind}"]
            assert not isinstance(states, str), f"{name}-{kind} did not run:\n{states}"
            want = reference_state(name, plans[f"{name}-{kind}"]["global_batch"])
            cells.append(f"{_max_difference(states, want):.1e}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    print("\n" + "\n".join(rows))
