"""Resume names a run: `last` picks the newest run of this configuration, a run is named by its directory or id, and
a checkpoint of another configuration is refused with the differing keys, unless the change is allowed."""

import json
import os

import pytest
import torch
from helpers.boring import BoringClassifier, OneCycleClassifier, fast_trainer, make_datamodule, one_cycle_lrs

from lightning_fed import FedCallback
from lightning_fed.aggregators import QFedAvg
from lightning_fed.callbacks import FedProx
from lightning_fed.checks import InvalidArgumentError
from lightning_fed.datamodules import DirichletPartitioner
from lightning_fed.run.fingerprint import differences, experiment_fingerprint, format_differences, is_allowed
from lightning_fed.run.resume import ResumeError


def _trainer(root, **kwargs):
    settings = dict(num_rounds=1, seed=0, enable_checkpointing=True, limit_val_batches=0)
    settings.update(kwargs)
    return fast_trainer(root, **settings)


def _fit(root, lr=0.1, datamodule=None, ckpt_path=None, **kwargs):
    trainer = _trainer(root, **kwargs)
    trainer.fit(BoringClassifier(lr=lr), datamodule=datamodule or make_datamodule(), ckpt_path=ckpt_path)
    return trainer


def _tree(root):
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A root holding one finished 1-round run with lr=0.1, seed 0, FedAvg, IID partition."""
    root = tmp_path_factory.mktemp("root")
    trainer = _fit(root)
    return root, trainer.fed_run_dir


@pytest.mark.parametrize(
    ("change", "key", "shown"),
    [
        ({"lr": 0.2}, "model.lr", "model.lr: 0.1 -> 0.2"),
        ({"seed": 1}, "trainer.seed", "trainer.seed: 0 -> 1"),
        ({"aggregator": QFedAvg(q=1.0)}, "aggregator", "aggregator: 'lightning_fed.aggregators.fedavg.FedAvg' ->"),
        ({"callbacks": [FedProx(mu=0.01)]}, "callbacks.FedProx", "callbacks.FedProx: (absent) ->"),
        (
            {"datamodule": make_datamodule(partitioner=DirichletPartitioner(num_partitions=4, alpha=0.5, seed=0))},
            "data.partitioner",
            "data.partitioner: 'lightning_fed.datamodules.partitioners.iid.IidPartitioner' ->",
        ),
        ({"clients_per_round": 3}, "trainer.clients_per_round", "trainer.clients_per_round: 2 -> 3"),
        ({"local_epochs": 2}, "trainer.local_epochs", "trainer.local_epochs: 1 -> 2"),
    ],
    ids=["lr", "seed", "aggregator", "algorithm-callback", "partitioner", "clients-per-round", "local-epochs"],
)
def test_a_changed_experiment_is_refused_with_the_key(finished, tmp_path, change, key, shown):
    root, run_dir = finished
    before = _tree(root)
    for ckpt_path in ("last", str(run_dir), run_dir.name):
        with pytest.raises(ResumeError) as error:
            _fit(root, ckpt_path=ckpt_path, **change)
        message = str(error.value)
        assert shown in message and key in message, message
        assert run_dir.name in message, "the error names the (closest) run"
    assert _tree(root) == before, "a refused resume writes nothing"


def test_more_rounds_resume_the_run_in_its_own_directory(tmp_path):
    root, run_dir = tmp_path, _fit(tmp_path).fed_run_dir
    before = json.loads((run_dir / "summary.json").read_text())
    assert before["completed_rounds"] == 1 and before["run_id"] == run_dir.name
    trainer = _fit(root, num_rounds=2, ckpt_path="last")
    assert trainer.fed_run_dir == run_dir and trainer.federation_state.completed_rounds == 2
    assert json.loads((run_dir / "summary.json").read_text())["completed_rounds"] == 2
    assert [path.name for path in (root / "runs").iterdir()] == [run_dir.name], "no new run directory"
    # By directory and by id as well.
    assert _fit(root, num_rounds=3, ckpt_path=str(run_dir)).federation_state.completed_rounds == 3
    assert _fit(root, num_rounds=4, ckpt_path=run_dir.name).federation_state.completed_rounds == 4


def test_allowed_changes_resume_and_are_reported(tmp_path):
    first = _fit(tmp_path)
    with pytest.warns(UserWarning, match=r"model\.lr: 0\.1 -> 0\.3"):
        trainer = _fit(tmp_path, lr=0.3, num_rounds=2, ckpt_path="last", resume_allow_changes=["model.lr"])
    assert trainer.fed_run_dir == first.fed_run_dir and trainer.federation_state.completed_rounds == 2
    # A dotted prefix allows a whole object; the resumed run's checkpoints carry the new fingerprint.
    trainer = _fit(
        tmp_path,
        lr=0.3,
        num_rounds=3,
        ckpt_path="last",
        callbacks=[FedProx(mu=0.1)],
        resume_allow_changes=["callbacks.FedProx"],
    )
    assert trainer.federation_state.completed_rounds == 3


def test_last_picks_the_newest_run_of_this_configuration(tmp_path):
    mine = _fit(tmp_path, lr=0.1).fed_run_dir
    other = _fit(tmp_path, lr=0.2).fed_run_dir  # newer, another configuration
    old = os.stat(mine / "checkpoints" / "last.ckpt").st_mtime
    os.utime(other / "checkpoints" / "round0000.ckpt", (old + 10, old + 10))
    trainer = _fit(tmp_path, lr=0.1, num_rounds=2, ckpt_path="last")
    assert trainer.fed_run_dir == mine and trainer.federation_state.completed_rounds == 2
    assert json.loads((other / "summary.json").read_text())["completed_rounds"] == 1, "the other run is untouched"


def test_the_closest_run_is_named_when_none_matches(tmp_path):
    near = _fit(tmp_path, lr=0.2).fed_run_dir
    _fit(tmp_path, lr=0.3, seed=5)
    with pytest.raises(ResumeError, match="none of the 2 run") as error:
        _fit(tmp_path, lr=0.1, ckpt_path="last")
    assert f"The closest, {near.name}, differs in" in str(error.value)
    assert "model.lr: 0.2 -> 0.1" in str(error.value) and "trainer.seed" not in str(error.value)


@pytest.mark.parametrize("stage", ["fit", "validate", "test"])
def test_last_with_nothing_to_resume_is_an_error(tmp_path, stage):
    trainer = _trainer(tmp_path)
    call = getattr(trainer, stage)
    with pytest.raises(ResumeError, match="nothing to resume"):
        call(BoringClassifier(), datamodule=make_datamodule(), ckpt_path="last")
    assert not (tmp_path / "runs").exists()


def test_a_run_without_a_checkpoint_or_with_a_dangling_last_is_nothing_to_resume(tmp_path):
    run_dir = tmp_path / "runs" / "killed-early" / "checkpoints"
    run_dir.mkdir(parents=True)
    (run_dir / "last.ckpt").symlink_to("round0003.ckpt")  # its target is gone
    for stage in ("fit", "test"):
        with pytest.raises(ResumeError, match="nothing to resume"):
            getattr(_trainer(tmp_path), stage)(BoringClassifier(), datamodule=make_datamodule(), ckpt_path="last")
    with pytest.raises(ResumeError, match="missing file"):
        _fit(tmp_path, ckpt_path=str(run_dir / "last.ckpt"))
    with pytest.raises(ResumeError, match="none of them"):
        _fit(tmp_path, ckpt_path="no-such-run")


def test_validate_and_test_resolve_last_and_check_the_configuration(finished):
    root, run_dir = finished
    trainer = _trainer(root)
    results = trainer.test(BoringClassifier(), datamodule=make_datamodule(), ckpt_path="last")
    assert results and "test_acc" in results[0]
    with pytest.raises(ResumeError, match="model.lr"):
        _trainer(root).validate(BoringClassifier(lr=0.5), datamodule=make_datamodule(), ckpt_path=run_dir.name)


def test_a_plain_checkpoint_file_still_resumes_and_is_checked(finished, tmp_path):
    root, run_dir = finished
    (tmp_path / "copy").mkdir()
    copy = tmp_path / "copy" / "model.ckpt"
    copy.write_bytes((run_dir / "checkpoints" / "last.ckpt").read_bytes())
    with pytest.raises(ResumeError, match="model.lr: 0.1 -> 0.2"):
        _fit(tmp_path, lr=0.2, ckpt_path=str(copy))
    trainer = _fit(tmp_path, num_rounds=2, ckpt_path=str(copy))
    assert trainer.federation_state.completed_rounds == 2
    assert trainer.fed_run_dir.parent == tmp_path / "runs", "a file outside a run continues in a new run"


def test_the_checkpoint_carries_the_fingerprint(finished):
    _, run_dir = finished
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    fingerprint = checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]["federated"]["fingerprint"]
    assert fingerprint["model.lr"] == 0.1 and fingerprint["trainer.seed"] == 0
    assert fingerprint["data.partitioner.num_partitions"] == 4
    assert "num_rounds" not in json.dumps(fingerprint), "a run may always be extended"


def test_fingerprint_reads_hparams_attributes_and_nested_objects():
    from lightning_fed.models import MNIST1DCNN, ClassifierModule

    trainer = fast_trainer(".", callbacks=[FedProx(mu=0.01), FedProx(mu=0.02)])
    module = ClassifierModule(backbone=MNIST1DCNN(channels=8), num_classes=10, lr=0.07)
    fingerprint = experiment_fingerprint(trainer, module, make_datamodule())
    assert fingerprint["model.lr"] == 0.07  # from save_hyperparameters
    assert fingerprint["model.backbone"].endswith("MNIST1DCNN")
    wider = experiment_fingerprint(trainer, ClassifierModule(backbone=MNIST1DCNN(channels=16), num_classes=10), None)
    assert wider["model.backbone.state_shapes"] != fingerprint["model.backbone.state_shapes"]
    assert fingerprint["callbacks.FedProx.mu"] == 0.01 and fingerprint["callbacks.FedProx[1].mu"] == 0.02
    assert "data.num_workers" not in fingerprint and "data.batch_size" in fingerprint


def test_differences_and_allowed_keys():
    diff = differences({"model.lr": 0.1, "a": 1}, {"model.lr": 0.2, "b": 2})
    assert diff == {"a": (1, "(absent)"), "b": ("(absent)", 2), "model.lr": (0.1, 0.2)}
    assert "  model.lr: 0.1 -> 0.2" in format_differences(diff)
    assert is_allowed("callbacks.FedProx.mu", ["callbacks.FedProx"]) and is_allowed("x", ["*"])
    assert not is_allowed("callbacks.FedProxy", ["callbacks.FedProx"])


def test_resume_allow_changes_is_checked():
    with pytest.raises(InvalidArgumentError, match="resume_allow_changes"):
        fast_trainer(".", resume_allow_changes="model.lr")


def test_the_progress_bar_is_not_part_of_the_experiment(tmp_path):
    _fit(tmp_path, enable_progress_bar=False)
    trainer = _fit(tmp_path, num_rounds=2, enable_progress_bar=True, ckpt_path="last")
    assert trainer.federation_state.completed_rounds == 2


class StepDecay(BoringClassifier):
    """SGD at ``lr``, halved after every round (an epoch-interval StepLR)."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)}


class RoundLrs(FedCallback):
    """The lr of every optimizer step, by round."""

    def __init__(self):
        self.lrs = {}

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.lrs.setdefault(trainer.current_epoch, []).append(optimizer.param_groups[0]["lr"])


def _fit_with(root, module, num_rounds, ckpt_path=None, **kwargs):
    recorder = RoundLrs()
    trainer = _trainer(root, num_rounds=num_rounds, callbacks=[recorder], **kwargs)
    trainer.fit(module, datamodule=make_datamodule(), ckpt_path=ckpt_path)
    return trainer, recorder.lrs


def test_an_allowed_lr_change_continues_an_epoch_schedule_from_its_position(tmp_path):
    """StepLR halves the lr after each round: resumed after round 2 with lr 0.4, round 3 steps with 0.4 / 4 (the
    new lr at the schedule's position), not 0.1 / 4 (the checkpoint's) nor 0.4 (the schedule forgotten)."""
    _, lrs = _fit_with(tmp_path, StepDecay(lr=0.1), num_rounds=2)
    assert {round_idx: set(values) for round_idx, values in lrs.items()} == {0: {0.1}, 1: {0.05}}
    allow = dict(resume_allow_changes=["model.lr"])
    with pytest.warns(UserWarning, match=r"model\.lr: 0\.1 -> 0\.4"):
        trainer, lrs = _fit_with(tmp_path, StepDecay(lr=0.4), num_rounds=3, ckpt_path="last", **allow)
    assert trainer.federation_state.completed_rounds == 3
    assert set(lrs) == {2} and lrs[2] == pytest.approx([0.4 * 0.5**2] * len(lrs[2]))


def test_an_allowed_max_lr_change_continues_a_one_cycle_schedule_from_its_position(tmp_path):
    """OneCycleLR steps every local step: resumed from round 0's checkpoint with max_lr 1.0, round 1's clients step
    with the lrs of a plain OneCycleLR run configured with max_lr 1.0 from the start (computed here)."""
    trainer, first = _fit_with(tmp_path, OneCycleClassifier(max_lr=0.5), num_rounds=2)
    (checkpoint,) = trainer.fed_run_dir.glob("checkpoints/round0000.ckpt")
    allow = dict(resume_allow_changes=["model.max_lr"])
    with pytest.warns(UserWarning, match=r"model\.max_lr: 0\.5 -> 1\.0"):
        resumed, lrs = _fit_with(
            tmp_path, OneCycleClassifier(max_lr=1.0), num_rounds=2, ckpt_path=str(checkpoint), **allow
        )
    steps = len(first[0]) // 2  # two clients of equal size, K steps each: round r's schedule starts at r * K
    expected = one_cycle_lrs(resumed.lightning_module.total_steps, max_lr=1.0)[steps : 2 * steps]
    assert set(lrs) == {1}
    assert lrs[1] == pytest.approx(expected * 2)  # each of the round's two clients from the round's start
    assert lrs[1] != pytest.approx(first[1])
