"""hybridplan.planner (and hybridplan._C under it): documents, plan/search/evaluate/explain,
errors, presets, PipeDream import. Pure planner: no torch, fast, deterministic."""

import hashlib
import sys
from pathlib import Path

import pytest

import hybridplan
from hybridplan import pipedream, planner
from hybridplan.planner import Cluster, Graph, InfeasibleError, Job, Plan

ROOT = Path(__file__).resolve().parents[2]


def diamond_dict():
    """a -> {b, c} -> d; times for 8 samples. One device runs it in
    (0.01 + 0.02 + 0.03 + 0.01) * (1 + 2) = 0.21 s (backward = 2 x forward)."""
    times = [("a", 0.01), ("b", 0.02), ("c", 0.03), ("d", 0.01)]
    return {"schema_version": 1, "kind": "hybridplan.graph", "name": "diamond",
            "profiled": {"device": "cpu", "batch_size": 8, "dtype": "float32"},
            "nodes": [{"id": i, "name": n, "op": "linear", "forward_s": f, "backward_s": 2 * f,
                       "param_bytes": 1000, "output_bytes": 4000}
                      for i, (n, f) in enumerate(times)],
            "edges": [{"src": 0, "dst": 1}, {"src": 0, "dst": 2},
                      {"src": 1, "dst": 3}, {"src": 2, "dst": 3}]}


def box_dict(num_nodes=1, devices_per_node=4, memory_bytes=1 << 30):
    return {"schema_version": 1, "kind": "hybridplan.cluster", "name": "box",
            "num_nodes": num_nodes, "devices_per_node": devices_per_node,
            "device": {"name": "dev", "memory_bytes": memory_bytes, "peak_flops": 1e12},
            "intra_node": {"bandwidth_bytes_per_s": 1e10, "latency_s": 1e-5},
            "inter_node": {"bandwidth_bytes_per_s": 1e9, "latency_s": 1e-4}}


def hand_plan_dict(graph, dp=1, mp=1):
    """A placement plan written by hand: every node on the replica's device 0."""
    return {"schema_version": 1, "kind": "hybridplan.plan",
            "graph": {"name": graph.name, "sha256": graph.sha256},
            "cluster": {"name": "box", "num_nodes": 1, "devices_per_node": 4},
            "world_size": dp * mp, "dp": dp, "mp": mp, "mode": "placement",
            "per_replica_batch": 8, "global_batch": 8 * dp, "num_microbatches": 1,
            "schedule": "none", "mesh": [[r * mp + k for k in range(mp)] for r in range(dp)],
            "assignment": [{"node": n["id"], "name": n["name"], "device": 0}
                           for n in graph.nodes]}


@pytest.fixture
def graph():
    return Graph.from_dict(diamond_dict())


@pytest.fixture
def box():
    return Cluster.from_dict(box_dict())


# ---- documents ---------------------------------------------------------------------------------

def test_graph_round_trip_keeps_sha256(graph, tmp_path):
    again = Graph.from_dict(graph.to_dict())
    assert again == graph and again.sha256 == graph.sha256
    graph.save(tmp_path / "g.json")
    loaded = Graph.load(tmp_path / "g.json")
    assert loaded == graph and loaded.sha256 == graph.sha256
    # the sha256 is of the canonical JSON text (sorted keys, no spaces)
    assert graph.sha256 == hashlib.sha256(graph.to_json().encode()).hexdigest()
    assert ": " not in graph.to_json() and graph.to_json().startswith('{"edges":')
    assert graph.name == "diamond" and graph.node_names == ["a", "b", "c", "d"]
    assert [n["forward_s"] for n in graph.nodes] == [0.01, 0.02, 0.03, 0.01]


def test_graph_sha256_changes_with_content(graph):
    d = diamond_dict()
    d["nodes"][2]["forward_s"] = 0.031
    assert Graph.from_dict(d).sha256 != graph.sha256


def test_to_dict_is_a_copy(graph):
    d = graph.to_dict()
    d["nodes"][0]["name"] = "changed"
    assert graph.node_names[0] == "a"


def test_numpy_numbers_are_accepted():
    np = pytest.importorskip("numpy")
    d = diamond_dict()
    d["nodes"][0]["forward_s"] = np.float32(0.5)
    d["nodes"][0]["param_bytes"] = np.int64(12)
    g = Graph.from_dict(d)
    assert g.nodes[0]["forward_s"] == 0.5 and g.nodes[0]["param_bytes"] == 12


def test_save_is_atomic_and_leaves_no_temporaries(graph, tmp_path):
    path = tmp_path / "sub" / "g.json"
    graph.save(path)
    graph.save(path)  # overwrite
    assert [p.name for p in path.parent.iterdir()] == ["g.json"]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["nodes"][1].update(forward_s=-1),
     "<dict>: nodes[1].forward_s must be finite and >= 0 (got -1"),
    (lambda d: d["nodes"][1].update(forward_s="x"), "<dict>: nodes[1].forward_s must be a number"),
    (lambda d: d["nodes"][0].pop("name"), "<dict>: nodes[0].name is required"),
    (lambda d: d["edges"].append({"src": 3, "dst": 0}), "<dict>: edges form a cycle"),
    (lambda d: d["nodes"][0].update(forward_s=float("nan")), "<dict>: $ must be JSON-serializable"),
])
def test_bad_graph_raises_value_error_naming_the_path(mutate, message):
    d = diamond_dict()
    mutate(d)
    with pytest.raises(ValueError) as e:
        Graph.from_dict(d)
    assert str(e.value).startswith(message)


def test_bad_json_text_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match=r"^x\.json: \$ must be valid JSON \(got "):
        Graph.from_json("{", "x.json")
    (tmp_path / "bad.json").write_text("[1,")
    with pytest.raises(ValueError, match=r"bad\.json: \$ must be valid JSON"):
        Graph.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match=r"nope\.json: cannot be read"):
        Graph.load(tmp_path / "nope.json")
    with pytest.raises(ValueError, match=r"^<dict>: \$ must be a JSON object \(got list\)"):
        Graph.from_dict([1, 2])


@pytest.mark.parametrize("kind", ["graph", "cluster", "job", "plan"])
@pytest.mark.parametrize("text", ["", " \n\t"])
def test_empty_or_non_object_file_names_its_kind(tmp_path, kind, text):
    """An empty file says which document it was meant to be, as the CLI does."""
    load = {"graph": Graph.load, "cluster": Cluster.load, "job": Job.load, "plan": Plan.load}[kind]
    path = tmp_path / f"{kind}.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"^{kind} file .*{kind}\.json is empty$"):
        load(path)
    path.write_text("null")
    with pytest.raises(ValueError, match=rf"^{kind} file .*{kind}\.json: expected a JSON object \(got null\)$"):
        load(path)


def test_cluster_and_job_errors():
    bad = box_dict()
    bad["num_nodes"] = 0
    with pytest.raises(ValueError, match=r"^cl: num_nodes must be >= 1 \(got 0\)"):
        Cluster.from_dict(bad, "cl")
    job = {"schema_version": 1, "kind": "hybridplan.job", "samples_per_epoch": 100,
           "optimizer": "rmsprop"}
    with pytest.raises(ValueError, match=r'^<dict>: optimizer must be one of .*\(got "rmsprop"\)'):
        Job.from_dict(job)


def test_presets():
    names = hybridplan.presets()
    assert names == sorted(names)
    assert {"dgx1-v100", "localhost-cpu"} <= set(names)
    dgx = Cluster.preset("dgx1-v100")
    assert dgx.name == "dgx1-v100" and dgx.devices_per_node == 8
    assert dgx.num_devices == dgx.num_nodes * 8
    assert Cluster.load("dgx1-v100") == dgx  # a preset name where a path is expected
    big = dgx.with_num_nodes(128)
    assert big.num_devices == 1024 and big.to_dict()["device"] == dgx.to_dict()["device"]
    with pytest.raises(ValueError, match=r"must be one of .*dgx1-v100.* \(got 'nope'\)"):
        Cluster.preset("nope")
    with pytest.raises(ValueError, match=r"^nope: no such cluster file or preset \(presets: "):
        Cluster.load("nope")


def test_values_cannot_be_built_unvalidated():
    with pytest.raises(TypeError):
        Graph("{}")


# ---- plan, evaluate, explain -------------------------------------------------------------------

def test_plan_matches_evaluate(graph, box):
    best = hybridplan.plan(graph, box, devices=4)
    assert isinstance(best, Plan)
    assert best.world_size == best.dp * best.mp == 4
    assert best.graph_sha256 == graph.sha256
    assert set(best.assignment) == {"a", "b", "c", "d"}
    assert all(0 <= d < best.mp for d in best.assignment.values())
    assert best.global_batch == best.dp * best.per_replica_batch
    assert sorted(x for row in best.mesh for x in row) == [0, 1, 2, 3]
    breakdown = hybridplan.evaluate(graph, box, best)
    for key, value in best.predicted.items():
        if isinstance(value, (int, float)):
            assert breakdown[key] == pytest.approx(value, rel=1e-12), key
        else:  # rings, memory per device, the compute model's description
            assert breakdown[key] == value, key


def test_top_k_is_sorted_by_the_objective(graph, box):
    plans = hybridplan.plan(graph, box, devices=4, top_k=3)
    assert isinstance(plans, list) and 1 <= len(plans) <= 3
    objectives = [hybridplan.evaluate(graph, box, p)["objective"] for p in plans]
    assert objectives == sorted(objectives)
    # search with dp_only: mp = 1 only
    dp_only = planner.search(graph, box, devices=4, top_k=5, dp_only=True)
    assert dp_only.plans and all(p.mp == 1 for p in dp_only.plans)
    assert dp_only.candidates_evaluated >= 1


def test_evaluate_a_hand_written_plan(graph, box):
    # one device, no replicas: compute is the sum of forward + backward, no all-reduce
    breakdown = hybridplan.evaluate(graph, box, hand_plan_dict(graph))
    assert breakdown["compute_s"] == pytest.approx(0.21)
    assert breakdown["allreduce_s"] == 0
    assert breakdown["step_s"] == pytest.approx(0.21)
    assert breakdown["samples_per_s"] == pytest.approx(8 / 0.21)
    assert breakdown["feasible"] is True


def test_plan_round_trip_and_validation(graph, box, tmp_path):
    best = hybridplan.plan(graph, box, devices=2)
    best.save(tmp_path / "plan.json")
    loaded = hybridplan.load_plan(tmp_path / "plan.json")
    assert loaded == best and loaded.to_dict() == best.to_dict()
    assert loaded.validate(graph, box).assignment == best.assignment
    other = diamond_dict()
    other["nodes"][0]["forward_s"] = 0.5
    with pytest.raises(ValueError, match="sha256"):
        loaded.validate(other, box)
    with pytest.raises(ValueError, match="world_size"):
        bad = best.to_dict()
        bad["world_size"] = 3
        Plan.from_dict(bad)


def test_modes_and_devices_are_checked(graph, box):
    with pytest.raises(ValueError, match=r"modes must be a non-empty subset"):
        hybridplan.plan(graph, box, modes=("ring",))
    with pytest.raises(ValueError, match=r"devices must be an integer >= 1 \(got 0\)"):
        hybridplan.plan(graph, box, devices=0)
    with pytest.raises(ValueError, match=r"devices must be in 1\.\.4 .*\(got 8\)"):
        hybridplan.plan(graph, box, devices=8)
    only = hybridplan.plan(graph, box, devices=4, top_k=10, modes=("pipeline",))
    assert all(p.mode == "pipeline" or p.mp == 1 for p in only)


def test_infeasible_request_raises_infeasible_error(graph):
    tiny = Cluster.from_dict(box_dict(memory_bytes=1000))  # every node holds 1000 param bytes
    with pytest.raises(InfeasibleError) as e:
        hybridplan.plan(graph, tiny, devices=4)
    assert str(e.value).startswith('no plan fits on 4 devices of cluster "box"')
    assert issubclass(InfeasibleError, RuntimeError)
    assert not issubclass(InfeasibleError, ValueError)
    assert hybridplan.InfeasibleError is InfeasibleError


def test_job_with_convergence_gives_time_to_train(graph, box):
    job = Job.from_dict({"schema_version": 1, "kind": "hybridplan.job",
                         "samples_per_epoch": 800, "per_replica_batch": 8,
                         "convergence": {"model": "critical_batch", "epochs_min": 10,
                                         "critical_batch": 16}})
    p = hybridplan.evaluate(graph, box, hand_plan_dict(graph), job)
    # epochs(B = 8) = 10 * (1 + 8 / 16) = 15; steps per epoch = 800 / 8 = 100
    assert p["epochs"] == pytest.approx(15)
    assert p["time_to_train_s"] == pytest.approx(15 * 100 * p["step_s"])


def test_explain_mentions_layout_and_names(graph, box):
    best = hybridplan.plan(graph, box, devices=4)
    text = best.explain()
    assert f"dp {best.dp} x mp {best.mp}" in text and "diamond" in text
    with_graph = hybridplan.explain(best, graph, box)
    assert "box" in with_graph
    with pytest.raises(ValueError, match="cluster needs the graph"):
        hybridplan.explain(best, cluster=box)


def test_accepts_paths_and_preset_names(graph, tmp_path):
    graph.save(tmp_path / "g.json")
    p = hybridplan.plan(str(tmp_path / "g.json"), "localhost-cpu", devices=1)
    assert p.cluster_name == "localhost-cpu" and p.world_size == 1


def test_sweep(graph, box):
    out = planner.sweep(graph, box)
    assert [p["devices"] for p in out["points"]] == [1, 2, 4]
    assert out["csv"].splitlines()[0].startswith("devices,")
    # the sweep's best plan on 4 devices is search's best
    best = hybridplan.plan(graph, box, devices=4)
    assert out["points"][-1]["best"]["step_s"] == pytest.approx(best.predicted["step_s"])
    with pytest.raises(ValueError, match=r"max_devices must be an integer >= 1 \(got 0\)"):
        planner.sweep(graph, box, max_devices=0)


# ---- PipeDream import --------------------------------------------------------------------------

def test_pipedream_import_of_a_small_file(tmp_path):
    text = ("node1 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, "
            "activation_size=0.0, parameter_size=0.000\n"
            "node2 -- Linear(in_features=4, out_features=2) -- forward_compute_time=1.500, "
            "backward_compute_time=3.000, activation_size=[16.0; 16.0], parameter_size=40.000\n"
            "\tnode1 -- node2\n")
    (tmp_path / "tiny.graph.txt").write_text(text)
    g = pipedream.import_profile(tmp_path / "tiny.graph.txt", batch_size=16)
    assert g.name == "tiny" and g.node_names == ["node1", "node2"]
    assert g.batch_size == 16
    linear = g.nodes[1]
    assert linear["forward_s"] == pytest.approx(0.0015)
    assert linear["output_bytes"] == 32 and linear["param_bytes"] == 40
    with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1"):
        pipedream.import_profile(tmp_path / "tiny.graph.txt", batch_size=0)
    (tmp_path / "bad.graph.txt").write_text("this is not a profile\n")
    with pytest.raises(ValueError, match=r"bad\.graph\.txt"):
        pipedream.import_profile(tmp_path / "bad.graph.txt")


def test_pipedream_profiles_dir_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(pipedream.ENV_VAR, str(tmp_path))
    assert pipedream.profiles_dir() == tmp_path and pipedream.available() == []
    with pytest.raises(FileNotFoundError, match="msr-fiddle/pipedream"):
        pipedream.load("alexnet")


def test_real_pipedream_profiles_plan():
    if "alexnet" not in pipedream.available():
        pytest.skip(f"no PipeDream profiles in {pipedream.profiles_dir()}: {pipedream.WHERE_FROM}")
    g = pipedream.load("alexnet")
    assert len(g.nodes) == 23 and g.batch_size == pipedream.DEFAULT_BATCH_SIZE
    best = hybridplan.plan(g, "dgx1-v100", devices=8)
    assert best.world_size == 8 and best.predicted["feasible"]


# ---- the paper's BigLSTM graph builder ----------------------------------------------------------

def test_biglstm_graph_is_valid_with_published_size():
    sys.path.insert(0, str(ROOT / "reproductions" / "pal2019"))
    try:
        import biglstm_graph
    finally:
        sys.path.pop(0)
    d = biglstm_graph.build_graph()
    g = Graph.from_dict(d, "biglstm")
    # Jozefowicz et al. 2016: about 1.8 billion parameters
    assert 1.7e9 < biglstm_graph.num_parameters(d) < 1.9e9
    lstm = next(n for n in g.nodes if n["name"] == "lstm_1")
    # 151 MFLOP per token x 128 x 20 tokens at 0.5 x 15.7 TFLOP/s
    assert lstm["forward_s"] == pytest.approx(151e6 * 2560 / 7.85e12, rel=0.01)


def _at_scale():
    """bench/bench_at_scale.py's decoders and clusters (a graph built from each shape)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("bench_at_scale",
                                                  ROOT / "bench" / "bench_at_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    preset = Cluster.load("dgx-h100").to_dict()
    for name, (layers, d, ffn, heads, vocab, seq, devices, nodes) in module.DECODERS.items():
        graph = module.decoder_graph(name, layers, d, ffn, heads, vocab, seq,
                                     preset["device"]["peak_flops"])
        cluster = dict(preset, num_nodes=nodes, name=f"dgx-h100-x{nodes}")
        job = {"schema_version": 1, "kind": "hybridplan.job", "samples_per_epoch": 1 << 20,
               "global_batch": 2 * devices, "optimizer": "adam"}
        yield name, graph, cluster, job


def test_decoders_that_do_not_fit_data_parallelism_get_a_sharded_plan():
    """A 7B decoder on 8 x 80 GB and a 70B one on 64: replicated data parallelism does not fit
    (Adam holds 4 x the parameters), the planner shards (and recomputes) and beats the best
    unsharded plan (at the 70B, one that only gradient accumulation makes fit)."""
    for name, graph, cluster, job in _at_scale():
        best = planner.search(graph, cluster, job, top_k=3).plans[0]
        assert best.sharding == "zero3", name
        assert best.predicted["feasible"]
        assert best.predicted["sharding_s"] > 0
        assert max(best.predicted["memory_bytes"]) <= cluster["device"]["memory_bytes"]
        assert "sharded zero3" in planner.explain(best, graph, cluster, job)
        # unsharded, only the model split over 4 or more devices fits (pipelines; with gradient
        # accumulation also a placement of each replica over 4 devices at the 7B, and at the
        # 70B a 32-stage pipeline whose 4 micro-steps keep 16 micro-batches in flight where
        # 64 would not fit), and it loses to the sharded plan
        replicated = planner.search(graph, cluster, job, top_k=50, shardings=["none"])
        assert all(p.mp >= 4 for p in replicated.plans), name
        assert all(p.mode == "pipeline" or p.accumulation_steps > 1 for p in replicated.plans)
        assert best.predicted["samples_per_s"] > replicated.plans[0].predicted["samples_per_s"]
        if name != "llama2-7b":  # without accumulation nothing unsharded fits the 70B
            with pytest.raises(InfeasibleError, match="no plan fits on 64 devices"):
                planner.search(graph, cluster, dict(job, accumulation_steps=1),
                               shardings=["none"])


def test_search_takes_tensor_degrees_and_tp_plans_count_their_processes(box):
    """search(..., tensor_degrees=) reaches the core (docs/tensor_parallel.md); a node whose
    max_degree tp does not divide runs whole (b here at tp = 4); num_processes counts tp."""
    d = diamond_dict()
    for node, degree in (("b", 2), ("c", 4)):
        n = next(x for x in d["nodes"] if x["name"] == node)
        n["tensor_parallel"] = {"style": "colwise", "max_degree": degree,
                                "split_param_bytes": 1000, "activation_split": True}
    g = Graph.from_dict(d)
    four = planner.search(g, box, top_k=3, tensor_degrees=[4])
    assert four.plans and all(p.tp == 4 for p in four.plans)
    for p in four.plans:
        assert p.num_processes == (p.dp * p.mp if p.mode == "pipeline" else p.dp) * 4
        assert p.world_size == p.dp * p.mp * p.tp
    assert all(p.tp == 1 for p in planner.search(g, box, tensor_degrees=[1]).plans)
    assert {p.tp for p in planner.search(g, box, top_k=50).plans} <= {1, 2, 4}
    assert planner.plan(g, box, tensor_degrees=[2]).tp == 2
    with pytest.raises(ValueError, match=r"tensor_degrees must list 1 or degrees that divide "
                                         r"devices_per_node = 4 and the max_degree of at least "
                                         r"one node with tensor_parallel \(here: 2, 4\) \(got 8\)"):
        planner.search(g, box, tensor_degrees=[8])
    with pytest.raises(ValueError, match="tensor_degrees entries must be an integer >= 1"):
        planner.search(g, box, tensor_degrees=[0])


def test_mixed_precision_job_prices_fp32_master_weights(box):
    """Job "precision" (the older "mixed_precision": true is "bf16"): an fp32 master copy and
    fp32 optimizer state beside the 16-bit parameters (docs/formats.md, Job); a float32 graph
    needs the device's measured compute_speedup to be priced in bf16."""
    d = diamond_dict()
    d["profiled"]["dtype"] = "bfloat16"
    g = Graph.from_dict(d)
    plan = hand_plan_dict(g)
    plain = Job.from_dict({"schema_version": 1, "kind": "hybridplan.job", "optimizer": "adam"})
    mixed = Job.from_dict(dict(plain.to_dict(), mixed_precision=True))
    assert mixed.to_dict()["precision"] == "bf16" and "precision" not in plain.to_dict()
    assert "mixed_precision" not in mixed.to_dict()
    a, b = planner.evaluate(g, box, plan, plain), planner.evaluate(g, box, plan, mixed)
    # 4000 B of bf16 parameters: Adam 4 x 4000 before, 2 x 4000 + 2 * (1 + 2) x 4000 with masters
    assert b["memory_bytes"][0] - a["memory_bytes"][0] == 8 * 4000 - 4 * 4000
    with pytest.raises(ValueError, match="device.compute_speedup.bf16 is needed to plan the "
                                         "job's precision"):
        planner.evaluate(Graph.from_dict(diamond_dict()), box, hand_plan_dict(
            Graph.from_dict(diamond_dict())), mixed)
    with pytest.raises(ValueError, match='precision must be one of "fp32", "bf16", "fp16"'):
        Job.from_dict(dict(plain.to_dict(), precision="half"), "job.json")
