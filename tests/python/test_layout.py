"""executor/layout.py: the process grid of every plan shape, and the groups one init_device_mesh
builds from it on 4 ranks."""

import datetime
import json
import os
import sys

import pytest

from dist_harness import format_results, run_ranks
from hybridplan.executor.layout import Layout

SHAPES = [  # mode, dp, mp, tp, dp_shard (0: no hybrid sharding)
    ("placement", 1, 1, 1, 0), ("placement", 4, 1, 1, 0), ("placement", 2, 1, 2, 0),
    ("placement", 3, 1, 4, 0), ("placement", 4, 1, 1, 2), ("placement", 6, 1, 1, 3),
    ("pipeline", 1, 2, 1, 0), ("pipeline", 2, 2, 1, 0), ("pipeline", 2, 2, 2, 0),
    ("pipeline", 3, 4, 2, 0), ("pipeline", 4, 2, 1, 2), ("pipeline", 8, 3, 1, 4),
]


def _old(mode, dp, mp, tp):
    """The executor's process layout as docs/formats.md states it (placement rank = r * tp + t,
    pipeline rank = (r * mp + k) * tp + t), written out as the executor computed it before the
    layout object: the oracle."""
    stages = mp if mode == "pipeline" else 1

    def rank_of(r, k, t):
        return (r * stages + k) * tp + t
    return {
        "rank_of": rank_of,
        "replica_of": lambda x: x // (tp if mode == "placement" else mp * tp),
        "stage_of": lambda x: 0 if mode == "placement" else (x // tp) % mp,
        "dp": [[rank_of(r, k, t) for r in range(dp)] for k in range(stages) for t in range(tp)],
        "pp": [[rank_of(r, k, t) for k in range(mp)] for r in range(dp) for t in range(tp)],
        "tp": [[rank_of(r, k, t) for t in range(tp)] for r in range(dp) for k in range(stages)],
    }


def _sorted(lists):
    return sorted(sorted(x) for x in lists)


@pytest.mark.parametrize("mode,dp,mp,tp,dp_shard", SHAPES)
def test_rank_lists_match_the_documented_layout(mode, dp, mp, tp, dp_shard):
    layout = Layout(mode, dp, mp, tp, dp_shard)
    old = _old(mode, dp, mp, tp)
    stages = mp if mode == "pipeline" else 1
    assert layout.world_size == dp * stages * tp
    for x in range(layout.world_size):
        r, k, t = layout.replica_of(x), layout.stage_of(x), layout.tp_rank_of(x)
        assert (r, k, t) == (old["replica_of"](x), old["stage_of"](x), x % tp)
        assert layout.rank_of(r, k, t) == x == old["rank_of"](r, k, t)
    # the groups init_device_mesh builds (the grid's slices) are the executor's groups
    assert layout.rank_lists(layout.dp_dims) == old["dp"]
    assert [layout.dp_group_ranks(k, t) for k in range(stages) for t in range(tp)] == old["dp"]
    if mode == "pipeline":
        assert _sorted(layout.rank_lists(["pp"])) == _sorted(old["pp"])
        assert [layout.replica_ranks(r, t) for r in range(dp) for t in range(tp)] == old["pp"]
    if tp > 1:
        assert _sorted(layout.rank_lists(["tp"])) == _sorted(old["tp"])
        assert [layout.tp_group_ranks(r, k) for r in range(dp)
                for k in range(stages)] == old["tp"]
    if dp_shard:  # HSDP over each DP group: consecutive replicas shard, strided ones replicate
        shard, replicate = [], []
        for ranks in old["dp"]:
            shard += [ranks[i * dp_shard:(i + 1) * dp_shard] for i in range(dp // dp_shard)]
            replicate += [ranks[j::dp_shard] for j in range(dp_shard)]
        assert _sorted(layout.rank_lists(["dp_shard"])) == _sorted(shard)
        assert _sorted(layout.rank_lists(["dp_replicate"])) == _sorted(replicate)


def test_dims_name_only_what_the_plan_uses():
    assert Layout("placement", 4, 1).dims == (("dp", 4),)
    assert Layout("placement", 2, 1, 2).dims == (("dp", 2), ("tp", 2))
    assert Layout("pipeline", 2, 3).dims == (("dp", 2), ("pp", 3))
    assert Layout("pipeline", 4, 2, 1, 2).dims == (("dp_replicate", 2), ("dp_shard", 2),
                                                   ("pp", 2))
    assert Layout("placement", 4, 1, 1, 4).dims == (("dp", 4),)  # dp_shard == dp: plain
    with pytest.raises(ValueError, match=r"layout: dims must be among \['dp'\] \(got \['tp'\]\)"):
        Layout("placement", 4, 1).rank_lists(["tp"])


def test_tied_rank_lists():
    layout = Layout("pipeline", 2, 3, 2)
    assert layout.tied_rank_lists([0, 2]) == [[0, 4], [1, 5], [6, 10], [7, 11]]


def mesh_rank(out_dir: str, mode: str, dp: int, mp: int, tp: int, dp_shard: int) -> None:
    """One rank: builds the layout's groups and writes which ranks each one holds."""
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
    layout = Layout(mode, dp, mp, tp, dp_shard)
    mesh = layout.build(datetime.timedelta(seconds=30))
    ranks = dist.get_process_group_ranks
    got = {"dp": ranks(mesh.dp_group()), "groups": len(mesh.groups)}
    if mode == "pipeline":
        got["pp"] = ranks(mesh.pp_group())
        got["tied"] = ranks(mesh.tied_group([0, mp - 1]))
    if tp > 1:
        got["tp"] = ranks(mesh.tp().get_group())
        got["dp_tp"] = mesh.dp_tp().mesh.tolist()
    if dp_shard:
        got["hsdp"] = mesh.hsdp().mesh.tolist()
    got["default_used"] = any(g is dist.group.WORLD for g in mesh.groups)
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump(got, f)
    for group in reversed(mesh.groups):
        dist.destroy_process_group(group)
    dist.destroy_process_group()


@pytest.mark.parametrize("mode,dp,mp,tp,dp_shard", [  # pp, tp, (dp, tp), tied; HSDP
    ("pipeline", 1, 2, 2, 0), ("placement", 4, 1, 1, 2)])
def test_built_groups_are_the_layouts_slices(tmp_path, mode, dp, mp, tp, dp_shard):
    results = run_ranks("test_layout:mesh_rank", 4,
                        {"out_dir": str(tmp_path), "mode": mode, "dp": dp, "mp": mp, "tp": tp,
                         "dp_shard": dp_shard}, timeout_s=90)
    assert all(r.returncode == 0 for r in results), format_results(results)
    layout = Layout(mode, dp, mp, tp, dp_shard)
    for x in range(4):
        with open(tmp_path / f"rank{x}.json") as f:
            got = json.load(f)
        r, k, t = layout.replica_of(x), layout.stage_of(x), layout.tp_rank_of(x)
        assert got["dp"] == layout.dp_group_ranks(k, t)
        assert not got["default_used"]  # groups of the plan's own: close() destroys them
        if mode == "pipeline":
            assert got["pp"] == layout.replica_ranks(r, t)
            assert got["tied"] == [layout.rank_of(r, 0, t), layout.rank_of(r, mp - 1, t)]
        if tp > 1:
            assert got["tp"] == layout.tp_group_ranks(r, k)
            assert got["dp_tp"] == [layout.tp_group_ranks(q, k) for q in range(dp)]
        if dp_shard:
            dp_ranks = layout.dp_group_ranks(k, t)
            assert got["hsdp"] == [dp_ranks[i * dp_shard:(i + 1) * dp_shard]
                                   for i in range(dp // dp_shard)]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
