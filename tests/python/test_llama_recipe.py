"""The training step people expect, all at once, on 2 ranks (bench/bench_llama_recipe.py's
reduced form; its 4-rank, 50-step run is benchmarks/llama-recipe-2026-12-06.md): a Llama from a
Hugging Face config (vocabulary 1,003, hidden 36, MLP 92: widths 8 does not divide) planned by
hybridplan.parallelize for a bf16 job of a global batch of 16 in 2 accumulation steps, trained
with clip_grad_norm=1.0 and warmup_cosine, against one process in the same policy on the same
global batch with torch's clip_grad_norm_ and the same scheduler.

Tolerances (docs/training_step.md "Precision"; bench_llama_recipe.compare says why): each
step's loss on the global batch within 4u x the reference's (u = 2^-8, bf16's unit roundoff),
the first step's norm within 4u relative of torch's clip_grad_norm_, the gradients' norm after
each step's clipping min(norm, 1.0) within 1e-5, the learning rates equal; bfloat16 among the
tensors autograd saved on every rank (the loss bound alone does not tell bf16 from fp32 at
this size).
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench")

STEPS, GLOBAL_BATCH, ACCUMULATION, WORLD = 6, 16, 2, 2


def _recipe():
    if BENCH not in sys.path:
        sys.path.insert(0, BENCH)
    import bench_llama_recipe
    return bench_llama_recipe


def recipe_rank(out_dir, cluster):
    """One rank (dist_harness): parallelize, STEPS steps, results saved to out_dir."""
    # a short profile: the plan at this size is dp=2 whatever the node times
    _recipe().train_rank(STEPS, cluster, out_dir, GLOBAL_BATCH, ACCUMULATION, verbose=False,
                         profile_options={"warmup": 1, "repeats": 3, "batch_sizes": []})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    pytest.importorskip("hybridplan.planner",
                        reason="needs the compiled planner hybridplan._C (make build)")
    pytest.importorskip("transformers", reason="scripts/install-deps.sh installs transformers")
    import torch
    from dist_harness import format_results, run_ranks
    r = _recipe()
    out_dir = str(tmp_path_factory.mktemp("llama_recipe"))
    # any bf16 compute_speedup lets the search price the job (the bench measures it); the
    # plan chosen at this size is dp=2 whatever the figure
    cluster = r.speedup_cluster(speedup=0.6)
    results = run_ranks("test_llama_recipe:recipe_rank", WORLD,
                        {"out_dir": out_dir, "cluster": cluster}, timeout_s=300)
    assert all(x.returncode == 0 for x in results), format_results(results)
    outs = [torch.load(os.path.join(out_dir, f"rank{k}.pt"), weights_only=False)
            for k in range(WORLD)]
    plan = outs[0]["plan"]
    ref = r.reference(STEPS, outs[0]["global_batch"], plan.get("precision", "fp32"),
                      r.fsdp_policy(plan))
    return outs, ref, r.compare(outs, ref)


def test_the_plan_is_bf16_with_two_accumulation_steps(trained):
    outs, _, _ = trained
    for out in outs:
        assert out["plan"]["precision"] == "bf16", out["plan"]
        assert out["plan"].get("accumulation_steps") == ACCUMULATION, out["plan"]
        assert out["accumulation_steps"] == ACCUMULATION
        assert out["global_batch"] == GLOBAL_BATCH
        assert "torch.bfloat16" in out["saved"], out["saved"]
        assert len(out["global_losses"]) == STEPS


def test_llama_recipe_trains_like_one_process_within_bf16_rounding(trained):
    outs, ref, c = trained
    r = _recipe()
    losses, norms, _, _, _ = ref
    assert losses[-1] < losses[0] - 0.3, losses  # it trained
    assert c["clipped"] >= 1, norms  # clipping at 1.0 scaled some steps
    for step, got, want, diff, tol in c["rows"]:
        assert diff <= tol, (f"step {step}: loss {got:.6f} on {WORLD} ranks, {want:.6f} in one "
                             f"process (tolerance {tol:.3g})")
    assert c["first_norm"] <= r.TOLERANCE, ([o["norms"] for o in outs], norms)
    assert c["clip_rel"] <= 1e-5, ([o["norms"] for o in outs], [o["clipped"] for o in outs])
    assert c["lr_rel"] <= 1e-12, ([o["lrs"] for o in outs], ref[2])
    assert c["ranks_agree"]
    assert c["ok"]
