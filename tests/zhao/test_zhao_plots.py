import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "zhao_plots.py"
_spec = importlib.util.spec_from_file_location("zhao_plots", _SCRIPT)
zhao_plots = importlib.util.module_from_spec(_spec)
# Dataclasses look their module up in sys.modules while the script is executed.
sys.modules["zhao_plots"] = zhao_plots
_spec.loader.exec_module(zhao_plots)


def _write(
    root: Path, name: str, emd: float, acc: float, history_extra: dict | None = None, config: str | None = None
) -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    first = {"round": 1.0, "global/test_acc": acc / 2, **(history_extra or {})}
    history = [first, {"round": 2.0, "global/test_acc": acc}]
    summary = {"mean_emd": emd, "final": history[-1], "history": history, "run_dir": str(run_dir)}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    if config is not None:
        (run_dir / "config.yaml").write_text(config)
    return run_dir / "summary.json"


def test_accuracy_vs_emd_groups_runs_by_level_with_mean_and_std(tmp_path):
    _write(tmp_path, "emd0_s0", 0.001, 0.80)
    _write(tmp_path, "emd0_s1", 0.004, 0.84)
    _write(tmp_path, "emd18_s0", 1.8, 0.50)
    out = tmp_path / "plots"
    points = zhao_plots.main([str(tmp_path / "emd*"), "--out-dir", str(out)])
    (x0, mean0, std0, n0), (x1, mean1, std1, n1) = points["emd"]
    assert (x0, n0, x1, n1) == (0.0, 2, 1.8, 1)
    assert mean0 == pytest.approx(0.82) and std0 == pytest.approx(math.sqrt(0.0008))  # sample std of 0.80, 0.84
    assert (mean1, std1) == (pytest.approx(0.50), 0.0)
    assert (out / "accuracy_vs_emd.png").stat().st_size > 0
    assert not (out / "accuracy_vs_beta.png").exists()  # no run has a beta
    assert json.loads((out / "zhao_points.json").read_text())["emd"][0][1] == pytest.approx(0.82)


def test_plot_series_draws_one_point_per_level():
    fig = zhao_plots.plot_series({"a": [(0.0, 0.8, 0.01, 2), (1.8, 0.5, 0.0, 1)]}, "EMD", "acc", "t")
    (line,) = fig.axes[0].get_lines()[:1]
    assert list(line.get_xdata()) == [0.0, 1.8] and list(line.get_ydata()) == [0.8, 0.5]


def test_beta_from_history_key_directory_name_config_and_label(tmp_path):
    _write(tmp_path, "logged", 1.8, 0.60, history_extra={"sharing/beta": 0.05, "sharing/alpha": 0.5})
    _write(tmp_path, "beta0.1_alpha0.5", 1.8, 0.70)
    _write(tmp_path, "from_config", 1.8, 0.40, config="data:\n  init_args:\n    partitioner: {}\n")
    _write(tmp_path, "mystery", 1.8, 0.65)
    out = tmp_path / "plots"
    points = zhao_plots.main(
        [str(tmp_path / "*"), "--out-dir", str(out), "--label", "*mystery*=beta=0.2", "--label", "*mystery*=alpha=0.5"]
    )
    # The config without a sharing section is beta = 0; alpha unknown there, so it is its own series.
    assert points["beta"]["alpha=0.5"] == [(0.05, 0.60, 0.0, 1), (0.1, 0.70, 0.0, 1), (0.2, 0.65, 0.0, 1)]
    assert points["beta"][""] == [(0.0, 0.40, 0.0, 1)]
    assert (out / "accuracy_vs_beta.png").stat().st_size > 0


def test_bad_inputs_name_what_to_change(tmp_path):
    with pytest.raises(FileNotFoundError, match="matches no summary.json"):
        zhao_plots.main([str(tmp_path / "nothing*"), "--out-dir", str(tmp_path)])
    _write(tmp_path, "run", 0.0, 0.5)
    with pytest.raises(ValueError, match="--metric"):
        zhao_plots.main([str(tmp_path / "run"), "--metric", "global/missing", "--out-dir", str(tmp_path)])
    with pytest.raises(SystemExit):
        zhao_plots.main([str(tmp_path / "run"), "--label", "beta=0.1"])
