"""Every plan validation message, with the same text as the C++ core gives it
(tests/cpp/planner/test_plan_validation.cc checks the same table, tests/data/plan_validation.json):
Python has no validation rules of its own. Structural cases go through both Python entry points
that read a plan (hybridplan.Plan and the executor's parse_plan); the others through
Plan.validate(graph, cluster)."""

import json
from pathlib import Path

import pytest

import hybridplan
from hybridplan.executor.plan_spec import graph_sha256, parse_plan

ROOT = Path(__file__).resolve().parents[2]
TABLE = json.loads((ROOT / "tests/data/plan_validation.json").read_text())
GRAPH = hybridplan.Graph.load(ROOT / TABLE["graph"])
CLUSTER = hybridplan.Cluster.load(TABLE["cluster"])


def case_graph(case):
    """The case's graph: the table's, with the case's optional `tensor_parallel` objects set on
    the nodes it names."""
    if "tensor_parallel" not in case:
        return GRAPH
    d = json.loads((ROOT / TABLE["graph"]).read_text())
    for node in d["nodes"]:
        if node["name"] in case["tensor_parallel"]:
            node["tensor_parallel"] = case["tensor_parallel"][node["name"]]
    return hybridplan.Graph.from_dict(d, "graph")


def case_plan(case):
    plan = json.loads(json.dumps(TABLE["plan"]))
    plan.update(json.loads(json.dumps(case["set"])))
    if plan["graph"]["sha256"] == "$GRAPH_SHA256":
        plan["graph"]["sha256"] = case_graph(case).sha256
    return plan


def test_the_table_plan_is_valid():
    hybridplan.Plan.from_dict(case_plan({"set": {}}), "plan").validate(GRAPH, CLUSTER)
    assert parse_plan(case_plan({"set": {}})).mp == 2


@pytest.mark.parametrize("case", TABLE["cases"], ids=lambda c: json.dumps(c["set"])[:60])
def test_message(case):
    plan = case_plan(case)
    if case["against_graph"]:
        graph = case_graph(case)
        entry_points = [lambda: hybridplan.Plan.from_dict(plan, "plan").validate(graph, CLUSTER)]
    else:
        entry_points = [lambda: hybridplan.Plan.from_dict(plan, "plan"), lambda: parse_plan(plan)]
    for entry_point in entry_points:
        with pytest.raises(ValueError) as error:
            entry_point()
        assert str(error.value) == case["message"].replace("$GRAPH_SHA256", GRAPH.sha256)


def test_graph_hash_is_the_cores():
    """A dict or a path hashes through the core: a graph without optional fields (no flops, no
    edge bytes) still hashes as the C++ planner's canonical form does."""
    d = json.loads((ROOT / TABLE["graph"]).read_text())
    assert all("bytes" not in e for e in d["edges"])  # C++ fills them in before hashing
    assert graph_sha256(d) == graph_sha256(str(ROOT / TABLE["graph"])) == GRAPH.sha256
    with pytest.raises(ValueError, match=r"graph: \$ must be a hybridplan Graph"):
        graph_sha256(42)
