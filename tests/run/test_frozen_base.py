"""The frozen base in a run's bookkeeping: held once (the checkpoint's client state is the federated part only, so a
personalised run's checkpoint grows by the trainable part per client), fingerprinted, and a resume with another base
is refused in one line naming the first tensor that differs."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from helpers.boring import BigTrunkClassifier, FrozenTrunkClassifier, fast_trainer, make_datamodule
from torch import nn

from lightning_fed.callbacks import FedAMP
from lightning_fed.run.resume import ResumeError


class BaseLoadedApart(FrozenTrunkClassifier):
    """A module that keeps its pretrained base out of its checkpoints and loads it itself (as a PEFT model's adapters
    are saved without the base): Lightning restores the federated part only."""

    strict_loading = False

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        for key in self.FROZEN:
            checkpoint["state_dict"].pop(key)


def _load_base(module: nn.Module, seed: int) -> nn.Module:
    """Writes the 'pretrained' trunk drawn from ``seed`` into the module."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in module.net[0].parameters():
            tensor.copy_(torch.randn(tensor.shape, generator=generator))
    return module


def _fit(root, base_seed: int, num_rounds: int, ckpt_path=None):
    trainer = fast_trainer(root, num_rounds=num_rounds, seed=0, enable_checkpointing=True, limit_val_batches=0)
    torch.manual_seed(0)
    module = _load_base(BaseLoadedApart(), base_seed)
    trainer.fit(module, datamodule=make_datamodule(), ckpt_path=ckpt_path)
    return trainer, module


def test_a_resume_with_another_base_is_refused_naming_the_tensor(tmp_path):
    first, _ = _fit(tmp_path, base_seed=0, num_rounds=1)
    saved = first.federated_checkpoint()["base"]
    assert set(saved["tensors"]) == set(FrozenTrunkClassifier.FROZEN)
    with pytest.raises(ResumeError) as refused:
        _fit(tmp_path, base_seed=1, num_rounds=2, ckpt_path="last")
    message = str(refused.value)
    assert "'net.0.weight' differs" in message and "frozen base" in message and "\n" not in message
    # The same base resumes.
    resumed, module = _fit(tmp_path, base_seed=0, num_rounds=2, ckpt_path="last")
    assert resumed.federation_state.completed_rounds == 2
    assert torch.equal(module.net[0].weight, _load_base(BaseLoadedApart(), 0).net[0].weight)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_fedamp_checkpoint_holds_the_model_once_and_the_trainable_part_per_client(tmp_path):
    num_clients = 8
    torch.manual_seed(0)
    module = BigTrunkClassifier()
    trainer = fast_trainer(
        tmp_path,
        num_rounds=1,
        clients_per_round=num_clients,
        seed=0,
        enable_checkpointing=True,
        limit_val_batches=0,
        callbacks=[FedAMP(alpha_k=0.1, lam=1.0, sigma=2.0, heatmap_every_n_rounds=0)],
    )
    trainer.fit(module, datamodule=make_datamodule(num_clients=num_clients, num_samples=160))
    (checkpoint,) = (trainer.fed_run_dir / "checkpoints").glob("last*.ckpt")
    model = _nbytes(module.state_dict().values())
    trainable = _nbytes(p for p in module.parameters() if p.requires_grad)
    assert trainable * 100 < model  # a big frozen trunk, a small trainable part
    size = checkpoint.stat().st_size
    # The model once (its state_dict) and each client's personal model of the trainable part; 10 % for the rest
    # (FedAMP's w_0, the optimizer, the loops, the fingerprints). With whole-model client state it was ~9 models.
    assert size <= 1.1 * (model + num_clients * trainable), (size, model, trainable)


def test_the_trainer_setting_decides_the_federated_part_and_defines_the_experiment(tmp_path):
    from lightning_fed.run.fingerprint import experiment_fingerprint

    weights = []
    for federated_keys in (None, ["net.1.*", "net.4.*"], ["net.0.*", "net.1.*", "net.4.*"]):
        trainer = fast_trainer(tmp_path / str(len(weights)), num_rounds=2, seed=0, federated_keys=federated_keys)
        torch.manual_seed(0)
        module = FrozenTrunkClassifier()
        trainer.fit(module, datamodule=make_datamodule())
        live = trainer.fed_runner.live
        assert ("net.0.weight" in live) == (federated_keys is not None and "net.0.*" in federated_keys)
        fingerprint = experiment_fingerprint(trainer, module, None)
        assert fingerprint.get("trainer.federated_keys") == federated_keys
        weights.append(module.state_dict())
    # Whether the frozen trunk travels or not, the run is the same: it never changes.
    for other in weights[1:]:
        for key, value in weights[0].items():
            assert torch.equal(other[key], value), key
