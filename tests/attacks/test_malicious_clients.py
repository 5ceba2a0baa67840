"""MaliciousClients in real rounds: who attacks, what each attack sends, what the aggregate becomes, resume, reports."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch
from helpers.boring import BoringClassifier, fast_trainer, make_datamodule
from helpers.resume import assert_resume_bit_identical

from lightning_fed import FedCallback
from lightning_fed.aggregators import FedAvg
from lightning_fed.attacks import MaliciousClients, choose_malicious
from lightning_fed.checks import InvalidArgumentError
from lightning_fed.functional.attacks import alie_update, alie_z

NUM_CLIENTS = 6


def _clone(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in state.items()}


class UpdateRecorder(FedCallback):
    """Placed after MaliciousClients: each client's update before and after the attack, and each round's models."""

    def __init__(self) -> None:
        self.rounds: dict[int, dict[str, Any]] = {}
        self.honest: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self.sent: dict[tuple[int, int], dict[str, torch.Tensor]] = {}

    def on_round_start(self, trainer, pl_module, round_ctx):
        self.rounds[round_ctx.round_idx] = {
            "global": _clone(round_ctx.global_params),
            "clients": list(round_ctx.client_ids),
            "num_samples": dict(round_ctx.num_samples),
        }

    def on_client_end(self, trainer, pl_module, client_ctx, update):
        key = (client_ctx.round_idx, update.client_id)
        self.honest[key] = _clone(update.params)
        self.sent[key] = self.honest[key]

    def on_clients_end(self, trainer, pl_module, round_ctx, held):
        for update in held:
            self.sent[(round_ctx.round_idx, update.client_id)] = _clone(update.params)

    def on_aggregate(self, trainer, pl_module, round_ctx, new_params):
        self.rounds[round_ctx.round_idx]["new"] = _clone(new_params)


def _run(
    tmp_path, attack: MaliciousClients | None, *, rounds: int = 2, clients_per_round: int = 4, lr: float = 0.1, **kwargs
):
    torch.manual_seed(0)
    module = BoringClassifier(lr=lr, batch_norm=True)
    recorder = UpdateRecorder()
    callbacks = [attack, recorder] if attack is not None else [recorder]
    num_clients = kwargs.pop("num_clients", NUM_CLIENTS)
    trainer = fast_trainer(
        tmp_path,
        num_rounds=rounds,
        clients_per_round=clients_per_round,
        callbacks=callbacks,
        aggregator=kwargs.pop("aggregator", FedAvg()),
        run_dir=str(tmp_path / "run"),
        **kwargs,
    )
    trainer.fit(module, datamodule=make_datamodule(num_clients=num_clients, val_fraction=0.1))
    return trainer, recorder


def _trainable(module: torch.nn.Module) -> list[str]:
    return [name for name, p in module.named_parameters()]


def _expected_deltas(attack: MaliciousClients, recorder: UpdateRecorder, round_idx: int, malicious: list[int]):
    """The attacked Δ' of each malicious client of the round, transcribed from the attack's definition."""
    info = recorder.rounds[round_idx]
    g, n = info["global"], len(info["clients"])
    names = _trainable(BoringClassifier(batch_norm=True))
    attackers = [cid for cid in info["clients"] if cid in malicious]
    deltas = {cid: {k: recorder.honest[(round_idx, cid)][k] - g[k] for k in names} for cid in attackers}
    if attack.attack == "sign_flip":
        s = attack.scale or 1.0
        return {cid: {k: -s * d[k] for k in names} for cid, d in deltas.items()}
    if attack.attack == "scale":
        gamma = attack.scale or n / 1.0  # n / eta, FedAvg's server_lr = 1
        return {cid: {k: gamma * d[k] for k in names} for cid, d in deltas.items()}
    assert attack.attack == "alie"
    ordered = [deltas[cid] for cid in attackers]
    shared = alie_update(ordered, alie_z(n, len(ordered)))
    return dict.fromkeys(attackers, shared)


@pytest.mark.parametrize(
    "attack",
    [
        MaliciousClients(0.5, "sign_flip"),
        MaliciousClients(0.5, "sign_flip", scale=3.0),
        MaliciousClients(0.5, "scale"),
        MaliciousClients(0.5, "alie"),
    ],
    ids=["sign_flip", "sign_flip_s3", "scale", "alie"],
)
def test_update_attacks_send_the_formula_and_fedavg_averages_what_was_sent(tmp_path, attack):
    trainer, recorder = _run(tmp_path, attack)
    malicious = choose_malicious(trainer.federation_state.seed, NUM_CLIENTS, 0.5)
    assert len(malicious) == 3
    names = set(_trainable(trainer.lightning_module))
    attacked_somewhere = False
    for round_idx, info in recorder.rounds.items():
        g = info["global"]
        expected = _expected_deltas(attack, recorder, round_idx, malicious)
        attacked_somewhere |= bool(expected)
        for cid in info["clients"]:
            honest, sent = recorder.honest[(round_idx, cid)], recorder.sent[(round_idx, cid)]
            for key, value in sent.items():
                if cid in expected and key in names:
                    torch.testing.assert_close(value, g[key] + expected[cid][key], rtol=1e-5, atol=1e-6)
                else:  # honest clients, and every buffer (integer ones too) of the attackers, go out as trained
                    assert torch.equal(value, honest[key]), (cid, key)
        # FedAvg averaged exactly the models that were sent (held updates reached the aggregator).
        weights = {cid: info["num_samples"][cid] for cid in info["clients"]}
        total = sum(weights.values())
        for key in names:
            mean = sum(weights[c] / total * recorder.sent[(round_idx, c)][key].double() for c in info["clients"])
            torch.testing.assert_close(info["new"][key], mean.float(), rtol=1e-5, atol=1e-6)
    assert attacked_somewhere


def test_gaussian_replaces_the_update_with_seeded_noise(tmp_path):
    trainer, recorder = _run(tmp_path / "a", MaliciousClients(0.5, "gaussian", noise_std=2.0))
    _, again = _run(tmp_path / "b", MaliciousClients(0.5, "gaussian", noise_std=2.0))
    malicious = choose_malicious(trainer.federation_state.seed, NUM_CLIENTS, 0.5)
    names = _trainable(trainer.lightning_module)
    noise = []
    for (round_idx, cid), sent in recorder.sent.items():
        g = recorder.rounds[round_idx]["global"]
        if cid in malicious:
            noise += [(sent[k] - g[k]).flatten() for k in names]
            assert all(torch.equal(sent[k], again.sent[(round_idx, cid)][k]) for k in sent)  # seeded
    values = torch.cat(noise)
    assert values.numel() > 400
    assert abs(values.mean().item()) < 0.3 and abs(values.std().item() - 2.0) < 0.3


def test_label_flip_changes_only_the_malicious_clients_training_labels(tmp_path):
    class LabelRecorder(FedCallback):
        def __init__(self) -> None:
            self.labels: dict[tuple[int, int], list[torch.Tensor]] = {}

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.labels.setdefault(self.current, []).append(batch[1].clone())

        def on_client_start(self, trainer, pl_module, client_ctx):
            self.current = (client_ctx.round_idx, client_ctx.client_id)

    def labels_seen(path, fraction):
        recorder = LabelRecorder()
        trainer = fast_trainer(
            path, num_rounds=2, clients_per_round=4, callbacks=[MaliciousClients(fraction, "label_flip"), recorder]
        )
        trainer.fit(BoringClassifier(), datamodule=make_datamodule(num_clients=NUM_CLIENTS))
        return recorder.labels, choose_malicious(trainer.federation_state.seed, NUM_CLIENTS, fraction)

    clean, none = labels_seen(tmp_path / "clean", 0.0)
    flipped, malicious = labels_seen(tmp_path / "flipped", 0.5)
    assert none == [] and len(malicious) == 3 and clean.keys() == flipped.keys()
    for (round_idx, cid), batches in clean.items():
        for true, seen in zip(batches, flipped[(round_idx, cid)], strict=True):
            assert torch.equal(seen, 3 - true if cid in malicious else true)
    assert any(cid in malicious for _, cid in clean)


def test_sign_flipping_30_percent_hurts_fedavg(tmp_path):
    def final(path, fraction):
        attack = MaliciousClients(fraction, "sign_flip")
        trainer, _ = _run(path, attack, rounds=3, clients_per_round=10, num_clients=10, lr=0.5)
        last = trainer.federation_state.history[-1]
        return last["global/test_loss"], last["global/test_acc"]

    (clean_loss, clean_acc), (attacked_loss, attacked_acc) = (
        final(tmp_path / "clean", 0.0),
        final(tmp_path / "bad", 0.3),
    )
    # 3 of 10 clients flipping their updates leave 0.4 of the honest step: training visibly lags.
    assert attacked_loss > clean_loss + 0.1 and attacked_acc < clean_acc - 0.05


def test_a_non_finite_attacked_update_is_rejected_and_never_aggregated(tmp_path):
    trainer, recorder = _run(tmp_path, MaliciousClients(0.5, "scale", scale=1e39), rounds=1)
    malicious = choose_malicious(trainer.federation_state.seed, NUM_CLIENTS, 0.5)
    sampled = [cid for cid in recorder.rounds[0]["clients"] if cid in malicious]
    last = trainer.federation_state.history[-1]
    assert sampled and last["clients/rejected"] == len(sampled)
    assert all(torch.isfinite(t).all() for t in trainer.lightning_module.state_dict().values())


def test_malicious_share_is_logged_each_round_and_listed_in_the_summary(tmp_path):
    trainer, recorder = _run(tmp_path, MaliciousClients(0.5, "sign_flip"), rounds=3, clients_per_round=3)
    malicious = choose_malicious(trainer.federation_state.seed, NUM_CLIENTS, 0.5)
    for round_idx, entry in enumerate(trainer.federation_state.history):
        sampled = recorder.rounds[round_idx]["clients"]
        assert entry["attack/malicious_sampled"] == sum(cid in malicious for cid in sampled)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["attack"]["malicious_clients"] == malicious
    assert summary["attack"]["attack"] == "sign_flip" and summary["attack"]["fraction"] == 0.5


@pytest.mark.parametrize(("num_clients", "fraction"), [(10, 0.3), (10, 0.0), (100, 0.29), (7, 0.5), (3, 0.99)])
def test_choice_takes_the_floor_of_the_fraction_and_depends_only_on_the_seed(num_clients, fraction):
    chosen = choose_malicious(5, num_clients, fraction)
    assert len(chosen) == math.floor(round(fraction * num_clients, 9)) == len(set(chosen))
    assert all(0 <= cid < num_clients for cid in chosen) and chosen == sorted(chosen)
    assert chosen == choose_malicious(5, num_clients, fraction)
    assert set(choose_malicious(5, num_clients, fraction / 2)) <= set(chosen)  # nested across fractions


def test_choice_differs_between_seeds():
    assert len({tuple(choose_malicious(seed, 100, 0.3)) for seed in range(5)}) == 5


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"fraction": 1.0, "attack": "sign_flip"}, "fraction"),
        ({"fraction": -0.1, "attack": "sign_flip"}, "fraction"),
        ({"fraction": "0.3", "attack": "sign_flip"}, "fraction"),
        ({"fraction": 0.3, "attack": "backdoor"}, "attack"),
        ({"fraction": 0.3, "attack": "scale", "scale": 0.0}, "scale"),
        ({"fraction": 0.3, "attack": "gaussian", "noise_std": -1.0}, "noise_std"),
        ({"fraction": 0.3, "attack": "alie", "z": 0.0}, "z"),
        ({"fraction": 0.3, "attack": "label_flip", "num_classes": 1}, "num_classes"),
    ],
)
def test_bad_arguments_are_named(kwargs, argument):
    with pytest.raises(InvalidArgumentError) as error:
        MaliciousClients(**kwargs)
    assert error.value.argument == argument


def test_label_flip_without_num_classes_anywhere_is_refused():
    with pytest.raises(InvalidArgumentError, match="num_classes"):
        MaliciousClients(0.3, "label_flip").check_setup(None, object())
    MaliciousClients(0.3, "label_flip", num_classes=4).check_setup(None, object())


@pytest.mark.slow
def test_resume_is_bit_identical(tmp_path):
    # Killed mid-round after an attacker's update was held: the noise is re-drawn from the same seed.
    spec = 'lightning_fed.attacks.MaliciousClients={"fraction": 0.4, "attack": "gaussian", "noise_std": 0.1}'
    assert_resume_bit_identical(tmp_path, "--callback", spec)
