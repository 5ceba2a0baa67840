"""Renamed modules keep their old import path for one release, with a warning a CLI user sees."""

import importlib
import subprocess
import sys

import pytest

from lightning_fed.deprecation import LightningFedDeprecationWarning


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("lightning_fed.state", "lightning_fed.federation_state", "FederationState"),
        ("lightning_fed.store", "lightning_fed.client_store", "ClientStateStore"),
        ("lightning_fed.validation", "lightning_fed.setup_checks", "check_round_settings"),
    ],
)
def test_old_module_warns_and_reexports(monkeypatch, old, new, name):
    monkeypatch.delitem(sys.modules, old, raising=False)
    with pytest.warns(LightningFedDeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


def test_deprecations_are_shown_outside_main():
    # Python's default filters hide DeprecationWarning raised in library code, so a CLI user would never see it.
    code = (
        "from lightning_fed.datamodules.partitioners import DirichletPartitioner as D; D(4, 0.5, partition_by='class')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "LightningFedDeprecationWarning" in result.stderr and "proportions" in result.stderr
