"""BatchNorm end to end, on a plain torch model with BatchNorm1d that takes a dict of inputs and
returns a tuple (user_models.bn_dict):

- the profile's automatic batch sizes start at the smallest batch the forward runs at (2: one
  sample per channel is refused in training), the pipeline cut is tried there and supported,
  and an example batch of 1 is refused naming the module and what to do;
- on 2 Gloo ranks, hybridplan.apply trained 3 steps and compared (torch.allclose, rtol=1e-4,
  atol=1e-6, parameters and buffers, num_batches_tracked exactly) with:
    dp          torch DDP on the same ranks (each replica normalises its share; DDP broadcasts
                rank 0's buffers), and apply notes it once;
    dp+sync     sync_batchnorm=True: one process on the global batch;
    dp+rc/sel   recompute of every node, full / selective: dp without recompute;
    gpipe, 1f1b+rc, 1f1b+sel
                2-stage pipelines (micro-batches of 4 and 2, the last stage recomputed under
                1F1B, where a later micro-batch's forward runs before an earlier one's
                recompute): one process running the same micro-batches in turn;
  and sync_batchnorm=True refused for a pipeline plan, naming why.
`pytest -s` prints the max |difference| per case.
"""

import os
import warnings

import pytest
import torch

from dist_harness import format_results, run_ranks
from plan_builders import pipeline_plan, placement_plan, share
from user_models import bn_dict as bn_dict_model, train_one_process, train_torch_ddp

STEPS, LR, MOMENTUM, GLOBAL_BATCH = 3, 0.05, 0.9, 8
CASES = {  # case -> (mode, num_microbatches, recompute, sync_batchnorm)
    "dp": ("placement", 1, None, False),
    "dp+sync": ("placement", 1, None, True),
    "dp+rc": ("placement", 1, True, False),
    "dp+sel": ("placement", 1, "selective", False),
    "gpipe": ("pipeline", 2, None, False),
    "1f1b+rc": ("pipeline", 4, True, False),
    "1f1b+sel": ("pipeline", 4, "selective", False),
}


def sgd(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)


def plan_of(case, model, batch):
    from hybridplan.hand_plans import nodes_in_call_order
    mode, m, recompute, _ = CASES[case]
    example = batch(GLOBAL_BATCH, 0)[0]
    if mode == "placement":
        plan = placement_plan(model, dp=2, mp=1, per_replica_batch=GLOBAL_BATCH // 2,
                              example_inputs=example)
    else:
        plan = pipeline_plan(model, dp=1, mp=2, schedule=case.split("+")[0],
                             num_microbatches=m, per_replica_batch=GLOBAL_BATCH,
                             example_inputs=example)
    assert nodes_in_call_order(model, example) == ["embed", "bn", "mix", "bn2", "head"]
    if recompute is not None:  # every node of DP, the last stage of a pipeline
        plan["assignment"] = [dict(a, recompute=recompute)
                              if mode == "placement" or a["device"] == 1 else a
                              for a in plan["assignment"]]
    return plan


# ---- rank side --------------------------------------------------------------------------------

def train_rank(out_dir):
    import torch.distributed as dist
    import hybridplan
    from hybridplan.executor import destroy_groups
    torch.set_num_threads(1)
    results = {}
    for case in CASES:
        model, batch, loss_fn = bn_dict_model()
        plan = plan_of(case, model, batch)
        dp = plan["dp"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hp = hybridplan.apply(plan, model, loss_fn=loss_fn, optimizer=sgd, timeout_s=60,
                                  example_inputs=share(batch(GLOBAL_BATCH, 0)[0], dp, 0),
                                  sync_batchnorm=CASES[case][3])
        notes = [str(w.message) for w in caught if "BatchNorm" in str(w.message)]
        for step in range(STEPS):
            hp.step(*hp.shard(*batch(GLOBAL_BATCH, 100 + step)))
        results[case] = {"state": hp.state_dict(), "notes": notes}
        hp.close()
    model, batch, loss_fn = bn_dict_model()
    try:
        hybridplan.apply(plan_of("gpipe", model, batch), model, loss_fn=loss_fn, timeout_s=60,
                         example_inputs=batch(GLOBAL_BATCH, 0)[0], sync_batchnorm=True)
        results["refused"] = ""
    except ValueError as e:
        results["refused"] = str(e)
    results["ddp"] = train_torch_ddp(bn_dict_model, GLOBAL_BATCH, STEPS, sgd)
    torch.save(results, os.path.join(out_dir, f"rank{dist.get_rank()}.pt"))
    destroy_groups()


# ---- test side --------------------------------------------------------------------------------

def one_process(num_microbatches=1):
    """One process on the global batch, in `num_microbatches` parts (user_models)."""
    return train_one_process(bn_dict_model, GLOBAL_BATCH, STEPS, sgd, num_microbatches)


def max_difference(state, reference):
    assert set(state) == set(reference), sorted(set(state) ^ set(reference))
    return max((state[k].double() - reference[k].double()).abs().max().item() for k in state)


def assert_same(state, reference, case):
    for key, want in reference.items():
        got = state[key]
        if key.endswith("num_batches_tracked"):
            assert int(got) == int(want), f"{case}: {key} {int(got)} != {int(want)}"
        else:
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-6), (
                f"{case}: {key} differs by {(got - want).abs().max().item():.3g}")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    out_dir = tmp_path_factory.mktemp("batch_norm")
    results = run_ranks("test_batch_norm:train_rank", 2, {"out_dir": str(out_dir)},
                        timeout_s=240)
    assert all(r.returncode == 0 for r in results), format_results(results)
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(2)]


def references(ranks):
    """case -> (what it is compared with, that state)."""
    torch.set_num_threads(1)
    whole, in_parts = one_process(), {m: one_process(m) for m in (2, 4)}
    return {"dp": ("torch DDP", ranks[0]["ddp"]),
            "dp+sync": ("one process", whole),
            "dp+rc": ("dp", ranks[0]["dp"]["state"]),
            "dp+sel": ("dp", ranks[0]["dp"]["state"]),
            "gpipe": ("one process, 2 parts", in_parts[2]),
            "1f1b+rc": ("one process, 4 parts", in_parts[4]),
            "1f1b+sel": ("one process, 4 parts", in_parts[4])}


def test_batch_norm_training_matches_references(trained):
    table = []
    for case, (against, reference) in references(trained).items():
        state = trained[0][case]["state"]
        table.append((case, against, max_difference(state, reference),
                      int(state["bn.num_batches_tracked"])))
        assert_same(state, reference, case)
    print("\ncase       compared with          max |diff|   bn.num_batches_tracked")
    for case, against, diff, tracked in table:
        print(f"{case:<10} {against:<22} {diff:<12.3g} {tracked}")
    # without sync, DP differs from one process on the global batch: the test above can fail
    assert max_difference(trained[0]["dp"]["state"], one_process()) > 1e-4


def test_data_parallel_batch_norm_is_noted_once(trained):
    assert len(trained[0]["dp"]["notes"]) == 1, trained[0]["dp"]["notes"]
    note = trained[0]["dp"]["notes"][0]
    assert "bn, bn2" in note and "sync_batchnorm=True" in note, note
    assert trained[1]["dp"]["notes"] == []  # rank 0 only
    assert trained[0]["dp+sync"]["notes"] == []


def test_sync_batchnorm_refused_for_a_pipeline(trained):
    for rank in trained:
        assert "sync_batchnorm applies to placement (data-parallel) plans" in rank["refused"]
        assert "got mode \"pipeline\"" in rank["refused"]


# ---- profile ----------------------------------------------------------------------------------

def test_profile_starts_at_the_smallest_batch_that_runs():
    pytest.importorskip("hybridplan.planner", reason="needs hybridplan._C (make build)")
    from hybridplan.profiler import profile_dict
    torch.set_num_threads(1)
    model, batch, loss_fn = bn_dict_model()
    inputs, target = batch(8, 0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    graph = profile_dict(model, inputs, warmup=0, repeats=1, verbose=False, loss_fn=loss_fn,
                         target=target, tensor_parallel=False)
    for node in graph["nodes"]:  # the rule's 1, 2, 4 at the example batch 8, from 2 on
        assert [t["batch_size"] for t in node["batch_times"]] == [2, 4], node
    assert graph["pipeline_split"] == {"supported": True, "reason": ""}
    assert graph["profiled"]["min_batch_size"] == 2
    import hybridplan  # the planner gives no replica or micro-batch fewer samples
    cluster = hybridplan.load_cluster("localhost-cpu").to_dict()
    found = hybridplan.search(hybridplan.planner.Graph.from_dict(graph), cluster, None,
                              devices=2, top_k=100).plans
    assert any(p.mode == "pipeline" for p in found)
    assert all(p.per_replica_batch // p.num_microbatches >= 2 for p in found)
    assert before.keys() == model.state_dict().keys()
    with pytest.raises(ValueError, match=r"batch_sizes must be at least 2, the smallest batch "
                                         r"BnDictModel's forward runs at \(got \[1\]\)"):
        profile_dict(model, inputs, warmup=0, repeats=1, verbose=False, batch_sizes=[1, 4],
                     tensor_parallel=False)
    one, one_target = batch(1, 0)
    with pytest.raises(ValueError, match=r"module 'bn' \(BatchNorm1d\).*give example_inputs a "
                                         r"batch of at least 2 samples"):
        profile_dict(model, one, warmup=0, repeats=1, verbose=False, tensor_parallel=False)
