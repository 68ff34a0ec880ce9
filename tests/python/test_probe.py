"""The link probe: the alpha-beta fit, and a real 2-rank Gloo run on loopback."""

import json
import os
import subprocess
import sys

import pytest

from hybridplan.measure.fitting import fit_line
from hybridplan.measure.probe import fit_alpha_beta, probe
from hybridplan.net import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_fit_recovers_alpha_and_beta():
    # t = 5 us + bytes / 1 GB/s, exactly
    sizes = [1e3, 1e4, 1e5, 1e6]
    alpha, beta = fit_alpha_beta(sizes, [5e-6 + s / 1e9 for s in sizes])
    assert alpha == pytest.approx(5e-6, rel=1e-9, abs=0)
    assert 1 / beta == pytest.approx(1e9, rel=1e-9)


def test_fit_least_squares_on_noisy_points():
    # (MB, us): (0, 3), (1, 4), (2, 9), (3, 10); means 1.5 MB, 6.5 us; deviations dx = -1.5,
    # -0.5, 0.5, 1.5 and dt = -3.5, -2.5, 2.5, 3.5; slope = sum(dx dt) / sum(dx^2) = 13 / 5
    # = 2.6 us/MB; intercept = 6.5 - 2.6 * 1.5 = 2.6 us
    sizes = [0, 1e6, 2e6, 3e6]
    times = [3e-6, 4e-6, 9e-6, 10e-6]
    alpha, beta = fit_alpha_beta(sizes, times, relative=False)
    assert beta == pytest.approx(2.6e-12, rel=1e-9, abs=0)
    assert alpha == pytest.approx(2.6e-6, rel=1e-9, abs=0)


def test_relative_fit_keeps_small_messages_right():
    # 100 us latency, 1 GB/s, and the 100 MB message 5 % fast (noise, 5 ms: fifty latencies):
    # plain least squares lets that point move the intercept by 14 %; the relative fit keeps
    # every size within 3 %.
    sizes = [1e3, 1e4, 1e5, 1e6, 1e8]
    times = [1e-4 + s / 1e9 for s in sizes]
    times[-1] *= 0.95
    plain = fit_line(sizes, times, relative=False)
    rel = fit_line(sizes, times)
    assert abs(plain.predict(1e3) / times[0] - 1) > 0.1
    assert abs(rel.predict(1e3) / times[0] - 1) < 0.03
    assert rel.worst_relative_error < 0.03


def test_fit_negative_intercept_refits_through_origin():
    alpha, beta = fit_alpha_beta([1e3, 2e3], [0.5e-6, 2e-6], relative=False)  # crosses at -1 us
    assert alpha == 0.0
    assert beta == pytest.approx((1e3 * 0.5e-6 + 2e3 * 2e-6) / (1e6 + 4e6), rel=1e-9, abs=0)


def test_fit_bad_input():
    with pytest.raises(ValueError, match="at least two distinct message sizes"):
        fit_alpha_beta([1e3, 1e3], [1e-6, 2e-6])
    with pytest.raises(ValueError, match="times do not grow with message size"):
        fit_alpha_beta([1e3, 1e6], [2e-3, 1e-3])


def test_fit_that_cannot_resolve_a_bandwidth_says_so_instead_of_failing():
    # What a busy machine gave once: 1 KB 3.7 ms, 64 KB 3.2 ms, 4 MB 3.0 ms (noise dominates).
    sizes, times = [1e3, 64e3, 4e6], [3.7e-3, 3.2e-3, 3.0e-3]
    fit = fit_line(sizes, times)
    assert not fit.resolved and "do not grow with size" in fit.note
    assert fit.alpha == pytest.approx(3.2e-3)            # the median time
    assert fit.beta == pytest.approx(3.0e-3 / 4e6)       # an upper bound of the per-byte cost
    resolved = fit_line([1e3, 1e4, 1e5, 1e6], [5e-6 + s / 1e9 for s in (1e3, 1e4, 1e5, 1e6)])
    assert resolved.resolved and resolved.r2 == pytest.approx(1.0)
    assert resolved.rmse_s == pytest.approx(0, abs=1e-15)


def test_probe_outside_torchrun_says_how_to_run_it(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="run under torchrun"):
        probe(sizes_bytes=[1024, 4096])


def test_two_rank_probe_writes_a_cluster(tmp_path):
    out = tmp_path / "cluster.json"
    sizes = [1024, 65536, 4 << 20]  # up to 4 MiB: transfer time well above a busy host's jitter
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), GLOO_SOCKET_IFNAME="lo",
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
           "-m", "hybridplan", "probe", "--out", str(out), "--sizes",
           ",".join(map(str, sizes)), "--warmup", "1", "--repeats", "5", "--timeout-s", "20",
           "--name", "test-loopback"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    cluster = json.loads(out.read_text())
    assert cluster["kind"] == "hybridplan.cluster" and cluster["schema_version"] == 1
    assert cluster["name"] == "test-loopback"
    assert (cluster["num_nodes"], cluster["devices_per_node"]) == (1, 2)
    for level in ("intra_node", "inter_node"):
        assert cluster[level]["latency_s"] >= 0
        assert cluster[level]["bandwidth_bytes_per_s"] > 0
    assert cluster["device"]["memory_bytes"] > 0 and cluster["device"]["peak_flops"] > 1e6
    measured = cluster["measured"]
    assert [p[0] for p in measured["allreduce_s"]] == sizes
    assert [p[0] for p in measured["intra_node_one_way_s"]] == sizes
    # each fit reports its residuals and whether it resolved a bandwidth (never a failed run)
    assert set(measured["fits"]) == {"intra_node", "allreduce"}
    assert all("rmse_s" in f and "resolved" in f for f in measured["fits"].values())
    assert "inter_node not measured" in " ".join(cluster["sources"])
    assert os.listdir(tmp_path) == ["cluster.json"]  # the atomic write left no temporary file
    try:
        from hybridplan.planner import Cluster
    except ImportError:
        return  # the compiled planner is not built: the format checks above still ran
    assert Cluster.from_dict(cluster).devices_per_node == 2
