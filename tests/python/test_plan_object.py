"""One plan object from the search to the run: how often one hybridplan.parallelize call on one
process serialises, parses, copies, validates and broadcasts its plan, and that hp.plan is that
Plan (python/hybridplan/planner.py Plan, front_door.py, executor/plan_spec.py).

The counters wrap json.dumps / json.loads / copy.deepcopy (counting only calls whose input or
output is a whole plan document) and the core's entry points (hybridplan._C: a plan's
structure check and validation, a graph's canonical form and hash)."""

import copy
import json
import os
import sys

import pytest
import torch
from torch import nn

pytest.importorskip("hybridplan.planner", reason="needs the compiled planner hybridplan._C "
                                                 "(make build)")

import hybridplan  # noqa: E402
from hybridplan import _C  # noqa: E402
from dist_harness import format_results, run_ranks  # noqa: E402

PLAN_KEYS = ("json.dumps", "json.loads", "deepcopy", "broadcast", "_C.check_plan",
             "_C.validate_plan", "_C.search")


def _is_plan(value):
    return isinstance(value, dict) and {"assignment", "mode", "dp", "mesh"} <= set(value)


class Counts(dict):
    def bump(self, key):
        self[key] = self.get(key, 0) + 1


def count_plan_handling(monkeypatch=None):
    """Installs the counters (through `monkeypatch`, else for the life of the process: a rank
    of run_ranks); returns the dict they fill."""
    patch = monkeypatch.setattr if monkeypatch is not None else setattr
    counts = Counts()
    dumps, loads, deepcopy = json.dumps, json.loads, copy.deepcopy

    def counted_dumps(obj, *a, **k):
        if _is_plan(obj):
            counts.bump("json.dumps")
        return dumps(obj, *a, **k)

    def counted_loads(text, *a, **k):
        out = loads(text, *a, **k)
        if _is_plan(out) or (isinstance(out, dict) and any(
                _is_plan(p) for p in out.get("plans", []))):  # a search's plans, parsed
            counts.bump("json.loads")
        return out

    def counted_deepcopy(obj, *a, **k):
        if _is_plan(obj):
            counts.bump("deepcopy")
        return deepcopy(obj, *a, **k)

    patch(json, "dumps", counted_dumps)
    patch(json, "loads", counted_loads)
    patch(copy, "deepcopy", counted_deepcopy)
    broadcast = torch.distributed.broadcast_object_list

    def counted_broadcast(*a, **k):
        counts.bump("broadcast")
        return broadcast(*a, **k)
    patch(torch.distributed, "broadcast_object_list", counted_broadcast)
    for name in ("check_plan", "validate_plan", "canonical_graph", "graph_sha256", "search"):
        real = getattr(_C, name, None)
        if real is None:  # an older core (bench/trace_parallelize.py --checkout) lacks it
            continue

        def counted(*a, _real=real, _name=name, **k):
            counts.bump(f"_C.{_name}")
            return _real(*a, **k)
        patch(_C, name, counted)
    return counts


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _parallelize(tmp_path, **options):
    torch.manual_seed(0)
    model = Mlp()
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    return hybridplan.parallelize(model, x, example_target=y, cache_dir=str(tmp_path),
                                  verbose=False, profile_options={"warmup": 1, "repeats": 2},
                                  **options), x, y


def test_one_parallelize_call_parses_the_plan_once(tmp_path, monkeypatch):
    _parallelize(tmp_path)[0].close()  # the graph is cached now: the second call plans only
    counts = count_plan_handling(monkeypatch)
    hp, x, y = _parallelize(tmp_path)
    try:
        hp.step(*hp.shard(x, y))
    finally:
        hp.close()
    print(dict(counts), file=sys.stderr)
    # the search's plans come out of the core as one JSON text, parsed once; the plan's
    # canonical text is written once, for its sha256 (the ranks' agreement, checkpoints);
    # nothing copies or re-validates it, and a job of one process broadcasts nothing. The
    # graph is read from the cache once and hashed once (apply checks the plan's graph).
    assert counts == {"_C.search": 1, "json.loads": 1, "json.dumps": 1,
                      "_C.canonical_graph": 1, "_C.graph_sha256": 1}, counts


def test_hp_plan_is_the_planners_plan(tmp_path):
    hp, x, y = _parallelize(tmp_path)
    try:
        assert isinstance(hp.plan, hybridplan.planner.Plan)
        assert hp.plan is hp.parallelized.plan
        assert hp.plan.to_dict()["dp"] == hp.plan.dp == 1
        assert hp.plan.sha256 == hp.plan.sha256 and len(hp.plan.sha256) == 64
    finally:
        hp.close()


def parallelize_rank(out_dir):
    """One rank of a 2-process job: one parallelize call and a step under the counters."""
    counts = count_plan_handling()
    torch.set_num_threads(1)
    # data parallelism only: no runner-up or fallback plan (each would be one more plan,
    # written once when evaluated or sent)
    hp, x, y = _parallelize(out_dir, modes=("placement",))
    hp.step(*hp.shard(torch.cat([x, x]), torch.cat([y, y])))
    rank, sha = torch.distributed.get_rank(), hp.plan.sha256
    hp.close()
    with open(os.path.join(out_dir, f"counts{rank}.json"), "w") as f:
        json.dump({"counts": {k: v for k, v in counts.items() if k in PLAN_KEYS},
                   "sha": sha}, f)


def test_two_ranks_one_search_one_broadcast_one_read(tmp_path):
    """Rank 0 searches and parses the plan once; the plan crosses to rank 1 once, as JSON, in
    the one broadcast, and rank 1 checks and parses it once; each writes the canonical text
    once, for the sha256 the ranks agree on."""
    results = run_ranks("test_plan_object:parallelize_rank", 2, {"out_dir": str(tmp_path)},
                        timeout_s=180)
    assert all(r.returncode == 0 for r in results), format_results(results)
    got = [json.loads((tmp_path / f"counts{r}.json").read_text()) for r in range(2)]
    assert got[0]["sha"] == got[1]["sha"]
    assert got[0]["counts"] == {"_C.search": 1, "json.loads": 1, "json.dumps": 1,
                                "broadcast": 1}, got[0]
    assert got[1]["counts"] == {"_C.check_plan": 1, "json.loads": 1, "json.dumps": 1,
                                "broadcast": 1}, got[1]
