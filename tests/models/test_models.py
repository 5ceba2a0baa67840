"""Reference networks (shapes, hand-counted parameters, feature layers) and ClassifierModule."""

from __future__ import annotations

import io

import lightning.pytorch as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_fed.models import MLP, MNIST1DCNN, ClassifierModule, FedAvgCNN, LeNet5, PflCifarCNN


def _num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _conv(c_in: int, c_out: int, k: int) -> int:
    return c_in * c_out * k + c_out


def _fc(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


@pytest.mark.parametrize(("in_channels", "size"), [(1, 28), (3, 32)])
def test_fedavg_cnn_shapes_and_param_count(in_channels: int, size: int) -> None:
    model = FedAvgCNN(in_channels=in_channels, num_classes=10, image_size=size)
    assert model(torch.randn(4, in_channels, size, size)).shape == (4, 10)
    side = size // 4  # 'same' padding, two 2×2 pools
    expected = _conv(in_channels, 32, 25) + _conv(32, 64, 25) + _fc(64 * side * side, 512) + _fc(512, 10)
    assert _num_params(model) == expected


def test_fedavg_cnn_matches_mcmahan_parameter_total() -> None:
    # McMahan et al. (2017) report 1,663,370 parameters for the MNIST CNN; only 'same' padding gives that.
    assert _num_params(FedAvgCNN()) == 1_663_370


def test_pfl_cifar_cnn_has_the_benchmarks_1_63_million_parameters() -> None:
    # conv 3x3x3x32 + 32, conv 3x3x32x64 + 64, linear 12 544 x 128 + 128, linear 128 x 10 + 10 (pfl-research: 1.63 M).
    model = PflCifarCNN()
    assert _num_params(model) == 896 + 18_496 + 1_605_760 + 1_290 == 1_626_442
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert PflCifarCNN(1, 62, 28).fc1.in_features == 64 * 12 * 12


@pytest.mark.parametrize("model", [FedAvgCNN(3, 10, 32), LeNet5(3, 10, 32), MLP(20, 16, 10), MNIST1DCNN()])
def test_feature_layer_hook_yields_nonnegative_penultimate_features(model: nn.Module) -> None:
    inputs = {FedAvgCNN: (5, 3, 32, 32), LeNet5: (5, 3, 32, 32), MLP: (5, 4, 5), MNIST1DCNN: (5, 1, 40)}
    captured: list[torch.Tensor] = []
    layer = model.get_submodule(type(model).feature_layer)
    handle = layer.register_forward_hook(lambda _m, _i, out: captured.append(out))
    x = torch.randn(*inputs[type(model)])
    logits = model(x)
    handle.remove()
    assert captured[0].shape == (5, model.feature_dim)
    assert bool((captured[0] >= 0).all())
    assert torch.equal(captured[0], model.features(x))
    assert logits.shape == (5, 10)


def test_fedavg_cnn_feature_layer_is_512_wide() -> None:
    model = FedAvgCNN()
    captured: list[torch.Tensor] = []
    model.features_act.register_forward_hook(lambda _m, _i, out: captured.append(out))
    model(torch.randn(3, 1, 28, 28))
    assert captured[0].shape == (3, 512)


@pytest.mark.parametrize(("in_channels", "size"), [(1, 28), (3, 32)])
def test_lenet5_shapes_and_param_count(in_channels: int, size: int) -> None:
    model = LeNet5(in_channels=in_channels, num_classes=10, image_size=size)
    assert model(torch.randn(2, in_channels, size, size)).shape == (2, 10)
    # Both sizes reach the textbook 16×5×5 flatten (padding 2 on 28×28, none on 32×32).
    assert model.conv1.padding == ((2, 2) if size == 28 else (0, 0))
    expected = _conv(in_channels, 6, 25) + _conv(6, 16, 25) + _fc(400, 120) + _fc(120, 84) + _fc(84, 10)
    assert _num_params(model) == expected
    if in_channels == 1:
        assert expected == 61_706


def test_lenet5_explicit_padding_changes_flatten_size() -> None:
    model = LeNet5(in_channels=3, image_size=32, first_conv_padding=2)  # 32→32→16→12→6
    assert model.fc1.in_features == 16 * 6 * 6
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def test_mlp_default_is_three_layer_and_param_count() -> None:
    model = MLP(input_dim=3 * 32 * 32)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert _num_params(model) == _fc(3072, 512) + _fc(512, 10)
    deep = MLP(input_dim=784, hidden_dim=200, num_hidden_layers=2)  # McMahan's 2NN
    assert _num_params(deep) == _fc(784, 200) + _fc(200, 200) + _fc(200, 10) == 199_210


def test_mnist1d_cnn_shapes_and_param_count() -> None:
    model = MNIST1DCNN()
    assert model(torch.randn(3, 1, 40)).shape == (3, 10)
    assert model(torch.randn(3, 40)).shape == (3, 10)
    expected = _conv(1, 32, 5) + 2 * _conv(32, 32, 5) + _fc(32 * 10, 64) + _fc(64, 10)
    assert _num_params(model) == expected == 31_690


@pytest.mark.parametrize(
    ("factory", "name"),
    [
        (lambda: FedAvgCNN(in_channels=0), "in_channels"),
        (lambda: FedAvgCNN(image_size=3), "image_size"),
        (lambda: PflCifarCNN(image_size=5), "image_size"),
        (lambda: LeNet5(image_size=8), "image_size"),
        (lambda: LeNet5(first_conv_padding=-1), "first_conv_padding"),
        (lambda: MLP(num_hidden_layers=0), "num_hidden_layers"),
        (lambda: MNIST1DCNN(channels=True), "channels"),
        (lambda: MNIST1DCNN(input_length=0), "input_length"),
        (lambda: MLP(hidden_dim=2.0), "hidden_dim"),
        (lambda: LeNet5(first_conv_padding=1.5), "first_conv_padding"),
        (lambda: FedAvgCNN(num_classes="10"), "num_classes"),
    ],
)
def test_networks_reject_bad_arguments(factory, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        factory()


def _module(**kwargs) -> ClassifierModule:
    return ClassifierModule(MLP(input_dim=8, hidden_dim=16, num_classes=3), num_classes=3, **kwargs)


def _batch(n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, 8), torch.randint(0, 3, (n,))


def test_training_step_returns_scalar_loss_with_grad_and_logs_train_loss() -> None:
    module = _module()
    logged: dict[str, object] = {}
    module.log = lambda name, value, **_: logged.__setitem__(name, value)
    loss = module.training_step(_batch(), 0)
    assert loss.dim() == 0 and loss.requires_grad
    assert list(logged) == ["train_loss"]


def test_validation_and_test_steps_log_loss_and_metric_objects() -> None:
    module = _module()
    logged: dict[str, object] = {}
    module.log = lambda name, value, **_: logged.__setitem__(name, value)
    module.validation_step(_batch(), 0)
    module.test_step(_batch(), 0)
    assert set(logged) == {"val_loss", "val_acc", "test_loss", "test_acc"}
    assert logged["val_acc"] is module.val_acc and logged["test_acc"] is module.test_acc
    assert isinstance(logged["val_loss"], torch.Tensor)


def test_metric_states_stay_out_of_state_dict() -> None:
    assert all(key.startswith("backbone.") for key in _module().state_dict())


@pytest.mark.parametrize(
    ("kwargs", "cls"),
    [
        ({"optimizer": "sgd", "momentum": 0.9}, torch.optim.SGD),
        ({"optimizer": "adam"}, torch.optim.Adam),
        ({"optimizer": "adamw", "weight_decay": 0.01}, torch.optim.AdamW),
    ],
)
def test_configure_optimizers(kwargs: dict, cls: type) -> None:
    module = _module(lr=0.05, **kwargs)
    optimizer = module.configure_optimizers()
    assert type(optimizer) is cls
    group = optimizer.param_groups[0]
    assert group["lr"] == 0.05 and group["weight_decay"] == kwargs.get("weight_decay", 0.0)
    if cls is torch.optim.SGD:
        assert group["momentum"] == 0.9
    assert sum(p.numel() for p in group["params"]) == _num_params(module)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"num_classes": 1}, "num_classes"),
        ({"optimizer": "rmsprop"}, "optimizer"),
        ({"lr": 0.0}, "lr"),
        ({"lr": float("nan")}, "lr"),
        ({"momentum": 1.0}, "momentum"),
        ({"optimizer": "adam", "momentum": 0.9}, "momentum"),
        ({"weight_decay": -1e-4}, "weight_decay"),
        ({"lr": True}, "lr"),
        ({"weight_decay": float("inf")}, "weight_decay"),
    ],
)
def test_classifier_rejects_bad_arguments(kwargs: dict, name: str) -> None:
    args = {"num_classes": 3, **kwargs}
    with pytest.raises(ValueError, match=name):
        ClassifierModule(MLP(input_dim=8, num_classes=3), **args)


def test_classifier_rejects_non_module_backbone() -> None:
    with pytest.raises(TypeError, match="backbone"):
        ClassifierModule("mlp", num_classes=3)  # type: ignore[arg-type]


def test_logit_width_mismatch_names_num_classes() -> None:
    module = ClassifierModule(MLP(input_dim=8, num_classes=5), num_classes=3)
    with pytest.raises(ValueError, match="num_classes"):
        module.training_step(_batch(), 0)


def test_hparams_hold_no_module_and_load_weights_only() -> None:
    module = _module(optimizer="adamw", lr=1e-3, weight_decay=1e-2)
    assert not any(isinstance(value, nn.Module) for value in module.hparams.values())
    buffer = io.BytesIO()
    torch.save({"hp": dict(module.hparams)}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert loaded["hp"] == {"num_classes": 3, "optimizer": "adamw", "lr": 1e-3, "momentum": 0.0, "weight_decay": 1e-2}


@pytest.fixture(scope="module")
def mnist1d() -> dict[str, torch.Tensor]:
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = 4000
    data = make_dataset(args)  # generated locally from templates; nothing is downloaded
    return {key: torch.as_tensor(data[key]) for key in ("x", "y", "x_test", "y_test")}


def test_mnist1d_cnn_learns_mnist1d(mnist1d: dict[str, torch.Tensor]) -> None:
    torch.manual_seed(0)
    module = ClassifierModule(MNIST1DCNN(), num_classes=10, optimizer="adam", lr=1e-2)
    module.log = lambda *_, **__: None  # a plain loop, without a Trainer to receive logs
    optimizer = module.configure_optimizers()
    x, y = mnist1d["x"].float().unsqueeze(1), mnist1d["y"].long()
    for _ in range(10):
        for idx in torch.randperm(len(y)).split(64):
            optimizer.zero_grad()
            module.training_step((x[idx], y[idx]), 0).backward()
            optimizer.step()
    with torch.no_grad():
        accuracy = (module(mnist1d["x_test"].float()).argmax(1) == mnist1d["y_test"]).float().mean().item()
    assert accuracy >= 0.70, accuracy


def test_trainer_fit_and_test_log_expected_keys(mnist1d: dict[str, torch.Tensor], tmp_path) -> None:
    train = TensorDataset(mnist1d["x"][:512].float().unsqueeze(1), mnist1d["y"][:512].long())
    test = TensorDataset(mnist1d["x_test"][:256].float().unsqueeze(1), mnist1d["y_test"][:256].long())
    module = ClassifierModule(MNIST1DCNN(), num_classes=10, optimizer="sgd", lr=0.05, momentum=0.9)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, DataLoader(train, batch_size=64), DataLoader(test, batch_size=128))
    assert {"train_loss", "val_loss", "val_acc"} <= set(trainer.callback_metrics)
    results = trainer.test(module, DataLoader(test, batch_size=128), verbose=False)
    assert set(results[0]) == {"test_loss", "test_acc"}
    assert 0.0 <= results[0]["test_acc"] <= 1.0
    # A real checkpoint loads under weights_only, and reloads given a fresh backbone.
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["hyper_parameters"]["lr"] == 0.05
    restored = ClassifierModule.load_from_checkpoint(tmp_path / "last.ckpt", backbone=MNIST1DCNN())
    assert torch.equal(restored.backbone.fc2.weight, module.backbone.fc2.weight)
