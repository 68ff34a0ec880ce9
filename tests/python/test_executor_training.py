"""Training under a plan is the same training as on one process with the same global batch.

Each test runs hybridplan.apply on several Gloo ranks on loopback (dist_harness), trains 5 SGD
(momentum) steps, gathers the full state_dict on every rank and compares it with:
  - torch DistributedDataParallel on the same ranks (DP-only plan: atol 1e-6), or
  - single-process training on the global batch (pipeline / hybrid / placement: rtol 1e-5;
    atol 1e-6 absorbs float reassociation on parameters near zero).
"""

import os

import pytest
import torch

import hybridplan.models as models
from dist_harness import format_results, outputs_of, run_ranks
from plan_builders import pipeline_plan, placement_plan

STEPS = 5
GLOBAL_BATCH = 8
LR, MOMENTUM = 0.05, 0.9
# Small versions of the built-in models: seconds, not minutes, on 2 shared cores.
MODEL_KWARGS = {
    "branchy_cnn": {"width": 8, "image_size": 16},
    "gnmt_lstm": {"vocab_size": 64, "hidden_size": 16, "src_len": 5, "tgt_len": 5},
    "biglstm": {"vocab_size": 256, "embed_size": 16, "hidden_size": 32, "seq_len": 6},
}


def build(name: str) -> torch.nn.Module:
    return models.get(name, seed=0, **MODEL_KWARGS[name])


def batch(model, step: int):
    """The global batch of `step` (identical on every rank and in the reference)."""
    return model.example_inputs(GLOBAL_BATCH, seed=100 + step), \
        model.example_target(GLOBAL_BATCH, seed=200 + step)


def sgd(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def reference_state(name: str):
    """Single-process training on the global batch: what every plan must reproduce."""
    torch.set_num_threads(1)
    model = build(name)
    opt = sgd(model.parameters())
    for step in range(STEPS):
        inputs, target = batch(model, step)
        opt.zero_grad()
        model.loss(model(*inputs), target).backward()
        opt.step()
    return model.state_dict()


# ---- rank side (runs in the processes dist_harness starts) ------------------------------------

def train_cases(cases: list, out_dir: str) -> None:
    """Trains every case (a dict: name, plan, case_id, optional graph, with_ddp) in turn on this rank; the
    process group apply() creates for the first case serves the rest. Saves
    <out_dir>/<case_id>.rank<r>.pt with the gathered state_dict and the losses."""
    import torch.distributed as dist
    import hybridplan
    from hybridplan.executor import destroy_groups
    torch.set_num_threads(1)
    for case in cases:
        name = case["name"]
        model = build(name)
        per_replica = case["plan"]["per_replica_batch"]
        example = tuple(t[:per_replica] for t in batch(model, 0)[0])
        hp = hybridplan.apply(case["plan"], model, optimizer=sgd, timeout_s=60,
                              graph=case.get("graph"), example_inputs=example)
        losses = []
        for step in range(STEPS):
            inputs, target = batch(model, step)
            losses.append(hp.step(*hp.shard(inputs, target)).item())
        result = {"state": hp.state_dict(), "losses": losses}
        if case.get("with_ddp"):  # torch's own DDP on the same ranks, data and seeds
            result["ddp_state"] = train_torch_ddp(name)
        torch.save(result, os.path.join(out_dir, f"{case['case_id']}.rank{dist.get_rank()}.pt"))
    destroy_groups()  # train_torch_ddp's wrapper is gone: collect, then destroy


def train_torch_ddp(name: str):
    import torch.distributed as dist
    ref = build(name)
    ddp = torch.nn.parallel.DistributedDataParallel(ref)
    opt = sgd(ddp.parameters())
    for step in range(STEPS):
        inputs, target = batch(ref, step)
        share = [t.tensor_split(dist.get_world_size())[dist.get_rank()] for t in (*inputs, target)]
        opt.zero_grad()
        ref.loss(ddp(*share[:-1]), share[-1]).backward()
        opt.step()
    return ref.state_dict()


# ---- test side --------------------------------------------------------------------------------

CASES = [  # (model, mode, dp, mp, schedule, micro-batches)
    ("branchy_cnn", "pipeline", 1, 2, "gpipe", 4),
    ("branchy_cnn", "pipeline", 2, 2, "1f1b", 2),
    ("branchy_cnn", "placement", 2, 2, "none", 1),
    ("gnmt_lstm", "pipeline", 1, 2, "1f1b", 4),
    ("gnmt_lstm", "pipeline", 2, 2, "gpipe", 2),
    ("gnmt_lstm", "placement", 2, 2, "none", 1),
    ("gnmt_lstm", "pipeline", 1, 3, "1f1b", 4),  # with a skip from stage 0 to 2, see below
]
# 3 stages: encoder | decoder embedding + first LSTM | attention onwards. The encoder's output
# goes straight from stage 0 to the attention on stage 2, and stage 0 sends the target tokens
# (a batch input) to stage 1.
GNMT_3_STAGES = {"enc_embed": 0, "enc_lstm0": 0, "enc_lstm1": 0, "enc_lstm2": 0, "enc_lstm3": 0,
                 "dec_embed": 1, "dec_lstm0": 1, "attention": 2, "dec_lstm1": 2, "dec_lstm2": 2,
                 "dec_lstm3": 2, "classifier": 2}
CASE_IDS = [f"{c[0]}-{c[1]}-dp{c[2]}xmp{c[3]}-{c[4]}" for c in CASES]
DDP_CASE = "branchy_cnn-dp_only"


def world_of(mode: str, dp: int, mp: int) -> int:
    return dp * mp if mode == "pipeline" else dp


def make_plan(name, mode, dp, mp, schedule, m):
    model = build(name)
    if mode == "pipeline":
        stages = GNMT_3_STAGES if (name, mp) == ("gnmt_lstm", 3) else None
        return pipeline_plan(model, dp=dp, mp=mp, schedule=schedule, num_microbatches=m,
                             per_replica_batch=GLOBAL_BATCH // dp, assignment=stages)
    return placement_plan(model, dp=dp, mp=mp, per_replica_batch=GLOBAL_BATCH // dp)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Runs every case: one launch per world size (importing torch on every rank dominates a
    launch's cost). Returns {case_id: [per-rank results]}."""
    out_dir = tmp_path_factory.mktemp("executor_training")
    by_world = {2: [{"name": "branchy_cnn", "plan": placement_plan(build("branchy_cnn"), 2, 1),
                     "case_id": DDP_CASE, "with_ddp": True}]}
    for case, case_id in zip(CASES, CASE_IDS):
        by_world.setdefault(world_of(*case[1:4]), []).append(
            {"name": case[0], "plan": make_plan(*case), "case_id": case_id})
    failures = {}
    for world, cases in by_world.items():
        results = run_ranks("test_executor_training:train_cases", world,
                            {"cases": cases, "out_dir": str(out_dir)}, timeout_s=240)
        if not all(r.returncode == 0 for r in results):
            failures[world] = format_results(results)
    loaded = {}
    for cases in by_world.values():
        for case in cases:
            world = world_of(case["plan"]["mode"], case["plan"]["dp"], case["plan"]["mp"])
            paths = [out_dir / f"{case['case_id']}.rank{r}.pt" for r in range(world)]
            loaded[case["case_id"]] = ([torch.load(p) for p in paths]
                                       if all(p.exists() for p in paths)
                                       else failures.get(world, "no output"))
    return loaded


def assert_states_close(actual, expected, **tol):
    assert list(actual) == list(expected)  # the original module's keys, in its order
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], **tol,
                                   msg=lambda m, k=key: f"{k}: {m}")


def test_dp_only_plan_matches_torch_ddp(trained):
    outs = outputs_of(trained, DDP_CASE)
    for out in outs:
        assert_states_close(out["state"], out["ddp_state"], rtol=0, atol=1e-6)
    # and it trained: the parameters moved away from their initial values
    initial = build("branchy_cnn").state_dict()
    assert not torch.equal(outs[0]["state"]["fc.weight"], initial["fc.weight"])


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_plan_matches_single_process(trained, case):
    outs = outputs_of(trained, CASE_IDS[CASES.index(case)])
    expected = reference_state(case[0])
    initial = build(case[0]).state_dict()
    assert any(not torch.equal(expected[k], initial[k]) for k in expected)
    for out in outs:
        assert_states_close(out["state"], expected, rtol=1e-5, atol=1e-6)
    # every rank reports a finite, positive loss for each step, the same within a replica
    mp = case[3] if case[1] == "pipeline" else 1
    for r, out in enumerate(outs):
        assert len(out["losses"]) == STEPS and all(0 < x < 100 for x in out["losses"])
        assert out["losses"] == outs[(r // mp) * mp]["losses"]
