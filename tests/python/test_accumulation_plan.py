"""Gradient accumulation as a plan axis (docs/training_step.md "Accumulation in the plan").

The Plan's accumulation_steps (absent = 1) as Python reads it, and a plan carrying K = 2 run
through hybridplan.parallelize in one process: the job asks for a global batch of 16 in 2
micro-steps, the search gives per_replica_batch 8 and accumulation_steps 2, hp.step trains on
16 samples, and the parameters after 2 steps equal one process's plain SGD on the same 16
samples (torch.allclose(rtol=1e-4, atol=1e-6), the executor's equality tolerance). apply's
accumulation_steps overrides the plan's, with a warning naming both. The multi-rank
equality of accumulation (DDP no_sync, FSDP2, pipelines) is tests/python/test_training_step.py.
"""

import json
import os

import pytest

pytest.importorskip("hybridplan.planner", reason="needs the compiled planner hybridplan._C "
                                                 "(make build)")

from hybridplan.planner import Plan  # noqa: E402

from dist_harness import format_results, run_ranks  # noqa: E402


def _plan_dict(k):
    d = {"schema_version": 1, "kind": "hybridplan.plan",
         "graph": {"name": "g", "sha256": "0" * 64}, "cluster": {"name": "c"},
         "world_size": 2, "dp": 2, "mp": 1, "mode": "placement", "per_replica_batch": 4,
         "global_batch": 8 * k, "num_microbatches": 1, "schedule": "none", "mesh": [[0], [1]],
         "assignment": [{"node": 0, "name": "fc", "device": 0}]}
    if k != 1:
        d["accumulation_steps"] = k
    return d


def test_plan_reads_accumulation_steps_and_checks_the_global_batch():
    one = Plan.from_dict(_plan_dict(1))
    assert one.accumulation_steps == 1 and one.global_batch == 8
    four = Plan.from_dict(_plan_dict(4))
    assert four.accumulation_steps == 4 and four.global_batch == 32
    bad = _plan_dict(4)
    bad["global_batch"] = 8
    with pytest.raises(ValueError, match=r"global_batch must equal dp \* per_replica_batch \* "
                                         r"accumulation_steps = 32 \(got 8\)"):
        Plan.from_dict(bad, "p.json")
    bad["accumulation_steps"] = 0
    with pytest.raises(ValueError, match=r"p.json: accumulation_steps must be >= 1 \(got 0\)"):
        Plan.from_dict(bad, "p.json")


def accumulate_rank(out_dir):
    """One rank (dist_harness): parallelize with a job asking for 2 micro-steps, 2 steps, the
    plain SGD reference on the same 16 samples, and apply's override."""
    import copy
    import warnings

    import torch
    import torch.nn.functional as F
    from torch import nn

    import hybridplan

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 8, generator=gen), torch.randint(0, 4, (16,), generator=gen))
            for _ in range(2)]
    hp = hybridplan.parallelize(
        model, data[0][0][:8], example_target=data[0][1][:8], loss_fn=F.cross_entropy,
        optimizer=lambda p: torch.optim.SGD(p, lr=0.5),
        job={"global_batch": 16, "accumulation_steps": 2}, cluster="localhost-cpu",
        cache_dir=False, verbose=False)
    for x, y in data:
        hp.step(*hp.shard(x, y))
    opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    for x, y in data:
        opt.zero_grad()
        F.cross_entropy(reference(x), y).backward()
        opt.step()
    trained = dict(model.named_parameters())
    diff = max((trained[n].detach() - p.detach()).abs().max().item()
               for n, p in reference.named_parameters())
    close = all(torch.allclose(trained[n].detach(), p.detach(), rtol=1e-4, atol=1e-6)
                for n, p in reference.named_parameters())
    plan = hp.plan
    out = {"plan_k": plan.accumulation_steps, "b": plan.per_replica_batch, "dp": plan.dp,
           "plan_global": plan.global_batch, "hp_k": hp.accumulation_steps,
           "hp_global": hp.global_batch, "diff": diff, "close": close}
    hp.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = hybridplan.apply(plan, copy.deepcopy(reference), accumulation_steps=4,
                                 optimizer=lambda p: torch.optim.SGD(p, lr=0.5))
    out["override_k"] = again.accumulation_steps
    out["override_global"] = again.global_batch
    out["warned"] = [str(w.message) for w in caught if "overrides the plan" in str(w.message)]
    again.close()
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump(out, f)


def test_a_plan_with_accumulation_runs_through_parallelize(tmp_path):
    results = run_ranks("test_accumulation_plan:accumulate_rank", 1,
                        {"out_dir": str(tmp_path)}, timeout_s=180)
    assert all(r.returncode == 0 for r in results), format_results(results)
    r = json.loads((tmp_path / "result.json").read_text())
    assert (r["plan_k"], r["b"], r["dp"], r["plan_global"]) == (2, 8, 1, 16), r
    assert (r["hp_k"], r["hp_global"]) == (2, 16), r
    assert r["close"], f"largest difference from one process: {r['diff']:.3g}"
    assert (r["override_k"], r["override_global"]) == (4, 32), r
    assert len(r["warned"]) == 1 and "accumulation_steps=4 overrides the plan's 2" in \
        r["warned"][0], r
