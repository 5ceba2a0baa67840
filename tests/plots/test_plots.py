"""Partition and curve figures, and atomic figure saving."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from lightning_fed.plots import plot_client_accuracy, plot_label_histogram, plot_round_curves, save_figure

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _histogram(num_clients: int, num_classes: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, 50, (num_clients, num_classes), generator=generator)


def test_label_histogram_stacks_one_patch_per_client_and_class() -> None:
    fig = plot_label_histogram(_histogram(6, 4), class_names=["a", "b", "c", "d"])
    ax = fig.axes[0]
    assert len(ax.patches) == 6 * 4
    # The top of each client's stack is its total count.
    tops = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), patch.get_y() + patch.get_height())
    assert [tops[k] for k in range(6)] == _histogram(6, 4).sum(1).double().tolist()
    assert [text.get_text() for text in fig.legends[0].get_texts()] == ["a", "b", "c", "d"]


def test_label_histogram_draws_emd_on_secondary_axis_with_weighted_mean() -> None:
    histogram = torch.tensor([[10, 0], [0, 30]])
    emd = torch.tensor([1.0, 0.2])
    fig = plot_label_histogram(histogram, emd=emd)
    assert len(fig.axes) == 2
    (line,) = fig.axes[1].lines
    assert list(line.get_ydata()) == pytest.approx([1.0, 0.2])
    # (10·1.0 + 30·0.2) / 40 = 0.4
    assert "0.400" in fig.axes[0].get_title()


def test_label_histogram_mean_emd_ignores_empty_clients() -> None:
    histogram = torch.tensor([[10, 0], [0, 0], [0, 30]])
    fig = plot_label_histogram(histogram, emd=torch.tensor([1.0, float("nan"), 0.2]))
    assert "0.400" in fig.axes[0].get_title()


def test_label_histogram_truncates_many_clients_and_says_so() -> None:
    fig = plot_label_histogram(_histogram(30, 3), emd=torch.rand(30), max_clients=10)
    assert len(fig.axes[0].patches) == 10 * 3
    assert len(fig.axes[1].lines[0].get_xdata()) == 10
    assert "first 10" in fig.axes[0].get_title()


def test_label_histogram_omits_legend_for_many_classes() -> None:
    fig = plot_label_histogram(_histogram(3, 25))
    assert len(fig.axes[0].patches) == 3 * 25
    assert not fig.legends


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"histogram": torch.zeros(4)}, "histogram"),
        ({"histogram": -torch.ones(2, 2)}, "histogram"),
        ({"emd": torch.zeros(3)}, "emd"),
        ({"class_names": ["only one"]}, "class_names"),
        ({"max_clients": 0}, "max_clients"),
    ],
)
def test_label_histogram_rejects_bad_arguments(kwargs: dict, name: str) -> None:
    args = {"histogram": torch.ones(2, 2), **kwargs}
    with pytest.raises(ValueError, match=name):
        plot_label_histogram(**args)


def test_round_curves_one_line_per_key_skipping_missing_rounds() -> None:
    history = [
        {"round": 0, "train_loss": 2.0},
        {"round": 1, "train_loss": 1.5, "val_acc": 0.4},
        {"round": 2, "train_loss": 1.0},
        {"round": 3, "train_loss": 0.8, "val_acc": torch.tensor(0.7)},
    ]
    fig = plot_round_curves(history, ["train_loss", "val_acc"], title="run")
    ax = fig.axes[0]
    assert len(ax.lines) == 2
    assert list(ax.lines[0].get_xdata()) == [0, 1, 2, 3]
    assert list(ax.lines[1].get_xdata()) == [1, 3]
    assert list(ax.lines[1].get_ydata()) == pytest.approx([0.4, 0.7])
    assert ax.get_title() == "run"


def test_round_curves_reject_unknown_key_and_empty_keys() -> None:
    with pytest.raises(ValueError, match="val_accc"):
        plot_round_curves([{"round": 0, "val_acc": 0.5}], ["val_accc"])
    with pytest.raises(ValueError, match="keys"):
        plot_round_curves([{"round": 0, "val_acc": 0.5}], [])


def test_save_figure_writes_valid_png_atomically(tmp_path: Path) -> None:
    fig = plot_label_histogram(_histogram(8, 10), emd=torch.rand(8))
    target = tmp_path / "nested" / "dir" / "hist.png"
    returned = save_figure(fig, str(target), dpi=80)
    assert returned == target
    assert target.read_bytes()[:8] == _PNG_MAGIC
    with Image.open(target) as image:
        image.verify()
    with Image.open(target) as image:
        assert image.width > 200 and image.height > 150
    # Overwriting works too, and neither write leaves a temporary file behind.
    save_figure(plot_round_curves([{"round": 0, "a": 1.0}, {"round": 1, "a": 2.0}], ["a"]), target)
    assert sorted(p.name for p in target.parent.iterdir()) == ["hist.png"]


def test_save_figure_cleans_up_after_failed_render(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fig = plot_round_curves([{"round": 0, "a": 1.0}], ["a"])

    def broken_savefig(*_args, **_kwargs) -> None:
        raise RuntimeError("render failed")

    monkeypatch.setattr(fig, "savefig", broken_savefig)
    with pytest.raises(RuntimeError, match="render failed"):
        save_figure(fig, tmp_path / "curve.png")
    assert list(tmp_path.iterdir()) == []


def test_save_figure_rejects_unknown_suffix_and_bad_dpi(tmp_path: Path) -> None:
    fig = plot_round_curves([{"round": 0, "a": 1.0}], ["a"])
    with pytest.raises(ValueError, match="path"):
        save_figure(fig, tmp_path / "curve")
    with pytest.raises(ValueError, match="dpi"):
        save_figure(fig, tmp_path / "curve.png", dpi=0)
    assert list(tmp_path.iterdir()) == []


def test_label_histogram_axis_shows_the_tallest_stack() -> None:
    from lightning_fed.plots import plot_label_histogram

    histogram = torch.tensor([[5, 0, 1], [200, 150, 120], [3, 3, 3]])
    fig = plot_label_histogram(histogram, emd=torch.tensor([0.5, 0.2, 0.1]))
    assert fig.axes[0].get_ylim()[1] >= 470


def test_client_accuracy_draws_one_histogram_per_label() -> None:
    fig = plot_client_accuracy({"fedavg": [0.5, 0.7, 0.9], "fedamp": [0.8]}, title="clients", bins=10)
    violin_ax, hist_ax = fig.axes
    assert [label.get_text() for label in violin_ax.get_xticklabels()] == ["fedavg", "fedamp"]
    assert len(hist_ax.patches) == 2 * 10  # one bar per bin and label


@pytest.mark.parametrize(
    ("accuracies", "bins", "name"),
    [({}, 20, "accuracies"), ({"fedavg": []}, 20, "accuracies"), ({"fedavg": [0.5]}, 0, "bins")],
)
def test_client_accuracy_rejects_bad_arguments(accuracies: dict, bins: int, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        plot_client_accuracy(accuracies, bins=bins)
