"""Deprecated names warn in a way a CLI user sees."""

import subprocess
import sys


def test_deprecations_are_shown_outside_main():
    # Python's default filters hide DeprecationWarning raised in library code, so a CLI user would never see it.
    code = (
        "from lightning_fed.datamodules.partitioners import DirichletPartitioner as D; D(4, 0.5, partition_by='class')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "LightningFedDeprecationWarning" in result.stderr and "proportions" in result.stderr
