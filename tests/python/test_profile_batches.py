"""The profiler measures each node at several batch sizes (the graph's batch_times), by the rule
the C++ profiler uses too (planner/costs/compute_cost.h default_profile_batch_sizes, through _C)."""

import pytest
import torch

import hybridplan
from hybridplan import models
from hybridplan.profiler.profile import _batch_sizes


def test_default_batch_sizes_halve_the_example_batch():
    assert _batch_sizes("auto", torch.zeros(32)) == [1, 2, 4, 8, 16]
    assert _batch_sizes("auto", torch.zeros(48)) == [1, 3, 6, 12, 24]
    assert _batch_sizes("auto", torch.zeros(1)) == []


def test_explicit_batch_sizes_are_checked():
    assert _batch_sizes([4, 2, 4], torch.zeros(8)) == [2, 4]
    with pytest.raises(ValueError, match=r"batch_sizes must lie in 1\.\.7 .*\(got \[8\]\)"):
        _batch_sizes([8], torch.zeros(8))
    with pytest.raises(ValueError, match="batch_sizes must be \"auto\""):
        _batch_sizes("all", torch.zeros(8))


def test_profile_carries_batch_times_that_the_planner_reads():
    torch.manual_seed(0)
    module = models.get("branchy_cnn", seed=0, width=8, image_size=16)
    graph = hybridplan.profile(module, module.example_inputs(8), verbose=False, repeats=3,
                               warmup=1)
    nodes = graph.nodes
    assert all([p["batch_size"] for p in n["batch_times"]] == [1, 2, 4] for n in nodes)
    for n in nodes:
        assert all(p["forward_s"] >= 0 and p["backward_s"] >= 0 for p in n["batch_times"])
    # The planner takes a micro-batch's time from the curve: with every point of the curve set
    # to the batch-8 time (a flat curve: a call costs the same however small its batch), a 1x2
    # pipeline of 8 micro-batches of 1 is predicted 8x the compute of linear scaling from batch
    # 8 (the measured points themselves are not compared here: on a loaded machine a batch-1
    # time can read below 1/8 of the batch-8 one)
    flat = graph.to_dict()
    for n in flat["nodes"]:
        n["batch_times"] = [dict(p, forward_s=n["forward_s"], backward_s=n["backward_s"])
                            for p in n["batch_times"]]
    graph_flat = hybridplan.Graph.from_dict(flat)
    linear = graph.to_dict()
    for n in linear["nodes"]:
        n.pop("batch_times")
    graph_linear = hybridplan.Graph.from_dict(linear)
    stage_of = {name: (0 if i < len(nodes) // 2 else 1) for i, name in enumerate(graph.node_names)}

    def predicted(g):
        plan = hybridplan.planner.Plan.from_dict(_pipeline_plan(g, stage_of, 8, 8))
        return hybridplan.evaluate(g, "localhost-cpu", plan)["compute_s"]

    assert predicted(graph_flat) > 4 * predicted(graph_linear)
    assert "measured at batch sizes 1, 2, 4, 8" in hybridplan.evaluate(
        graph, "localhost-cpu", _pipeline_plan(graph, stage_of, 8, 8))["compute_model"]


def _pipeline_plan(graph, stage_of, batch, microbatches):
    return {"schema_version": 1, "kind": "hybridplan.plan",
            "graph": {"name": graph.name, "sha256": graph.sha256},
            "cluster": {"name": "localhost-cpu", "num_nodes": 1, "devices_per_node": 2},
            "world_size": 2, "dp": 1, "mp": 2, "mode": "pipeline",
            "per_replica_batch": batch, "global_batch": batch,
            "num_microbatches": microbatches, "schedule": "1f1b", "mesh": [[0, 1]],
            "assignment": [{"node": n["id"], "name": n["name"], "device": stage_of[n["name"]]}
                           for n in graph.nodes]}
