import copy

import pytest
import torch
import torch.nn.functional as F
from helpers.boring import BoringClassifier, fast_trainer, global_weights, make_datamodule
from helpers.resume import assert_resume_bit_identical

from lightning_fed import FedCallback
from lightning_fed.callbacks import RFedAvg
from lightning_fed.functional.mmd import (
    clip_rows,
    delta_bytes,
    gaussian_noise,
    leave_one_out_means,
    leave_one_out_spread,
    linear_mmd,
)
from lightning_fed.functional.state_dict import state_nbytes
from lightning_fed.models import MNIST1DCNN, ClassifierModule
from lightning_fed.utilities.seeding import derive_seed

SEED = 3
LAYER = "net.1"  # BoringClassifier(batch_norm=False): net.0 Linear, net.1 ReLU, net.2 Dropout, net.3 Linear


def _phi(module, x):
    return module.net[:2](x)


def _client_inputs(dm, client_id):
    return torch.cat([x for x, _ in dm.client_dataloader(client_id, seed=0)])


def _deltas(module, dm, client_ids):
    with torch.no_grad():
        return torch.stack([_phi(module, _client_inputs(dm, cid)).mean(0) for cid in client_ids])


class Spy(FedCallback):
    """Runs after RFedAvg: keeps each round's targets, global model, and each client's local model."""

    def __init__(self):
        self.targets, self.globals, self.locals, self.updates = {}, {}, {}, {}

    def on_round_start(self, trainer, pl_module, round_ctx):
        self.targets[round_ctx.round_idx] = {k: v.clone() for k, v in round_ctx.extras["rfedavg_targets"].items()}
        self.globals[round_ctx.round_idx] = {k: v.clone() for k, v in round_ctx.global_params.items()}

    def on_client_end(self, trainer, pl_module, client_ctx, update):
        self.locals[(client_ctx.round_idx, client_ctx.client_id)] = global_weights(pl_module)
        self.updates[(client_ctx.round_idx, client_ctx.client_id)] = update.params


def _fit(tmp_path, callbacks, num_clients=4, clients_per_round=4, num_rounds=2, **kwargs):
    torch.manual_seed(0)
    module = BoringClassifier(lr=0.1)
    dm = make_datamodule(num_clients=num_clients, num_samples=40 * num_clients)
    kwargs.setdefault("local_steps", 2)
    trainer = fast_trainer(
        tmp_path, num_rounds=num_rounds, clients_per_round=clients_per_round, seed=SEED, callbacks=callbacks, **kwargs
    )
    trainer.fit(module, datamodule=dm)
    return trainer, module, dm


# ---- functional ---------------------------------------------------------------------------------------------


def test_linear_mmd_is_squared_distance_of_means_without_half():
    feats, target = torch.randn(7, 5), torch.randn(5)
    assert torch.allclose(linear_mmd(feats, target), ((feats.mean(0) - target) ** 2).sum())


def test_leave_one_out_means_exclude_the_client_itself():
    deltas = torch.randn(5, 3)
    expected = torch.stack([deltas[[j for j in range(5) if j != k]].mean(0) for k in range(5)])
    torch.testing.assert_close(leave_one_out_means(deltas), expected)
    assert not torch.allclose(leave_one_out_means(deltas), deltas.mean(0).expand(5, 3))  # self-including mean
    with pytest.raises(ValueError, match="n >= 2"):
        leave_one_out_means(deltas[:1])


def test_v1_term_value_and_gradient_equal_mean_distance_to_each_other_client():
    torch.manual_seed(0)
    deltas, k = torch.randn(6, 4), 2
    others = deltas[[j for j in range(6) if j != k]]
    feats = torch.randn(9, 4, requires_grad=True)
    r_k = torch.stack([linear_mmd(feats, d) for d in others]).mean()  # Eq. (5)
    (g_ref,) = torch.autograd.grad(r_k, feats)
    cheap = linear_mmd(feats, leave_one_out_means(deltas)[k])
    (g_cheap,) = torch.autograd.grad(cheap, feats)
    torch.testing.assert_close(g_cheap, g_ref)
    torch.testing.assert_close(cheap + leave_one_out_spread(deltas)[k], r_k)


def test_table_iii_delta_size_ratio():
    # Table III, CNN (d = 512): cross-silo 56160 vs 2808 B (N = 20), cross-device 280800 vs 2808 B (100 sampled).
    for n, paper_v1, paper_plus in ((20, 56160, 2808), (100, 280800, 2808)):
        v1_down, v1_up = delta_bytes("v1", n, 512)
        plus_down, plus_up = delta_bytes("plus", n, 512)
        assert v1_down / plus_down == paper_v1 / paper_plus == n
        assert v1_up == plus_up == 512 * 4
    # The paper's per-δ size carries a fixed serialisation overhead: 2808 - 512·4 == 1784 - 256·4 (RNN, d = 256).
    assert 2808 - delta_bytes("plus", 20, 512)[0] == 1784 - delta_bytes("plus", 20, 256)[0]
    with pytest.raises(ValueError, match="`variant` must be one of 'v1', 'plus'"):
        delta_bytes("v2", 20, 512)


def test_clipping_and_noise_scale_are_right_and_seeded():
    rows = clip_rows(torch.randn(50, 8) * 10, 1.5)
    assert (rows.norm(dim=1) <= 1.5 + 1e-5).all()
    small = torch.full((1, 8), 0.01)
    assert torch.equal(clip_rows(small, 1.5), small)
    noise = gaussian_noise(200_000, std=2.0, clip=1.5, count=30, generator=torch.Generator().manual_seed(0))
    assert noise.std().item() == pytest.approx(2.0 * 1.5 / 30, rel=0.02)
    assert abs(noise.mean().item()) < 1e-3
    again = gaussian_noise(200_000, std=2.0, clip=1.5, count=30, generator=torch.Generator().manual_seed(0))
    assert torch.equal(noise, again)


# ---- the callback --------------------------------------------------------------------------------------------


def test_plus_targets_exclude_the_client_and_come_from_the_current_global_model(tmp_path):
    spy = Spy()
    _, module, dm = _fit(tmp_path, [RFedAvg(1.0, "plus", LAYER), spy], num_rounds=3)
    reference = copy.deepcopy(module)
    ids = list(range(4))
    for r in range(3):
        reference.load_state_dict(spy.globals[r])
        expected = leave_one_out_means(_deltas(reference, dm, ids))
        got = torch.stack([spy.targets[r][cid] for cid in ids])
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        # Pitfalls: a self-including mean and a stale δ (previous round's model) are detectably different.
        assert not torch.allclose(got, _deltas(reference, dm, ids).mean(0).expand_as(got), atol=1e-4)
        if r > 0:
            reference.load_state_dict(spy.globals[r - 1])
            assert not torch.allclose(got, leave_one_out_means(_deltas(reference, dm, ids)), atol=1e-4)


def test_v1_targets_use_each_others_last_local_model_and_the_init_in_round_0(tmp_path):
    spy = Spy()
    _, module, dm = _fit(tmp_path, [RFedAvg(1.0, "v1", LAYER), spy], num_clients=4, clients_per_round=2, num_rounds=3)
    reference = copy.deepcopy(module)
    latest = {}
    for cid in range(4):
        reference.load_state_dict(spy.globals[0])
        latest[cid] = _deltas(reference, dm, [cid])[0]  # never-trained clients: the random init
    for r in range(3):
        deltas = torch.stack([latest[cid] for cid in range(4)])
        for cid, target in spy.targets[r].items():
            torch.testing.assert_close(target, leave_one_out_means(deltas)[cid], rtol=1e-5, atol=1e-6)
        for (rr, cid), weights in spy.locals.items():
            if rr == r:
                reference.load_state_dict(weights)
                latest[cid] = _deltas(reference, dm, [cid])[0]


def test_one_step_equals_autograd_of_ce_plus_lambda_mmd(tmp_path):
    spy, lam = Spy(), 0.5
    torch.manual_seed(0)
    module = BoringClassifier(lr=0.1)
    start = copy.deepcopy(module)
    dm = make_datamodule(num_clients=3)
    trainer = fast_trainer(
        tmp_path,
        num_rounds=1,
        clients_per_round=3,
        local_steps=1,
        seed=SEED,
        callbacks=[RFedAvg(lam, "plus", LAYER), spy],
    )
    trainer.fit(module, datamodule=dm)
    x, y = next(iter(dm.client_dataloader(1, seed=derive_seed(SEED, "data", 0, 1))))
    phi = _phi(start, x)
    loss = F.cross_entropy(start.net[2:](phi), y) + lam * ((phi.mean(0) - spy.targets[0][1]) ** 2).sum()
    loss.backward()
    for name, p in start.named_parameters():
        torch.testing.assert_close(spy.updates[(0, 1)][name], p.detach() - 0.1 * p.grad, msg=name)
    assert trainer.federation_state.history[-1]["train/rfedavg_reg"] > 0


@pytest.mark.parametrize("variant", ["v1", "plus"])
def test_lambda_zero_is_fedavg_exactly(tmp_path, variant):
    _, with_term, _ = _fit(tmp_path / "a", [RFedAvg(0.0, variant, LAYER)], num_clients=3, clients_per_round=3)
    _, plain, _ = _fit(tmp_path / "b", [], num_clients=3, clients_per_round=3)
    for name, tensor in global_weights(plain).items():
        assert torch.equal(global_weights(with_term)[name], tensor), name


def test_full_delta_is_the_mean_over_all_client_samples_and_minibatch_is_seeded(tmp_path):
    trainer, module, dm = _fit(tmp_path, [RFedAvg(1.0, "plus", LAYER)], num_rounds=1)
    full = RFedAvg(1.0, "plus", LAYER).client_delta(trainer, module, 2, 5, "global")
    torch.testing.assert_close(full, _deltas(module, dm, [2])[0], rtol=1e-5, atol=1e-6)
    mini = RFedAvg(1.0, "plus", LAYER, delta="minibatch", minibatch_size=20)
    first = mini.client_delta(trainer, module, 2, 5, "global")
    assert torch.equal(first, mini.client_delta(trainer, module, 2, 5, "global"))
    assert not torch.equal(first, mini.client_delta(trainer, module, 2, 6, "global"))
    x = torch.cat([b for b, _ in dm.client_dataloader(2, seed=derive_seed(SEED, "rfedavg", "global", 5, 2))])[:20]
    with torch.no_grad():
        torch.testing.assert_close(first, _phi(module, x).mean(0), rtol=1e-5, atol=1e-6)


def test_dp_noise_is_added_to_clipped_delta_and_is_deterministic(tmp_path):
    trainer, module, _ = _fit(tmp_path, [RFedAvg(1.0, "plus", LAYER)], num_rounds=1)
    clipped = RFedAvg(1.0, "plus", LAYER, dp_clip=0.5).client_delta(trainer, module, 1, 0, "global")
    noisy_cb = RFedAvg(1.0, "plus", LAYER, dp_std=3.0, dp_clip=0.5)
    noisy = noisy_cb.client_delta(trainer, module, 1, 0, "global")
    assert torch.equal(noisy, noisy_cb.client_delta(trainer, module, 1, 0, "global"))
    count = trainer.datamodule.client_num_samples(1)
    generator = torch.Generator().manual_seed(derive_seed(SEED, "rfedavg", "dp", "global", 0, 1))
    torch.testing.assert_close(noisy - clipped, gaussian_noise(16, 3.0, 0.5, count, generator))


@pytest.mark.parametrize("variant", ["v1", "plus"])
def test_communication_counts_delta_bytes_beside_the_models(tmp_path, variant):
    spy = Spy()
    trainer, _, _ = _fit(tmp_path, [RFedAvg(1.0, variant, LAYER), spy], num_clients=4, clients_per_round=4)
    model = state_nbytes(spy.globals[0])
    state, d4 = trainer.federation_state, 16 * 4
    down, up = state.bytes_down - 2 * 4 * model, state.bytes_up - 2 * 4 * model  # FedAvg: K models each way
    if variant == "v1":  # per round, 4 clients each get all 4 δ (Alg. 1 line 3); up: 4 init δ + 4 local δ per round
        assert (down, up) == (2 * 4 * 4 * d4, (4 + 2 * 4) * d4)
    else:  # per round, 4 clients each get one δ̄_{-k}; all 4 upload a fresh δ
        assert (down, up) == (2 * 4 * d4, 2 * 4 * d4)


def test_plus_with_all_clients_computes_every_delta_and_ships_the_model_to_unsampled_ones(tmp_path):
    spy = Spy()
    trainer, _, _ = _fit(tmp_path, [RFedAvg(1.0, "plus", LAYER), spy], num_clients=5, clients_per_round=2, num_rounds=1)
    assert trainer.federation_state.store.clients("rfedavg") == list(range(5))
    model = state_nbytes(spy.globals[0])
    assert trainer.federation_state.bytes_down == 2 * model + 2 * 16 * 4 + 3 * model
    assert trainer.federation_state.bytes_up == 2 * model + 5 * 16 * 4


def test_arguments_are_validated_and_layer_suffix_resolves():
    with pytest.raises(ValueError, match=r"`dp_clip` must be a number > 0 when `dp_std` is set"):
        RFedAvg(1.0, dp_std=1.0)
    with pytest.raises(ValueError, match="`dp_clip`"):
        RFedAvg(1.0, dp_clip=0.0)
    with pytest.raises(ValueError, match="`minibatch_size`"):
        RFedAvg(1.0, delta="minibatch", minibatch_size=True)
    with pytest.raises(ValueError, match="`population`"):
        RFedAvg(1.0, population="some")
    with pytest.raises(ValueError, match="variant"):
        RFedAvg(1.0, variant="v2")
    with pytest.raises(ValueError, match="lam"):
        RFedAvg(-1.0)
    module = ClassifierModule(MNIST1DCNN(), num_classes=10)
    assert RFedAvg(1.0)._layer(module) is module.backbone.features_act


def test_too_few_clients_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least 2 clients"):
        _fit(tmp_path, [RFedAvg(1.0, "plus", LAYER, population="sampled")], num_clients=3, clients_per_round=1)


@pytest.mark.slow
def test_resume_is_bit_identical(tmp_path):
    assert_resume_bit_identical(
        tmp_path,
        "--callback",
        'lightning_fed.callbacks.RFedAvg={"lam": 0.1, "variant": "v1", "feature_layer": "net.2", '
        '"delta": "minibatch", "minibatch_size": 20, "dp_std": 1.0, "dp_clip": 5.0}',
        "--aggregator",
        'lightning_fed.aggregators.FedAvg={"weighting": "uniform"}',
        "--momentum",
        "0",
    )
