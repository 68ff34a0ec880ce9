"""Models people bring (tests/python/user_models.py), end to end: profile -> plan (the
planner's search on the localhost-cpu preset, given 4 ranks where a kind needs 4 devices) -> apply on Gloo ranks -> the trained state_dict
equals one-process training (torch.allclose(rtol=1e-4, atol=1e-6)).

Plan kinds, each on 2 ranks: DP (dp=2 x mp=1), placement (dp=2 x mp=2), pipeline GPipe and
1F1B (dp=1 x mp=2); and a hybrid dp=2 x mp=2 1F1B pipeline of GPT-2 and of Llama on 4 ranks.
Kinds "<kind>+rc" are the same plans with activation recompute: every node of a DP or placement
plan, the last stage of a pipeline (recompute x 1F1B, recompute beside a stage that keeps its
activations); torch.utils.checkpoint replays the random state, so dropout matches. Kinds
"<kind>+sel" recompute the same nodes selectively (torch's selective activation checkpointing:
the matmuls' and attention's outputs kept, the rest run again; docs/recompute.md). Kinds with
"+z2" / "+z3" set the plan's "sharding" to "zero2" / "zero3" (FSDP2 fully_shard over the
replicas in place of DDP; a pipeline shards only zero2): the same mean-loss training, so the
same references; GPT-2's hybrid pipeline sums its tied wte / lm_head copies' gradient shards
across stages. Suffixes compose ("dp+z3+rc"). The planner
ranks one pipeline schedule above the other for a given model; the other schedule runs the same
planned stages with the plan's "schedule" field switched (its prediction is then stale, which
the executor does not read).

`make test` trains the cases of REDUCED (every model at least once, each other kind on one
model of each family); the others are marked `full` (`make test-full`, run by `make bench`).

The global batch is the plan's (the planner chooses the per-replica batch). References: one
process on the global batch; for the BatchNorm models (user_models.BATCH_NORM), DP-like plans
(DP and placement, both DDP) are compared with torch DDP on the same ranks, and pipeline plans
with one process that runs the same micro-batches in turn (per-micro-batch statistics, as GPipe
does). `pytest -s -k equality_table` prints the model x plan kind table (docs/models.md).
"""

import os

import pytest
import torch

from dist_harness import run_cases
from plan_builders import share
from user_models import BATCH_NORM, FACTORIES, train_one_process, train_torch_ddp

STEPS, PROFILE_BATCH, LR, MOMENTUM = 3, 8, 0.05, 0.9
KINDS = {  # kind -> (mode, planner devices, dp, mp, schedule)
    "dp": ("placement", 2, 2, 1, None),
    "placement": ("placement", 4, 2, 2, None),
    "gpipe": ("pipeline", 2, 1, 2, "gpipe"),
    "1f1b": ("pipeline", 2, 1, 2, "1f1b"),
    "hybrid": ("pipeline", 4, 2, 2, "1f1b"),
}
CASES = [(m, k) for m in FACTORIES for k in ("dp", "placement", "gpipe", "1f1b")] + [
    ("gpt2", "hybrid"), ("llama", "hybrid"),
    ("transformer_stack", "dp+rc"), ("llama", "dp+rc"), ("albert", "placement+rc"),
    ("llama", "1f1b+rc"), ("gpt2", "gpipe+rc"), ("mixtral", "1f1b+rc"), ("lstm_lm", "1f1b+rc"),
    ("transformer_stack", "dp+z2"), ("transformer_stack", "dp+z3"), ("gpt2", "dp+z2"),
    ("gpt2", "dp+z3"), ("llama", "dp+z3+rc"), ("gpt2", "hybrid+z2"), ("llama", "hybrid+z2+rc"),
    ("transformer_stack", "dp+sel"), ("llama", "1f1b+sel"), ("gpt2", "gpipe+sel"),
    ("llama", "dp+z3+sel")]
# `make test` trains these (the rest is marked `full`: `make test-full`, run by `make bench`):
# every model at least once (under DP, its cheapest kind, where no other case below trains it;
# DP itself is in the "+" cases built on it); each other kind on at least one model, the pipeline
# kinds on one model of each family (decoders, encoders, vision, BatchNorm, encoder-decoders
# with ties across stages, torch models with tuple / dict outputs), the cases named for a
# property (ALBERT's shared layer across stages, BatchNorm against DDP and per micro-batch)
# among them; one 4-rank launch (a hybrid pipeline sharded zero2 with recompute).
# models trained by a case below besides DP (their DP case is `full`; bn_cnn keeps its DP case:
# BatchNorm against DDP)
_COVERED = {"gpt2", "bn_dict", "t5", "albert", "vit", "dict_out", "llama", "transformer_stack"}
REDUCED = {(m, "dp") for m in FACTORIES if m not in _COVERED} | {
    ("gpt2", "placement"), ("bn_dict", "placement"), ("t5", "gpipe"), ("bn_cnn", "gpipe"),
    ("albert", "1f1b"), ("vit", "1f1b"), ("dict_out", "1f1b"), ("llama", "hybrid+z2+rc"),
    ("transformer_stack", "dp+rc"), ("albert", "placement+rc"), ("llama", "1f1b+rc"),
    ("gpt2", "gpipe+rc"), ("transformer_stack", "dp+z2"), ("gpt2", "dp+z3"),
    ("llama", "dp+z3+rc"), ("transformer_stack", "dp+sel"), ("gpt2", "gpipe+sel")}
assert REDUCED <= set(CASES)
assert {m for m, _ in REDUCED} == set(FACTORIES)  # every model at least once
RC = "+rc"
SEL = "+sel"
RECOMPUTE = {RC: True, SEL: "selective"}  # suffix -> the assignment's "recompute"
SHARDING = {"+z2": "zero2", "+z3": "zero3"}


def base_kind(kind):
    return kind.split("+")[0]


def sharding_of(kind):
    """The plan's "sharding" for a kind: "zero2" / "zero3" for "+z2" / "+z3", else "none"."""
    return next((v for k, v in SHARDING.items() if k in kind), "none")


def with_recompute(plan, how=True):
    """`plan` recomputing (`how`: True fully, "selective") every node (DP, placement) or its
    last stage's (pipeline)."""
    last = plan["mp"] - 1
    return dict(plan, assignment=[
        dict(a, recompute=how) if plan["mode"] == "placement" or a["device"] == last else a
        for a in plan["assignment"]])


def sgd(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def world_of(kind):
    mode, _, dp, mp, _ = KINDS[base_kind(kind)]
    return dp * mp if mode == "pipeline" else dp


# ---- rank side --------------------------------------------------------------------------------

def train_cases(cases_file, out_dir):
    """Trains every case of `cases_file` (torch.save'd list; graphs are too long for a command
    line) in turn on this rank and saves <out_dir>/<id>.rank<r>.pt."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    import hybridplan
    from hybridplan.executor import destroy_groups
    torch.set_num_threads(1)
    for case in torch.load(cases_file):
        model, batch, loss_fn = FACTORIES[case["model"]]()
        plan = case["plan"]
        global_batch = plan["global_batch"]  # the planner's choice
        example = share(batch(global_batch, 100)[0], plan["dp"], 0)
        hp = hybridplan.apply(plan, model, loss_fn=loss_fn, optimizer=sgd, timeout_s=120,
                              graph=case["graph"], example_inputs=example)
        for step in range(STEPS):
            hp.step(*hp.shard(*batch(global_batch, 100 + step)))
        result = {"state": hp.state_dict(),  # sharded plans: every parameter a DTensor shard
                  "sharded": [isinstance(p, DTensor) for p in hp.parameters()]}
        if case.get("with_ddp"):
            result["ddp_state"] = train_torch_ddp(FACTORIES[case["model"]], global_batch, STEPS,
                                                  sgd)
        torch.save(result, os.path.join(out_dir, f"{case['id']}.rank{dist.get_rank()}.pt"))
    destroy_groups()  # train_torch_ddp's wrapper is gone: collect, then destroy


# ---- test side --------------------------------------------------------------------------------

def reference_state(name, global_batch, num_microbatches=1):
    """One process on the global batch, in `num_microbatches` equal parts whose mean losses are
    averaged (the same gradient; BatchNorm sees each part alone)."""
    torch.set_num_threads(1)
    return train_one_process(FACTORIES[name], global_batch, STEPS, sgd, num_microbatches)


def shared_layer_across_stages(plan):
    """`plan` (2 stages) cut right after the first call of ALBERT's one shared layer, so that its
    later calls run on stage 1 and its weights are tied across both stages. Built by hand: where
    the search cuts depends on the times just profiled (on a loaded host it may keep every call
    of the layer on one stage), and this case is about the tie across stages."""
    names = [a["name"] for a in plan["assignment"]]
    first = next(i for i, n in enumerate(names) if "albert_layers" in n)
    assert any("albert_layers" in n for n in names[first + 1:]), names
    return dict(plan, assignment=[dict(a, device=int(i > first))
                                  for i, a in enumerate(plan["assignment"])])


def localhost_cpu(devices, mode="pipeline"):
    """The localhost-cpu preset with `devices` CPU ranks (placement dp=2 x mp=2 needs 4). For
    placement its devices are declared GPUs: on CPU devices (one process running its devices'
    parts one after another) the planner offers no placement MP; the executor runs a GPU
    cluster's placement plan on this CPU all the same, which is what is tested here."""
    import hybridplan
    cluster = hybridplan.load_cluster("localhost-cpu").to_dict()
    cluster.update(devices_per_node=devices, name=f"localhost-cpu-{devices}")
    if mode == "placement":
        cluster["device"] = dict(cluster["device"], type="cuda")
    return cluster


def planned(graph, kind):
    """The planner's best plan of this kind (see the module doc for the other schedule) with
    the kind's "sharding" ("none" unless "+z2" / "+z3"): the planner's own plan of that
    sharding where it proposes one, else its best with the field set (a stale prediction, as
    above)."""
    import hybridplan
    for suffix, how in RECOMPUTE.items():
        if kind.endswith(suffix):
            return with_recompute(planned(graph, kind[:-len(suffix)]), how)
    mode, devices, dp, mp, schedule = KINDS[base_kind(kind)]
    sharding = sharding_of(kind)
    found = hybridplan.search(graph, localhost_cpu(devices, mode), None, devices=devices,
                              top_k=50, modes=[mode]).plans
    fits = [p.to_dict() for p in found if p.dp == dp and p.mp == mp]
    assert fits, f"the planner proposed no {mode} plan with dp={dp}, mp={mp}: {found}"
    fits.sort(key=lambda p: p.get("sharding", "none") != sharding)  # stable: best first
    plan = fits[0]
    if schedule is not None:
        same = [p for p in fits if p["schedule"] == schedule]
        plan = same[0] if same else dict(plan, schedule=schedule)
    plan = {k: v for k, v in plan.items() if k != "sharding"}  # absent: "none"
    return plan if sharding == "none" else dict(plan, sharding=sharding)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, selected_cases):
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    import hybridplan
    from hybridplan.profiler import profile_dict
    out_dir = tmp_path_factory.mktemp("user_models")
    torch.set_num_threads(1)
    wanted = (set(selected_cases("test_plan_trains_like_one_process", "name", "kind"))
              or REDUCED)  # the table alone: the reduced cases
    by_world, plans = {}, {}
    for name in [m for m in FACTORIES if any(w == m for w, _ in wanted)]:
        model, batch, _ = FACTORIES[name]()
        graph = profile_dict(model, batch(PROFILE_BATCH, 0)[0], warmup=0, repeats=1,
                             verbose=False, name=name)
        assert graph["pipeline_split"] == {"supported": True, "reason": ""}, name
        graph = hybridplan.planner.Graph.from_dict(graph)
        for kind in [k for m, k in CASES if m == name and (m, k) in wanted]:
            case_id = f"{name}-{kind}"
            plans[case_id] = planned(graph, kind)
            if name == "albert" and plans[case_id]["mode"] == "pipeline":
                plans[case_id] = shared_layer_across_stages(plans[case_id])
            case = {"model": name, "plan": plans[case_id], "graph": graph.to_dict(),
                    "id": case_id, "with_ddp": name in BATCH_NORM and kind in ("dp", "placement")}
            by_world.setdefault(world_of(kind), []).append(case)
    loaded, _ = run_cases("test_user_models:train_cases", by_world, out_dir, timeout_s=900)
    return loaded, plans


def _expected_states(outs, plan, name):
    """Per rank, the state a correct run ends in (see the module doc for the references)."""
    if name in BATCH_NORM and plan["mode"] == "placement":
        return [out["ddp_state"] for out in outs]
    m = plan["num_microbatches"] if name in BATCH_NORM else 1
    return [reference_state(name, plan["global_batch"], m)] * len(outs)


@pytest.mark.parametrize("name,kind", [
    pytest.param(m, k, id=f"{m}-{k}", marks=() if (m, k) in REDUCED else pytest.mark.full)
    for m, k in CASES])
def test_plan_trains_like_one_process(trained, name, kind):
    outs, plans = trained
    outs, plan = outs[f"{name}-{kind}"], plans[f"{name}-{kind}"]
    if isinstance(outs, str):
        pytest.fail(f"the ranks did not finish {name}-{kind}:\n{outs}")
    spec = KINDS[base_kind(kind)]
    assert (plan["mode"], plan["dp"], plan["mp"]) == spec[0:1] + spec[2:4]
    suffix = next((x for x in RECOMPUTE if kind.endswith(x)), None)
    assert {a.get("recompute") for a in plan["assignment"]} - {None} == \
        ({RECOMPUTE[suffix]} if suffix else set())
    sharded = plan.get("sharding", "none") != "none"
    assert plan.get("sharding", "none") == sharding_of(kind)
    flags = [f for out in outs for f in out["sharded"]]  # FSDP holds every parameter, DDP none
    assert flags and set(flags) == {sharded}, flags
    if name == "albert" and plan["mode"] == "pipeline":  # the shared layer's calls span both
        stages = {a["device"] for a in plan["assignment"] if "albert_layers" in a["name"]}
        assert stages == {0, 1}, plan["assignment"]  # stages (shared_layer_across_stages)
    expected = _expected_states(outs, plan, name)
    initial = FACTORIES[name]()[0].state_dict()
    assert any(not torch.equal(expected[0][k], initial[k]) for k in initial)  # it trained
    for out, want in zip(outs, expected):
        assert list(out["state"]) == list(want)
        for key in want:
            assert torch.allclose(out["state"][key], want[key], rtol=1e-4, atol=1e-6), (
                f"{name}-{kind}: {key} differs by "
                f"{(out['state'][key] - want[key]).abs().max().item():.3g}")


def test_equality_table(trained):
    """Model x plan kind -> max |difference| from the reference over every rank and state entry,
    printed as a markdown table (`pytest -s -k equality_table`; docs/models.md holds one): of
    the cases this run trained (all of them without -m), each of which must have run."""
    outs, plans = trained
    kinds = list(KINDS) + sorted({k for _, k in CASES if "+" in k})
    rows = ["| model | " + " | ".join(kinds) + " |", "|---" * (len(kinds) + 1) + "|"]
    for name in FACTORIES:
        cells = []
        for kind in kinds:
            key = f"{name}-{kind}"
            if key not in plans:
                cells.append("")
                continue
            assert not isinstance(outs[key], str), f"{key} did not run"
            diff = max((out["state"][k].float() - want[k].float()).abs().max().item()
                       for out, want in zip(outs[key], _expected_states(outs[key], plans[key],
                                                                         name))
                       for k in want)
            cells.append(f"{diff:.1e}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    print("\n" + "\n".join(rows))
