"""Sharded plans ("sharding": "zero2" / "zero3", executor/sharding.py) beyond their training
(test_user_models, test_checkpoint): which modules become FSDP units, what a unit holds after
its forward (zero2 keeps the gathered parameters, zero3 frees them), the options apply()
refuses with sharding (the noise-scale meter, an optimizer built before apply), and close():
it returns on every rank, destroys the plan's groups, later calls raise, and the ranks exit 0.
Hybrid sharding (the plan's "dp_shard" < dp, HSDP) trains equal to one process, on 4 ranks.
"""

import os

import pytest
import torch
from torch import nn

from dist_harness import format_results, run_ranks
from hybridplan.executor import noise, sharding
from plan_builders import placement_plan

BATCH = 4


class Tied(nn.Module):
    """Two node modules sharing one weight (GPT-2's wte / lm_head, in small) and one of its own."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Linear(6, 6, bias=False)
        self.mid = nn.Linear(6, 6)
        self.head = nn.Linear(6, 6, bias=False)
        self.head.weight = self.embed.weight
        self.act = nn.ReLU()

    def forward(self, x):
        return self.head(self.act(self.mid(self.embed(x))))


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def batch(step):
    g = torch.Generator().manual_seed(step)
    return torch.randn(2 * BATCH, 8, generator=g), torch.randint(0, 4, (2 * BATCH,), generator=g)


def sharded_plan(model, kind):
    return dict(placement_plan(model, dp=2, mp=1, per_replica_batch=BATCH), sharding=kind)


def test_node_units_leave_tied_nodes_to_the_root():
    assert sharding.node_units(Tied(), ["embed", "mid", "act", "head"]) == ["mid"]
    assert sharding.node_units(tiny(), ["0", "1", "2"]) == ["0", "2"]  # "1": no parameters
    assert sharding.node_units(tiny(), ["0", "2@1"]) == ["0", "2"]     # a later call's module


def test_noise_scale_option_refused_with_sharding():
    with pytest.raises(ValueError, match='plan.json: measure_noise_scale needs the plan\'s '
                                         '"sharding" to be "none"'):
        noise.check_options(1, 0.99, 2, "plan.json", "zero2")
    noise.check_options(0, 0.99, 2, "plan.json", "zero3")  # off: any sharding
    noise.check_options(1, 0.99, 2, "plan.json", "none")


# ---- rank side --------------------------------------------------------------------------------

def lifecycle(out_dir):
    """On 2 ranks: the refusals, the units after a forward, a step, state_dict, close()."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    import hybridplan
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # ours: close() must leave it (apply did not create it)
    rank = dist.get_rank()
    report = {}
    model = tiny()
    for what, kw in (("noise", {"measure_noise_scale": 1}),
                     ("optimizer", {"optimizer": torch.optim.SGD(model.parameters(), lr=0.1)})):
        try:
            hybridplan.apply(sharded_plan(model, "zero2"), model, timeout_s=30, **kw)
            report[what] = "accepted"
        except ValueError as e:
            report[what] = str(e)
    groups_before = len(dist.distributed_c10d._world.pg_map)
    for kind in ("zero2", "zero3"):
        model = tiny()
        hp = hybridplan.apply(sharded_plan(model, kind), model, timeout_s=30)
        inputs, target = hp.shard(*batch(0))
        out = hp.module(inputs)  # a forward alone: what does unit "0" hold after it?
        report[f"{kind}.after_forward"] = isinstance(model[0].weight, DTensor)
        nn.functional.cross_entropy(out, target).backward()
        report[f"{kind}.after_backward"] = isinstance(model[0].weight, DTensor)
        hp.step(*hp.shard(*batch(1)))
        report[f"{kind}.units"] = hp.shard_units
        report[f"{kind}.dtensors"] = all(isinstance(p, DTensor) for p in hp.parameters())
        report[f"{kind}.state"] = {k: list(v.shape) for k, v in hp.state_dict().items()}
        groups = list(hp._groups)
        hp.close()
        hp.close()  # idempotent
        report[f"{kind}.groups_left"] = sum(g in dist.distributed_c10d._world.pg_map
                                            for g in groups)
        try:
            hp.step(*hp.shard(*batch(2)))
            report[f"{kind}.step_after_close"] = "ran"
        except RuntimeError as e:
            report[f"{kind}.step_after_close"] = str(e)
    report["groups_after"] = len(dist.distributed_c10d._world.pg_map) - groups_before
    report["default_alive"] = dist.is_initialized()
    torch.save(report, os.path.join(out_dir, f"lifecycle.rank{rank}.pt"))
    dist.destroy_process_group()


HSDP_STEPS = 3


def hsdp_training(out_dir):
    """dp = 4 replicas in 2 shard groups of 2 (replicas {0, 1} and {2, 3} shard, {0, 2} and
    {1, 3} all-reduce their shards), zero2 and zero3: the full state after HSDP_STEPS steps,
    and the mesh a parameter lives on."""
    import torch.distributed as dist
    import hybridplan
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # one job, two plans applied in turn
    report = {}
    for kind in ("zero2", "zero3"):
        model = tiny()
        plan = dict(placement_plan(model, dp=4, mp=1, per_replica_batch=BATCH), sharding=kind,
                    dp_shard=2)
        hp = hybridplan.apply(plan, model, timeout_s=60,
                              optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
        for step in range(HSDP_STEPS):
            hp.step(*hp.shard(*hsdp_batch(step)))
        weight = next(iter(hp.parameters()))
        report[kind] = {"state": hp.state_dict(), "mesh": list(weight.device_mesh.shape),
                        "placements": [str(p) for p in weight.placements],
                        "local": list(weight.to_local().shape)}
        hp.close()
    torch.save(report, os.path.join(out_dir, f"hsdp.rank{dist.get_rank()}.pt"))
    dist.destroy_process_group()


def hsdp_pipeline_training(out_dir):
    """dp = 4 replicas of a 2-stage 1F1B pipeline (8 ranks), zero2 in shard groups of 2: every
    stage's DP group is a 2-D mesh of its own."""
    import torch.distributed as dist
    import hybridplan
    from plan_builders import pipeline_plan
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = tiny()
    plan = dict(pipeline_plan(model, dp=4, mp=2, schedule="1f1b", num_microbatches=2,
                              per_replica_batch=BATCH), sharding="zero2", dp_shard=2)
    hp = hybridplan.apply(plan, model, timeout_s=90, example_inputs=hsdp_batch(0)[0][:BATCH],
                          optimizer=lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
    for step in range(HSDP_STEPS):
        hp.step(*hp.shard(*hsdp_batch(step)))
    weight = next(iter(hp.parameters()))
    report = {"state": hp.state_dict(), "mesh": list(weight.device_mesh.shape)}
    hp.close()
    torch.save(report, os.path.join(out_dir, f"hsdp_pipe.rank{dist.get_rank()}.pt"))
    dist.destroy_process_group()


def hsdp_batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(4 * BATCH, 8, generator=g), torch.randint(0, 4, (4 * BATCH,), generator=g)


# ---- test side --------------------------------------------------------------------------------

def hsdp_reference():
    """One process, the global batch, the same loss and optimizer."""
    torch.set_num_threads(1)
    model = tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(HSDP_STEPS):
        inputs, target = hsdp_batch(step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(inputs), target).backward()
        opt.step()
    return model.state_dict()


def hsdp_reports(target, ranks, tmp_path, prefix):
    """Runs `target` on `ranks` ranks and loads each rank's report."""
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    results = run_ranks(f"test_sharding:{target}", ranks, {"out_dir": str(tmp_path)},
                        timeout_s=300)
    assert all(r.returncode == 0 for r in results), format_results(results)
    return [torch.load(tmp_path / f"{prefix}.rank{rank}.pt") for rank in range(ranks)]


def worst_difference(state, expected):
    return max((state[k] - v).abs().max().item() for k, v in expected.items())


def test_hybrid_sharding_of_a_pipeline_trains_equal_to_one_process(tmp_path):
    expected = hsdp_reference()
    for rank, got in enumerate(hsdp_reports("hsdp_pipeline_training", 8, tmp_path, "hsdp_pipe")):
        assert got["mesh"] == [2, 2]
        assert worst_difference(got["state"], expected) < 1e-6, rank


def test_hybrid_sharding_trains_equal_to_one_process(tmp_path):
    expected = hsdp_reference()
    for rank, report in enumerate(hsdp_reports("hsdp_training", 4, tmp_path, "hsdp")):
        for kind in ("zero2", "zero3"):
            got = report[kind]
            assert got["mesh"] == [2, 2]  # (replicate, shard)
            assert got["placements"] == ["R", "S(0)"]  # replicated, sharded on dim 0
            assert got["local"] == [8, 8]  # "0".weight (16 x 8) over 2 shards
            assert worst_difference(got["state"], expected) < 1e-6, (kind, rank)


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    out_dir = tmp_path_factory.mktemp("sharding")
    results = run_ranks("test_sharding:lifecycle", 2, {"out_dir": str(out_dir)}, timeout_s=300)
    assert all(r.returncode == 0 for r in results), format_results(results)  # exits cleanly
    return [torch.load(out_dir / f"lifecycle.rank{r}.pt") for r in range(2)]


def test_apply_refuses_noise_scale_and_a_built_optimizer_with_sharding(reports):
    for report in reports:
        assert 'measure_noise_scale needs the plan\'s "sharding" to be "none"' in \
            report["noise"], report["noise"]
        assert "(got sharding='zero2')" in report["noise"]
        assert "pass an optimizer factory" in report["optimizer"], report["optimizer"]


def test_zero2_keeps_gathered_parameters_through_backward_and_zero3_frees_them(reports):
    """FSDP registers a unit's gathered (plain) parameters while it holds them and its DTensor
    shards otherwise; after the backward every unit is sharded again."""
    for report in reports:
        assert report["zero2.after_forward"] is False  # gathered, kept for the backward
        assert report["zero3.after_forward"] is True   # freed: its shard is registered again
        assert report["zero2.after_backward"] is report["zero3.after_backward"] is True
        for kind in ("zero2", "zero3"):
            assert report[f"{kind}.units"] == ["0", "2"]
            assert report[f"{kind}.dtensors"]
            assert report[f"{kind}.state"] == {k: list(v.shape)
                                               for k, v in tiny().state_dict().items()}


def test_close_destroys_the_plans_groups_and_later_steps_raise(reports):
    for report in reports:
        for kind in ("zero2", "zero3"):
            assert report[f"{kind}.groups_left"] == 0
            assert "step() after close()" in report[f"{kind}.step_after_close"]
        assert report["groups_after"] == 0
        assert report["default_alive"]  # the job's own group: not apply()'s to destroy
