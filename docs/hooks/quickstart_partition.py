"""Draws docs/assets/quickstart-partition.png: the quickstart's partition, as its run writes it to ``partition.png``.

The quickstart's datamodule is built from ``configs/quickstart.yaml`` by the CLI's own parser, set up, and its label
histogram and per-client EMD drawn with the plot every fit logs (``partition/label_histogram``). Nothing trains.
Run from the repository root: ``python docs/hooks/quickstart_partition.py``.
"""

from pathlib import Path

from lightning_fed.cli.main import FederatedCLI
from lightning_fed.plots import plot_label_histogram
from lightning_fed.plots.io import save_figure

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "assets" / "quickstart-partition.png"


def main() -> None:
    cli = FederatedCLI(
        args=["--config", str(ROOT / "configs" / "quickstart.yaml"), "--trainer.logger", "false"], run=False
    )
    datamodule = cli.datamodule
    datamodule.setup("fit")
    figure = plot_label_histogram(datamodule.label_histogram(), datamodule.client_emd())
    print(save_figure(figure, OUT, dpi=80))


if __name__ == "__main__":
    main()
