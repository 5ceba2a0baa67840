"""The federated part of a module: the default, the module's declarations, the trainer's override, the refusals, and
the frozen base's fingerprint."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_fed.functional.federated_state import (
    base_fingerprint,
    federated_keys,
    federated_state,
    first_base_difference,
    frozen_state,
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


def _frozen_trunk() -> nn.Module:
    model = _model()
    model[0].requires_grad_(False)
    return model


def test_a_model_that_trains_everything_is_federated_whole():
    model = _model()
    assert federated_keys(model) == list(model.state_dict())
    live = federated_state(model)
    # Live tensors: loading into them loads the module.
    assert all(live[name] is tensor for name, tensor in model.state_dict(keep_vars=True).items())
    assert frozen_state(model, live) == {}


def test_frozen_parameters_are_the_base_and_buffers_stay_federated():
    model = _frozen_trunk()
    keys = federated_keys(model)
    assert "0.weight" not in keys and "0.bias" not in keys
    # BatchNorm's statistics change in training: federated, num_batches_tracked included.
    assert {"1.running_mean", "1.running_var", "1.num_batches_tracked", "3.weight"} <= set(keys)
    assert set(frozen_state(model, keys)) == {"0.weight", "0.bias"}


def test_a_module_declares_its_part_by_patterns_or_by_method():
    model = _frozen_trunk()
    model.federated_keys = ["3.*", "1.*"]  # type: ignore[assignment]
    assert federated_keys(model) == ["1.weight", "1.bias", "1.running_mean", "1.running_var", "1.num_batches_tracked",
                                     "3.weight", "3.bias"]  # fmt: skip

    class Declared(nn.Sequential):
        def federated_state_dict(self):
            return {k: v for k, v in self.state_dict().items() if not k.startswith("0.")}

    declared = Declared(*_frozen_trunk())
    declared[0].requires_grad_(False)
    assert "0.weight" not in federated_keys(declared) and "1.running_mean" in federated_keys(declared)


def test_the_trainer_setting_overrides_the_module():
    model = _frozen_trunk()
    model.federated_keys = ["nothing-like-this"]  # type: ignore[assignment]
    # The trainer's patterns win: the module's (wrong) declaration is not even read.
    assert federated_keys(model, ["1.weight", "1.bias", "3.*"]) == ["1.weight", "1.bias", "3.weight", "3.bias"]
    # A frozen tensor may be federated on purpose.
    assert "0.weight" in federated_keys(model, ["0.*", "1.weight", "1.bias", "3.*"])


def test_a_declaration_is_refused_in_one_line():
    model = _frozen_trunk()
    with pytest.raises(ValueError, match=r"FederatedTrainer\(federated_keys=...\): the pattern 'x\.\*' matches no"):
        federated_keys(model, ["3.*", "1.*", "x.*"])
    with pytest.raises(ValueError, match="leaves out the trainable parameter '1.weight'"):
        federated_keys(model, ["3.*"])
    model.federated_keys = "3.*"  # type: ignore[assignment]
    with pytest.raises(ValueError, match=r"must be a list of glob patterns.*write \['3\.\*'\]"):
        federated_keys(model)
    with pytest.raises(ValueError, match="has no federated state"):
        federated_keys(nn.Linear(2, 2).requires_grad_(False))


def test_the_base_fingerprint_names_the_first_tensor_that_differs():
    a, b = _frozen_trunk(), _frozen_trunk()
    keys = federated_keys(a)
    fa, fb = base_fingerprint(a, keys), base_fingerprint(b, keys)
    assert fa == fb and first_base_difference(fa, fb) is None
    assert set(fa.tensors) == {"0.weight", "0.bias"}
    with torch.no_grad():
        b[0].bias.add_(1e-7)
    fb = base_fingerprint(b, keys)
    assert fa.digest != fb.digest
    assert first_base_difference(fa, fb) == "'0.bias' differs"
    # The federated part is no part of the base: training it leaves the fingerprint alone.
    with torch.no_grad():
        a[3].weight.mul_(2)
    assert base_fingerprint(a, keys) == fa
    assert first_base_difference(fa, base_fingerprint(nn.Sequential(), [])) == "'0.weight' is missing"
    # Plain values: what a checkpoint and a message carry.
    assert type(fa).from_dict(fa.to_dict()) == fa
