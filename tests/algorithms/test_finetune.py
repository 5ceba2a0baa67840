import lightning.pytorch as L
import pytest
import torch
from helpers.boring import BoringClassifier, fast_trainer, global_weights, make_datamodule, plain_sgd_pass

from lightning_fed.callbacks import FedProx, FineTune
from lightning_fed.engine.evaluation import evaluate
from lightning_fed.engine.log_buffer import LogBuffer
from lightning_fed.utilities.seeding import derive_seed

SEED = 4


def _fit(tmp_path, callbacks, num_rounds=2):
    L.seed_everything(0)
    module = BoringClassifier(lr=0.1, batch_norm=True, momentum=0.9)
    datamodule = make_datamodule(num_clients=3)
    trainer = fast_trainer(
        tmp_path, num_rounds=num_rounds, clients_per_round=2, local_epochs=1, seed=SEED, callbacks=callbacks
    )
    trainer.fit(module, datamodule=datamodule)
    return trainer, module, datamodule


@pytest.fixture(scope="module")
def fedprox_run(tmp_path_factory):
    return _fit(tmp_path_factory.mktemp("fedprox"), [FedProx(mu=5.0)])


def _plain_finetune(module, datamodule, client_id, round_idx):
    """E=1 epoch of the module's own loss with its own optimizer from fresh state: no proximal term."""
    tuned = BoringClassifier(lr=0.1, batch_norm=True, momentum=0.9)
    tuned.load_state_dict(module.state_dict())
    loader = datamodule.client_dataloader(client_id, seed=derive_seed(SEED, "finetune", "data", round_idx, client_id))
    return plain_sgd_pass(tuned, loader)


def test_every_client_is_evaluated_with_its_plainly_fine_tuned_model(tmp_path):
    trainer, module, datamodule = _fit(tmp_path, [FedProx(mu=5.0), FineTune(epochs=1)])
    per_client = trainer.last_round_result.client_results
    assert sorted(per_client) == [0, 1, 2]
    global_state = global_weights(module)
    for cid in range(3):
        module.load_state_dict(_plain_finetune(module, datamodule, cid, round_idx=1))
        expected = evaluate(trainer, module, datamodule.client_test_dataloader(cid), LogBuffer())
        assert per_client[cid] == expected, cid
        module.load_state_dict(global_state)
    history = trainer.federation_state.history
    assert "client/test_acc_mean" in history[0] and "personal/test_acc_mean" not in history[0]
    assert "personal/test_acc_mean" in history[1] and "client/test_acc_mean" not in history[1]


def test_federated_training_and_the_global_model_are_untouched(tmp_path, fedprox_run):
    plain_trainer, plain, _ = fedprox_run
    trainer, module, _ = _fit(tmp_path, [FedProx(mu=5.0), FineTune(epochs=2)])
    for name, tensor in global_weights(plain).items():
        assert torch.equal(global_weights(module)[name], tensor), name
    for plain_round, round_ in zip(plain_trainer.federation_state.history, trainer.federation_state.history):
        for key in ("train/loss", "train/fedprox_proximal", "global/test_acc", "global/test_loss"):
            assert round_[key] == plain_round[key], key
    # The fine-tuned models are better fits of each client's data than the global model, not the same.
    assert trainer.last_round_result.client_results != plain_trainer.last_round_result.client_results


def test_every_n_rounds_fine_tunes_those_rounds_and_the_last(tmp_path):
    trainer, _, _ = _fit(tmp_path, [FineTune(every_n_rounds=2)], num_rounds=3)
    kinds = ["personal" if "personal/test_acc_mean" in m else "client" for m in trainer.federation_state.history]
    assert kinds == ["client", "personal", "personal"]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"epochs": 0}, "epochs"),
        ({"epochs": 1.5}, "epochs"),
        ({"epochs": True}, "epochs"),
        ({"every_n_rounds": 0}, "every_n_rounds"),
    ],
)
def test_bad_arguments_are_refused_with_their_name(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        FineTune(**kwargs)


def test_fine_tuning_without_client_evaluation_is_refused(tmp_path):
    L.seed_everything(0)
    trainer = fast_trainer(tmp_path, num_rounds=1, client_eval="none", callbacks=[FineTune()])
    with pytest.raises(ValueError, match="`client_eval`"):
        trainer.fit(BoringClassifier(), datamodule=make_datamodule(num_clients=2))
