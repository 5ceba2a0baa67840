import copy
import math
from types import SimpleNamespace

import lightning.pytorch as L
import pytest
import torch
from helpers.boring import NUM_CLASSES, BoringClassifier, MetricModule, fast_trainer, global_weights, make_datamodule
from helpers.reference_sgd import reference_epoch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.precision import MixedPrecision

from lightning_fed.callbacks.weight_divergence import WeightDivergence
from lightning_fed.datamodules import IidPartitioner, ShardPartitioner
from lightning_fed.functional.divergence import total_weight_divergence, weight_divergence
from lightning_fed.utilities.seeding import derive_seed, seed_torch


def test_weight_divergence_matches_eq_1_by_hand():
    fed = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([0.5, -1.0])}
    sgd = {"w": torch.tensor([[1.0, 0.0], [3.0, 2.0]]), "b": torch.tensor([0.0, -1.0])}
    result = weight_divergence(fed, sgd, ["w", "b"])
    # ||(0, 2, 0, 2)|| / ||(1, 0, 3, 2)|| = sqrt(8 / 14); ||(0.5, 0)|| / ||(0, -1)|| = 0.5.
    assert result["w"] == pytest.approx(math.sqrt(8 / 14), rel=1e-12)
    assert result["b"] == pytest.approx(0.5, rel=1e-12)
    # Flattened: sqrt((8 + 0.25) / (14 + 1)).
    assert total_weight_divergence(fed, sgd, ["w", "b"]) == pytest.approx(math.sqrt(8.25 / 15), rel=1e-12)


def test_weight_divergence_edge_cases_and_errors():
    zero = {"z": torch.zeros(3)}
    assert weight_divergence(zero, zero, ["z"]) == {"z": 0.0}
    assert weight_divergence({"z": torch.ones(3)}, zero, ["z"]) == {"z": math.inf}
    with pytest.raises(KeyError, match="'missing'"):
        weight_divergence(zero, zero, ["missing"])
    with pytest.raises(ValueError, match="shape"):
        weight_divergence({"z": torch.zeros(2)}, zero, ["z"])


def _fit(tmp_path, partitioner, num_rounds=3, clients=None, lr=0.1, trainer_kwargs=None, **kwargs):
    dm = make_datamodule(num_clients=partitioner.num_partitions, partitioner=partitioner, batch_size=16)
    L.seed_everything(0)
    module = BoringClassifier(lr=lr, **kwargs)
    callback = WeightDivergence()
    trainer = fast_trainer(
        tmp_path,
        num_rounds=num_rounds,
        clients_per_round=clients or partitioner.num_partitions,
        callbacks=[callback],
        **(trainer_kwargs or {}),
    )
    trainer.fit(module, datamodule=dm)
    return trainer, callback, module


def test_one_client_with_all_data_has_zero_divergence(tmp_path):
    # One client, K = 1: the twin's batch is B * 1 and it replays the client's shuffle and dropout seeds, so it takes
    # the very same SGD steps as the client and FedAvg's one-client average is that client's model: exactly 0.
    trainer, callback, module = _fit(tmp_path, IidPartitioner(num_partitions=1, seed=0), dropout=0.2)
    history = trainer.federation_state.history
    names = [name for name, _ in module.named_parameters()]
    for entry in history:
        assert entry["divergence/total"] == 0.0
        assert all(entry[f"divergence/{name}"] == 0.0 for name in names)
    for name, tensor in global_weights(module).items():
        assert torch.equal(callback.twin_state[name], tensor), name
    assert list(tmp_path.glob("runs/*/weight_divergence.png"))


def _fp16(growth_interval=1):
    # A scale that doubles after every finite step (and halves on overflow) makes any extra or missed step visible.
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=growth_interval)
    return MixedPrecision("16-mixed", "cpu", scaler=scaler)


@pytest.mark.parametrize(
    "trainer_kwargs",
    [{"gradient_clip_val": 0.05, "accumulate_grad_batches": 2}, {"plugins": [_fp16()]}],
    ids=["clipping-and-accumulation", "fp16-loss-scaling"],
)
def test_one_client_twin_takes_the_clients_steps(tmp_path, trainer_kwargs):
    # The twin's steps are a client's steps: clipping, accumulation and loss scaling included, so one client's
    # divergence stays exactly 0 with each of them.
    trainer, callback, module = _fit(
        tmp_path, IidPartitioner(num_partitions=1, seed=0), num_rounds=2, dropout=0.2, trainer_kwargs=trainer_kwargs
    )
    assert [entry["divergence/total"] for entry in trainer.federation_state.history] == [0.0, 0.0]
    for name, tensor in global_weights(module).items():
        assert torch.equal(callback.twin_state[name], tensor), name


def test_twin_is_a_direct_sgd_pass_with_clipping_and_accumulation(tmp_path):
    dm = make_datamodule(num_clients=4)
    L.seed_everything(0)
    module = BoringClassifier(lr=0.5, momentum=0.9, dropout=0.2)
    expected = copy.deepcopy(module)
    callback = WeightDivergence()
    trainer = fast_trainer(
        tmp_path,
        num_rounds=1,
        clients_per_round=2,
        gradient_clip_val=0.05,
        accumulate_grad_batches=3,
        callbacks=[callback],
    )
    trainer.fit(module, datamodule=dm)
    # Round 0's twin: the pooled data in batches of B * K = 32, the first client's seeds, plain SGD at lr 0.5.
    seed, first = trainer.federation_state.seed, trainer.sampler.sample(0, 4)[0]
    pooled = copy.copy(dm)
    pooled.batch_size, pooled.seed = 32, derive_seed(seed, "data", 0, first)
    seed_torch(derive_seed(seed, "torch", 0, first))
    reference_epoch(expected, torch.optim.SGD(expected.parameters(), lr=0.5), pooled.train_dataloader(), 0.05, 3)
    for name, tensor in expected.state_dict().items():
        assert torch.equal(callback.twin_state[name], tensor), name


def test_twin_does_not_change_the_federated_run(tmp_path):
    dm = make_datamodule(num_clients=4)
    weights = []
    for callbacks in ([], [WeightDivergence()]):
        L.seed_everything(0)
        module = BoringClassifier(dropout=0.3)
        fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, callbacks=callbacks).fit(module, datamodule=dm)
        weights.append(global_weights(module))
    for name, tensor in weights[0].items():
        assert torch.equal(weights[1][name], tensor), name


def test_twin_leaves_the_loss_scale_and_train_metrics_of_the_federated_run(tmp_path):
    dm = make_datamodule(num_clients=4)
    runs = []
    for callbacks in ([], [WeightDivergence()]):
        L.seed_everything(0)
        module = MetricModule(dropout=0.3)
        trainer = fast_trainer(tmp_path, num_rounds=2, clients_per_round=2, callbacks=callbacks, plugins=[_fp16()])
        trainer.fit(module, datamodule=dm)
        scale = trainer.strategy.precision_plugin.scaler.get_scale()
        metric = [entry["train/metric_mean"] for entry in trainer.federation_state.history]
        runs.append((global_weights(module), scale, metric))
    (plain, plain_scale, plain_metric), (twinned, twinned_scale, twinned_metric) = runs
    assert twinned_scale == plain_scale and twinned_metric == plain_metric
    for name, tensor in plain.items():
        assert torch.equal(twinned[name], tensor), name


def test_divergence_grows_with_label_skew(tmp_path):
    iid, _, _ = _fit(tmp_path / "iid", IidPartitioner(num_partitions=NUM_CLASSES, seed=0), lr=0.2)
    skew, _, _ = _fit(tmp_path / "skew", ShardPartitioner(num_partitions=NUM_CLASSES, shards_per_client=1), lr=0.2)
    assert iid.datamodule.client_emd().max() < 0.5 and skew.datamodule.client_emd().min() > 1.0
    iid_div = iid.federation_state.history[-1]["divergence/total"]
    skew_div = skew.federation_state.history[-1]["divergence/total"]
    assert 0 < iid_div < skew_div
    assert skew_div > 2 * iid_div


def test_twin_state_survives_resume(tmp_path):
    def run(root, num_rounds, ckpt_path=None):
        L.seed_everything(0)
        callback = WeightDivergence()
        checkpoint = ModelCheckpoint(
            dirpath=root,
            filename="round{epoch}",
            auto_insert_metric_name=False,
            save_top_k=-1,
            save_on_train_epoch_end=True,
        )
        trainer = fast_trainer(root, num_rounds=num_rounds, callbacks=[callback, checkpoint], enable_checkpointing=True)
        trainer.fit(BoringClassifier(), datamodule=make_datamodule(num_clients=4), ckpt_path=ckpt_path)
        return trainer, callback

    reference, ref_callback = run(tmp_path / "ref", 3)
    run(tmp_path / "cut", 1)
    saved = torch.load(tmp_path / "cut" / "round0.ckpt", weights_only=True)
    assert any("twin" in state for state in saved["callbacks"].values())
    resumed, callback = run(tmp_path / "cut", 3, ckpt_path=str(tmp_path / "cut" / "round0.ckpt"))
    for name, tensor in ref_callback.twin_state.items():
        assert torch.equal(callback.twin_state[name], tensor), name
    keys = [k for k in reference.federation_state.history[-1] if k.startswith("divergence/")]
    assert [resumed.federation_state.history[-1][k] for k in keys] == [
        reference.federation_state.history[-1][k] for k in keys
    ]


def test_resume_without_twin_state_is_refused_and_bad_arguments_are_named():
    trainer = SimpleNamespace(federation_state=SimpleNamespace(completed_rounds=2))
    round_ctx = SimpleNamespace(global_params={}, client_ids=[0], round_idx=2)
    with pytest.raises(ValueError, match="no SGD twin"):
        WeightDivergence().on_round_start(trainer, BoringClassifier(), round_ctx)
    with pytest.raises(ValueError, match="every_n_rounds"):
        WeightDivergence(every_n_rounds=0)


def test_divergence_plot_draws_one_line_per_tensor_with_total_in_black():
    from lightning_fed.plots.divergence import plot_weight_divergence

    history = [{"round": r, "divergence/a.weight": 0.1 * r, "divergence/total": 0.05 * r} for r in (1, 2, 3)]
    fig = plot_weight_divergence(history, ["divergence/a.weight", "divergence/total"])
    ax = fig.axes[0]
    layer, total = ax.get_lines()
    assert list(layer.get_ydata()) == pytest.approx([0.1, 0.2, 0.3]) and layer.get_label() == "a.weight"
    assert total.get_color() == "black" and ax.get_yscale() == "log"
    zero = [{"round": 1, "divergence/total": 0.0}]
    assert plot_weight_divergence(zero, ["divergence/total"]).axes[0].get_yscale() == "linear"
