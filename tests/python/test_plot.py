"""hybridplan.plot: speedups from a hand-written sweep (arithmetic in comments) and the PNG."""

import json

import pytest

from hybridplan import plot


def _s(dp, mp, ttt, sps=100.0):
    return {"dp": dp, "mp": mp, "mode": "placement", "global_batch": 64 * dp,
            "step_s": 0.1, "time_to_train_s": ttt, "samples_per_s": sps}


SWEEP = [
    {"devices": 1, "dp_only": _s(1, 1, 100.0), "best": _s(1, 1, 100.0)},
    {"devices": 2, "dp_only": _s(2, 1, 60.0), "best": _s(1, 2, 50.0)},
    {"devices": 4, "dp_only": None, "best": _s(2, 2, 25.0)},
]


def test_speedups_over_one_device():
    base, rows = plot.speedups(SWEEP)
    assert base == 1
    assert rows[0] == (1, 1.0, 1.0)
    assert rows[1][1] == pytest.approx(100.0 / 60.0)  # DP only: 100 s -> 60 s
    assert rows[1][2] == pytest.approx(2.0)           # hybrid: 100 s -> 50 s
    assert rows[2] == (4, None, pytest.approx(4.0))   # DP does not fit on 4


def test_speedups_without_convergence_use_samples_per_s():
    sweep = [{"devices": 1, "dp_only": _s(1, 1, 0, 100.0), "best": _s(1, 1, 0, 100.0)},
             {"devices": 2, "dp_only": _s(2, 1, 0, 150.0), "best": _s(1, 2, 0, 180.0)}]
    _, rows = plot.speedups(sweep)
    assert rows[1][1] == pytest.approx(1.5)  # 150 / 100 samples/s
    assert rows[1][2] == pytest.approx(1.8)


def test_base_is_smallest_feasible_device_count():
    sweep = [{"devices": 1, "dp_only": None, "best": None}] + SWEEP[1:]
    base, rows = plot.speedups(sweep)
    assert base == 2
    assert rows[1][2] == pytest.approx(1.0)
    assert rows[2][2] == pytest.approx(2.0)  # 50 s -> 25 s


def test_nothing_feasible_is_an_error():
    with pytest.raises(ValueError, match="no device count has a feasible plan"):
        plot.speedups([{"devices": 1, "dp_only": None, "best": None}])


def test_main_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    data = tmp_path / "sweep.json"
    data.write_text(json.dumps(SWEEP))
    out = tmp_path / "speedup.png"
    assert plot.main([str(data), "--out", str(out), "--title", "t"]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    bad = tmp_path / "bad.json"
    bad.write_text("[{\"devices\": 1}]")
    assert plot.main([str(bad), "--out", str(out)]) == 2


def test_speedup_axes_are_log_log():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    fig = plot.figure(SWEEP)
    ax = fig.axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    plt.close(fig)
