"""Pure tensor math, tested against reference formulas in isolation."""

from lightning_fed.functional.partition_stats import (
    class_distribution,
    earth_movers_distance,
    label_histogram,
    mean_emd,
)

__all__ = [
    "class_distribution",
    "earth_movers_distance",
    "label_histogram",
    "mean_emd",
]
