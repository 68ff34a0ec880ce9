"""End to end: profile a built-in model, let the planner choose (hybridplan.search on the
localhost-cpu preset), apply the chosen plans together with the profiled graph (so the graph
hash is checked), and train: the result equals single-process training."""

import pytest
import torch

from dist_harness import format_results, run_ranks
from test_executor_training import GLOBAL_BATCH, assert_states_close, build, reference_state

planner = pytest.importorskip(
    "hybridplan.planner", reason="needs the compiled planner hybridplan._C (make build)")


def test_planner_plans_train_like_one_process(tmp_path):
    import hybridplan
    name = "gnmt_lstm"
    model = build(name)
    graph = hybridplan.profile(model, model.example_inputs(GLOBAL_BATCH), warmup=1, repeats=2,
                               verbose=False)
    chosen = {}
    # localhost-cpu's devices are CPU ranks, where the planner never offers placement MP (one
    # process would run the devices' work one after another); a GPU preset's placement plan on
    # 2 devices applies the same way here, each device's part running on this CPU
    for mode, cluster in (("pipeline", "localhost-cpu"), ("placement", "dgx1-v100")):
        found = hybridplan.search(graph, cluster, None, devices=2, top_k=10,
                                  modes=[mode]).plans
        # the best plan of this mode that really splits the model (mp=1 is mode-agnostic DP)
        best = next((p for p in found if p.mp == 2 and p.mode == mode), None)
        assert best is not None, f"search returned no {mode} plan with mp=2: {found}"
        assert best.dp * best.per_replica_batch == GLOBAL_BATCH
        chosen[mode] = best
    cases = [{"name": name, "plan": p.to_dict(), "graph": graph.to_dict(),
              "case_id": f"planned-{mode}"} for mode, p in chosen.items()]
    worlds = [p.dp * p.mp if p.mode == "pipeline" else p.dp for p in chosen.values()]
    for case, world in zip(cases, worlds):  # pipeline: dp*mp processes; placement: dp
        results = run_ranks("test_executor_training:train_cases", world,
                            {"cases": [case], "out_dir": str(tmp_path)}, timeout_s=240)
        assert all(r.returncode == 0 for r in results), format_results(results)
    expected = reference_state(name)
    for case, world in zip(cases, worlds):
        for rank in range(world):
            out = torch.load(tmp_path / f"{case['case_id']}.rank{rank}.pt")
            assert_states_close(out["state"], expected, rtol=1e-5, atol=1e-6)
