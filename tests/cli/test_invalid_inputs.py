"""Every bad input to ``lightning-fed`` ends with a short message that names it, and leaves nothing behind.

Each case runs ``lightning_fed.cli.main`` in-process on a tiny MNIST-1D config (two clients, 200 examples) and checks:
a non-zero exit, no traceback, the argument's config path in the message, at most three lines on stderr and an
empty ``default_root_dir``. A few cases run as real subprocesses to prove that the console gets no traceback.
"""

import errno
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.cli_config import BASE

from lightning_fed.cli.errors import TRACEBACK_ENV, error_line, parser_error_line
from lightning_fed.cli.main import main

WANDB = (
    "\n    class_path: lightning_fed.loggers.WandbLogger"
    "\n    init_args:\n      project: lf-test\n      save_dir: {root}"
)

PART = "--data.init_args.partitioner"
DATA = "--data.init_args"
MODEL = "--model.init_args"
AGG = "--trainer.aggregator"
CB = "--trainer.callbacks+="
FAULTS = "tests.helpers.cli_faults"


def _cb(name, *args):
    return [f"{CB}lightning_fed.callbacks.{name}", *args]


def _partitioner(name, *args):
    return [PART, f"lightning_fed.datamodules.{name}", *args]


# (id, extra command-line arguments, text the message must contain: the argument's config path).
CASES = [
    # FederatedTrainer's own arguments
    ("num_rounds_0", ["--trainer.num_rounds", "0"], "trainer.num_rounds"),
    ("num_rounds_negative", ["--trainer.num_rounds", "-3"], "trainer.num_rounds"),
    ("num_rounds_not_int", ["--trainer.num_rounds", "abc"], "trainer.num_rounds"),
    ("clients_per_round_0", ["--trainer.clients_per_round", "0"], "trainer.clients_per_round"),
    ("clients_per_round_fraction_above_1", ["--trainer.clients_per_round", "1.5"], "trainer.clients_per_round"),
    ("clients_per_round_above_clients", ["--trainer.clients_per_round", "5"], "trainer.clients_per_round"),
    ("local_epochs_0", ["--trainer.local_epochs", "0"], "trainer.local_epochs"),
    ("local_epochs_and_steps", ["--trainer.local_steps", "2"], "trainer.local_epochs"),
    ("local_steps_0", ["--trainer.local_epochs", "null", "--trainer.local_steps", "0"], "trainer.local_steps"),
    ("local_epochs_float", ["--trainer.local_epochs", "0.5"], "trainer.local_epochs"),
    ("eval_every_n_rounds_negative", ["--trainer.eval_every_n_rounds", "-1"], "trainer.eval_every_n_rounds"),
    ("client_eval_unknown", ["--trainer.client_eval", "bogus"], "trainer.client_eval"),
    ("client_eval_every_negative", ["--trainer.client_eval_every_n_rounds", "-1"], "trainer.client_eval_every"),
    ("client_table_every_negative", ["--trainer.client_table_every_n_rounds", "-2"], "trainer.client_table_every"),
    ("on_client_divergence_unknown", ["--trainer.on_client_divergence", "bogus"], "trainer.on_client_divergence"),
    ("keep_optimizer_state_not_bool", ["--trainer.keep_optimizer_state", "maybe"], "trainer.keep_optimizer_state"),
    ("trainer_seed_float", ["--trainer.seed", "1.5"], "trainer.seed"),
    ("federated_keys_string", ["--trainer.federated_keys", "'*lora*'"], "federated_keys"),
    ("federated_keys_match_nothing", ["--trainer.federated_keys", "[nothing.*]"], "federated_keys=...): the pattern"),
    ("federated_keys_leave_out_trainable", ["--trainer.federated_keys", "[backbone.conv1.*]"], "trainable parameter"),
    ("run_dir_is_a_file", ["--trainer.run_dir", "{file}"], "trainer.run_dir"),
    ("run_dir_under_a_file", ["--trainer.run_dir", "{file}/run"], "trainer.run_dir"),
    ("default_root_dir_under_a_file", ["--trainer.default_root_dir", "{file}/root"], "trainer.default_root_dir"),
    ("unknown_trainer_key", ["--trainer.num_roundz", "3"], "trainer.num_roundz"),
    ("default_root_dir_read_only", ["--trainer.default_root_dir", "{read_only}/root"], "trainer.default_root_dir"),
    (
        "wandb_id_with_a_slash",
        ["--trainer.logger", "lightning_fed.loggers.WandbLogger", "--trainer.logger.id", "a/b"],
        "trainer.logger.init_args.id",
    ),
    # --ckpt_path
    ("ckpt_path_text_file", ["--ckpt_path", "{file}"], "`ckpt_path` must be a checkpoint"),
    ("ckpt_path_directory_without_checkpoint", ["--ckpt_path", "{tmp}"], "`ckpt_path` must be a checkpoint file"),
    ("ckpt_path_unsafe_pickle", ["--ckpt_path", "{unsafe}"], "`ckpt_path` must be a safe checkpoint"),
    # Lightning's arguments that a federated fit cannot use
    ("check_val_every_n_epoch_0", ["--trainer.check_val_every_n_epoch", "0"], "trainer.check_val_every_n_epoch"),
    ("max_epochs", ["--trainer.max_epochs", "3"], "trainer.max_epochs"),
    ("max_steps", ["--trainer.max_steps", "10"], "trainer.max_steps"),
    ("min_epochs", ["--trainer.min_epochs", "2"], "trainer.min_epochs"),
    ("accelerator_unknown", ["--trainer.accelerator", "bogus"], "accelerator"),
    ("seed_everything_negative", ["--seed_everything", "-1"], "seed_everything"),
    ("seed_everything_too_large", ["--seed_everything", "4294967296"], "seed_everything"),
    ("missing_config_file", ["--config", "{root}/missing.yaml"], "config"),
    # A config names a function that runs a command (it would write `marker` in the root that must stay empty)
    (
        "callable_runs_a_command",
        [f"{CB}helpers.calling.CallsOnBuild", "--trainer.callbacks.call", "os.system"]
        + ["--trainer.callbacks.argument", "touch {root}/marker"],
        "`trainer.callbacks.init_args.call` must be an import path that configs may import, and 'os' is denied",
    ),
    # Aggregators
    ("aggregator_unknown_class", [AGG, "Nope"], "trainer.aggregator"),
    ("fedavg_weighting", [AGG, "FedAvg", f"{AGG}.weighting", "bogus"], "trainer.aggregator.init_args.weighting"),
    ("fedavg_server_lr_negative", [AGG, "FedAvg", f"{AGG}.server_lr", "-1"], "trainer.aggregator.init_args.server_lr"),
    ("fedavg_server_lr_0", [AGG, "FedAvg", f"{AGG}.server_lr", "0"], "trainer.aggregator.init_args.server_lr"),
    ("fedavg_unknown_key", [AGG, "FedAvg", f"{AGG}.lr", "1"], "trainer.aggregator.init_args.lr"),
    ("qfedavg_q_negative", [AGG, "QFedAvg", f"{AGG}.q", "-1"], "trainer.aggregator.init_args.q"),
    ("qfedavg_lipschitz_0", [AGG, "QFedAvg", f"{AGG}.lipschitz", "0"], "trainer.aggregator.init_args.lipschitz"),
    # Callbacks
    ("fedprox_mu_negative", _cb("FedProx", "--trainer.callbacks.mu", "-1"), "trainer.callbacks[0].init_args.mu"),
    ("fedprox_unknown_key", _cb("FedProx", "--trainer.callbacks.muu", "1"), "muu"),
    ("fedcurv_lam_negative", _cb("FedCurv", "--trainer.callbacks.lam", "-1"), "trainer.callbacks[0].init_args.lam"),
    ("fedcurv_fisher", _cb("FedCurv", "--trainer.callbacks.lam", "1", "--trainer.callbacks.fisher", "x"), "fisher"),
    ("fedcurv_lam_missing", _cb("FedCurv"), "trainer.callbacks.init_args.lam"),
    ("fedgg_lam_with_adaptive", _cb("FedGG", "--trainer.callbacks.lam", "0.1"), "trainer.callbacks[0].init_args.lam"),
    ("apfl_alpha_above_1", _cb("APFL", "--trainer.callbacks.alpha", "2"), "trainer.callbacks[0].init_args.alpha"),
    ("fedamp_sigma_0", _cb("FedAMP", "--trainer.callbacks.sigma", "0"), "trainer.callbacks[0].init_args.sigma"),
    ("heurfedamp_self_weight", _cb("HeurFedAMP", "--trainer.callbacks.self_weight", "2"), "self_weight"),
    ("rfedavg_variant", _cb("RFedAvg", "--trainer.callbacks.variant", "v9"), "variant"),
    (
        "rfedavg_dp_clip_missing",
        _cb("RFedAvg", "--trainer.callbacks.lam", "1", "--trainer.callbacks.dp_std", "1"),
        "trainer.callbacks[0].init_args",
    ),
    ("finetune_epochs_0", _cb("FineTune", "--trainer.callbacks.epochs", "0"), "trainer.callbacks[0].init_args.epochs"),
    ("finetune_without_client_eval", [*_cb("FineTune"), "--trainer.client_eval", "none"], "trainer.client_eval"),
    ("warmup_lr_0", _cb("SharedDataWarmup", "--trainer.callbacks.lr", "0"), "trainer.callbacks[0].init_args.lr"),
    ("warmup_without_sharing", _cb("SharedDataWarmup"), "data.init_args.sharing"),
    ("weight_divergence_every_0", _cb("WeightDivergence", "--trainer.callbacks.every_n_rounds", "0"), "every_n_rounds"),
    ("scaffold_with_sample_weighting", _cb("Scaffold"), "trainer.aggregator"),
    # The model
    ("lr_negative", [f"{MODEL}.lr", "-1"], "model.init_args.lr"),
    ("lr_not_a_number", [f"{MODEL}.lr", "abc"], "model.init_args.lr"),
    ("optimizer_unknown", [f"{MODEL}.optimizer", "lbfgs"], "model.init_args.optimizer"),
    ("momentum_1", [f"{MODEL}.momentum", "1.0"], "model.init_args.momentum"),
    ("momentum_with_adam", [f"{MODEL}.optimizer", "adam", f"{MODEL}.momentum", "0.9"], "model.init_args.momentum"),
    ("weight_decay_negative", [f"{MODEL}.weight_decay", "-1"], "model.init_args.weight_decay"),
    ("num_classes_disagrees_with_data", [f"{MODEL}.num_classes", "5"], "model.init_args.num_classes"),
    ("backbone_classes_disagree", [f"{MODEL}.backbone.init_args.num_classes", "7"], "backbone.init_args.num_classes"),
    ("unknown_model_key", [f"{MODEL}.lrr", "0.1"], "model.init_args.lrr"),
    ("no_configure_optimizers", ["--model", f"{FAULTS}.NoOptimizerClassifier"], "configure_optimizers"),
    (
        "manual_optimization_with_batched_clients",
        ["--model", f"{FAULTS}.ManualOptimizationClassifier", "--trainer.client_parallelism", "2"],
        "client_parallelism",
    ),
    ("two_optimizers", ["--model", f"{FAULTS}.TwoOptimizerClassifier"], "returned 2 optimizers"),
    (
        "plateau_scheduler_every_step",
        ["--model", f"{FAULTS}.SchedulerClassifier", f"{MODEL}.interval", "step", f"{MODEL}.monitor", "train_loss"],
        "interval='step'",
    ),
    ("scheduler_frequency_0", ["--model", f"{FAULTS}.SchedulerClassifier", f"{MODEL}.frequency", "0"], "frequency=0"),
    (
        "plateau_monitors_validation_without_validation_data",
        ["--model", f"{FAULTS}.SchedulerClassifier", f"{MODEL}.monitor", "val_loss"],
        "monitors 'val_loss'",
    ),
    (
        "pytorch_lightning_module",
        ["--model", "tests.helpers.pl_module.PytorchLightningClassifier"],
        "import lightning.pytorch as pl",
    ),
    ("backbone_channels_0", [f"{MODEL}.backbone.init_args.channels", "0"], "backbone.init_args.channels"),
    # The datamodule
    ("batch_size_0", [f"{DATA}.batch_size", "0"], "data.init_args.batch_size"),
    ("eval_batch_size_0", [f"{DATA}.eval_batch_size", "0"], "data.init_args.eval_batch_size"),
    ("client_test_fraction_1", [f"{DATA}.client_test_fraction", "1.0"], "data.init_args.client_test_fraction"),
    ("client_test_fraction_negative", [f"{DATA}.client_test_fraction", "-0.1"], "data.init_args.client_test_fraction"),
    ("client_test_size_with_fraction", [f"{DATA}.client_test_size", "5"], "data.init_args.client_test_size"),
    (
        "client_test_size_larger_than_a_client",
        [f"{DATA}.client_test_fraction", "0", f"{DATA}.client_test_size", "500"],
        "data.init_args.client_test_size",
    ),
    ("val_fraction_1", [f"{DATA}.val_fraction", "1.0"], "data.init_args.val_fraction"),
    ("num_workers_negative", [f"{DATA}.num_workers", "-1"], "data.init_args.num_workers"),
    ("data_seed_float", [f"{DATA}.seed", "1.5"], "data.init_args.seed"),
    ("num_samples_too_few", [f"{DATA}.num_samples", "10"], "data.init_args.num_samples"),
    ("more_clients_than_examples", [f"{PART}.init_args.num_partitions", "500"], "num_partitions"),
    ("unknown_data_key", [f"{DATA}.batchsize", "4"], "data.init_args.batchsize"),
    (
        "val_fraction_leaves_the_partitioner_too_few",
        [f"{DATA}.val_fraction", "0.9", f"{PART}.init_args.num_partitions", "10"],
        "data.init_args.val_fraction",
    ),
    ("test_labels_out_of_range", ["--data", f"{FAULTS}.MNIST1DWithBadTestLabels"], "Test labels span [-1, 9]"),
    # The partitioners
    ("dirichlet_alpha_negative", [f"{PART}.init_args.alpha", "-1"], "data.init_args.partitioner.init_args.alpha"),
    ("dirichlet_alpha_0", [f"{PART}.init_args.alpha", "0"], "data.init_args.partitioner.init_args.alpha"),
    ("dirichlet_alpha_text", [f"{PART}.init_args.alpha", "x"], "data.init_args.partitioner.init_args.alpha"),
    ("num_partitions_0", [f"{PART}.init_args.num_partitions", "0"], "partitioner.init_args.num_partitions"),
    ("min_partition_size_negative", [f"{PART}.init_args.min_partition_size", "-1"], "min_partition_size"),
    ("max_retries_0", [f"{PART}.init_args.max_retries", "0"], "partitioner.init_args.max_retries"),
    ("proportions_unknown", [f"{PART}.init_args.proportions", "bogus"], "partitioner.init_args.proportions"),
    ("iid_num_partitions_0", _partitioner("IidPartitioner", f"{PART}.init_args.num_partitions", "0"), "num_partitions"),
    (
        "shard_shards_per_client_0",
        _partitioner(
            "ShardPartitioner", f"{PART}.init_args.num_partitions", "2", f"{PART}.init_args.shards_per_client", "0"
        ),
        "partitioner.init_args.shards_per_client",
    ),
    (
        "similarity_above_1",
        _partitioner(
            "SimilarityPartitioner", f"{PART}.init_args.num_partitions", "2", f"{PART}.init_args.similarity", "2"
        ),
        "partitioner.init_args.similarity",
    ),
    (
        "target_emd_2",
        _partitioner(
            "TargetEmdPartitioner", f"{PART}.init_args.num_partitions", "2", f"{PART}.init_args.target_emd", "2"
        ),
        "partitioner.init_args.target_emd",
    ),
]


class _Payload:
    """Unpickled, it would create ``marker``: a checkpoint that runs code when loaded without ``weights_only``."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def write_unsafe_checkpoint(path, marker):
    torch.save({"state_dict": {}, "payload": _Payload(marker)}, path)
    return path


def _mount_tmpfs(path, options):
    """Mounts a tmpfs at ``path`` (a real read-only or full file system); the reason when it cannot."""
    if shutil.which("mount") is None:
        return "no `mount` command"
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "lf-test", str(path)], capture_output=True)
    return None if result.returncode == 0 else result.stderr.decode().strip() or "mount failed"


def _unmount(path):
    """Unmounts a tmpfs of :func:`_mount_tmpfs`. W&B's service process outlives the run that started it by a moment,
    holding files there: busy, the unmount is tried again for 10 s, then done lazily (detached at once, freed when
    the last file closes)."""
    for _ in range(50):
        if subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
            return
        time.sleep(0.2)
    subprocess.run(["umount", "--lazy", str(path)], check=False)


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory this process cannot write to: without write permission, or (as root, whom permission bits do
    not stop) a read-only tmpfs mount; skipped when neither can be made real."""
    path = tmp_path / "read_only"
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    problem = _mount_tmpfs(path, "ro,size=1m")
    if problem:
        pytest.skip(f"running as root (chmod does not stop writes) and cannot mount a read-only tmpfs: {problem}")
    yield path
    _unmount(path)


@pytest.fixture
def full_dir(tmp_path):
    """A directory on a 48 KiB tmpfs: a run fills it with its first plots or checkpoint (ENOSPC)."""
    path = tmp_path / "full"
    path.mkdir()
    problem = _mount_tmpfs(path, "size=48k")
    if problem:
        pytest.skip(f"cannot mount a small tmpfs to fill: {problem}")
    yield path
    _unmount(path)


@pytest.fixture
def setup_files(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    afile = tmp_path / "a_file"
    afile.write_text("not a directory")
    write_unsafe_checkpoint(tmp_path / "unsafe.ckpt", tmp_path / "marker")
    config = tmp_path / "base.yaml"
    config.write_text(BASE.format(logger="false"))
    wandb_config = tmp_path / "wandb.yaml"
    wandb_config.write_text(BASE.format(logger=WANDB.format(root=root)))
    return root, afile, config, wandb_config


def _run_main(args, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


def _check(code, out, err, expected, root):
    assert code not in (0, None)
    assert "Traceback" not in out + err
    assert expected in err, err
    assert len(err.strip().splitlines()) <= 3, err
    assert list(root.iterdir()) == [], f"left behind: {list(root.iterdir())}"


@pytest.mark.parametrize(("args", "expected"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_invalid_input_gives_one_line_and_leaves_nothing(args, expected, setup_files, capsys, monkeypatch, request):
    root, afile, config, _ = setup_files
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    read_only = request.getfixturevalue("read_only_dir") if any("{read_only}" in arg for arg in args) else None
    tmp = root.parent
    places = {"root": root, "file": afile, "tmp": tmp, "unsafe": tmp / "unsafe.ckpt", "read_only": read_only}
    args = [arg.format(**places) for arg in args]
    code, out, err = _run_main(["fit", "--config", str(config), "--trainer.default_root_dir", str(root), *args], capsys)
    _check(code, out, err, expected, root)
    assert not (tmp / "marker").exists()
    assert not list(tmp.glob("wandb")), "W&B wrote outside the run directory"


def test_there_are_at_least_60_cases():
    assert len(CASES) >= 60


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([f"{DATA}.client_test_fraction", "0", f"{DATA}.client_test_size", "500"], "data.init_args.client_test_size"),
        (["--trainer.clients_per_round", "5"], "trainer.clients_per_round"),
        (_cb("Scaffold"), "trainer.aggregator"),
        ([f"{MODEL}.num_classes", "5"], "model.init_args.num_classes"),
    ],
    ids=["client_test_size", "clients_per_round", "scaffold_aggregator", "num_classes"],
)
def test_with_wandb_no_run_and_no_config_are_left_behind(args, expected, setup_files, capsys, monkeypatch):
    root, _, _, wandb_config = setup_files
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    code, out, err = _run_main(
        ["fit", "--config", str(wandb_config), "--trainer.default_root_dir", str(root), *args], capsys
    )
    _check(code, out, err, expected, root)


@pytest.mark.parametrize("subcommand", ["validate", "test"])
def test_validate_and_test_check_before_running(subcommand, setup_files, capsys):
    root, _, config, _ = setup_files
    args = [subcommand, "--config", str(config), "--trainer.default_root_dir", str(root), f"{MODEL}.num_classes", "5"]
    code, out, err = _run_main(args, capsys)
    _check(code, out, err, "model.init_args.num_classes", root)
    assert err.startswith(f"lightning-fed {subcommand}: ")


def test_the_message_names_value_and_allowed_range(setup_files, capsys):
    root, _, config, _ = setup_files
    code, _, err = _run_main(
        ["fit", "--config", str(config), "--trainer.default_root_dir", str(root), f"{PART}.init_args.alpha", "-1"],
        capsys,
    )
    assert err.splitlines()[0] == (
        "lightning-fed fit: `data.init_args.partitioner.init_args.alpha` must be a finite number > 0.0; got -1.0."
    )
    assert TRACEBACK_ENV in err.splitlines()[1]


def test_traceback_on_request(setup_files, capsys, monkeypatch):
    root, _, config, _ = setup_files
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    from lightning_fed.checks import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match="num_rounds"):
        main(["fit", "--config", str(config), "--trainer.default_root_dir", str(root), "--trainer.num_rounds", "0"])


def test_a_valid_run_still_writes_its_files_and_prints_lightning_lines(setup_files, capsys):
    root, _, config, _ = setup_files
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("lightning.pytorch")
    logger.addHandler(handler)
    try:
        main(["fit", "--config", str(config), "--trainer.default_root_dir", str(root)])
    finally:
        logger.removeHandler(handler)
    assert "[lightning_fed] final after 1 rounds" in capsys.readouterr().out
    # Held back while the settings are checked, then printed through Lightning's own handlers.
    assert any("GPU available" in record.getMessage() for record in records)
    assert list((root / "runs").glob("*/checkpoints/last.ckpt"))
    assert list((root / "runs").glob("*/config.yaml"))


def test_parser_messages_are_reduced_to_one_line():
    nested = (
        "Parser key \"data\":\n  Does not validate against any of the Union subtypes\n  Subtypes: [<class 'X'>]\n"
        "  Errors:\n    - Problem with given class_path 'M':\n        Parser key \"partitioner\":\n"
        "          Problem with given class_path 'P':\n            Parser key \"alpha\":\n"
        "              Expected a <class 'float'>. Got value: x\n    - Expected a <class 'NoneType'>\n"
    )
    assert parser_error_line(nested) == "`data.init_args.partitioner.init_args.alpha` must be a number; got 'x'."
    assert "`trainer.foo`" in parser_error_line("unrecognized arguments: --trainer.foo 3")


SUBPROCESS_CASES = [
    (["--trainer.num_rounds", "0"], "trainer.num_rounds"),
    ([f"{PART}.init_args.alpha", "-1"], "data.init_args.partitioner.init_args.alpha"),
    (["--trainer.num_roundz", "3"], "trainer.num_roundz"),
    ([f"{DATA}.client_test_fraction", "0", f"{DATA}.client_test_size", "500"], "data.init_args.client_test_size"),
]


@pytest.mark.parametrize(("args", "expected"), SUBPROCESS_CASES, ids=[case[1] for case in SUBPROCESS_CASES])
def test_console_shows_no_traceback(args, expected, setup_files):
    root, _, config, _ = setup_files
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "WANDB_MODE": "offline"}
    env.pop(TRACEBACK_ENV, None)
    result = subprocess.run(
        [sys.executable, "-m", "lightning_fed.cli.main", "fit", "--config", str(config)]
        + ["--trainer.default_root_dir", str(root), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr
    assert expected in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 3, result.stderr
    assert list(root.iterdir()) == []


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "WANDB_MODE": "offline"}
    env.pop(TRACEBACK_ENV, None)
    # main() itself rather than `-m lightning_fed.cli.main`, whose runpy warning would be stderr's first line.
    command = [sys.executable, "-c", "from lightning_fed.cli.main import main; main()", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("subcommand", ["fit", "test"])
def test_a_refused_resume_is_the_only_line_no_lightning_banner_before_it(subcommand, setup_files):
    """The refusal is decided while Lightning's output is held back: no ``Seed set to 0``, ``GPU available: ...``
    or ``TPU available: ...`` is printed before the line that names what to change."""
    root, _, config, _ = setup_files
    finished = _cli("fit", "--config", str(config), "--trainer.default_root_dir", str(root))
    assert finished.returncode == 0, finished.stderr[-3000:]
    refused = _cli(
        subcommand, "--config", str(config), "--trainer.default_root_dir", str(root), f"{MODEL}.lr", "0.1",
        "--ckpt_path", "last",
    )  # fmt: skip
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert refused.stdout == ""
    assert refused.stderr.startswith(f"lightning-fed {subcommand}: `ckpt_path` is 'last' but none of the 1 run(s)")
    assert "model.lr: 0.05 -> 0.1" in refused.stderr
    for banner in ("Seed set to", "GPU available", "TPU available"):
        assert banner not in refused.stderr


def test_an_unsafe_checkpoint_runs_no_code(tmp_path):
    from lightning_fed.checks import InvalidArgumentError
    from lightning_fed.run.setup_checks import check_checkpoint_path

    marker = tmp_path / "marker"
    with pytest.raises(InvalidArgumentError, match="safe checkpoint"):
        check_checkpoint_path("ckpt_path", str(write_unsafe_checkpoint(tmp_path / "x.ckpt", marker)))
    assert not marker.exists()


def test_a_full_disk_after_start_is_one_line(setup_files, full_dir, capsys, monkeypatch):
    _, _, config, _ = setup_files
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    code, out, err = _run_main(["fit", "--config", str(config), "--trainer.default_root_dir", str(full_dir)], capsys)
    assert code == 2
    assert "Traceback" not in out + err
    assert "[ENOSPC]" in err.splitlines()[0], err
    assert len(err.strip().splitlines()) <= 3, err


def test_a_full_disk_keeps_the_traceback_on_request(setup_files, full_dir, monkeypatch):
    _, _, config, _ = setup_files
    monkeypatch.setenv(TRACEBACK_ENV, "1")
    with pytest.raises(OSError) as info:
        main(["fit", "--config", str(config), "--trainer.default_root_dir", str(full_dir)])
    assert info.value.errno == errno.ENOSPC


@pytest.fixture
def small_disk(tmp_path):
    """A directory on an 8 MiB tmpfs: room for a run's first rounds, until a callback fills it."""
    path = tmp_path / "small_disk"
    path.mkdir()
    problem = _mount_tmpfs(path, "size=8m")
    if problem:
        pytest.skip(f"cannot mount a small tmpfs to fill: {problem}")
    yield path
    _unmount(path)


def test_a_disk_that_fills_mid_run_under_wandb_is_one_line_and_resumes_bit_identical(setup_files, small_disk):
    """W&B's service and log files share the full disk: the line that says so stays the last thing printed (no
    ``--- Logging error ---`` traceback for each record W&B fails to write), and once space is freed the run resumes
    to the model of a run that never met the full disk."""
    root, _, _, wandb_config = setup_files
    marker = root.parent / "filled"
    args = ["fit", "--config", str(wandb_config), "--trainer.num_rounds", "3", "--trainer.clients_per_round", "2"]
    args += [f"{CB}{FAULTS}.FillDiskOnce", "--trainer.callbacks.init_args.marker", str(marker)]
    failed = _cli(*args, "--trainer.default_root_dir", str(small_disk))
    assert failed.returncode == 2, failed.stderr[-3000:]
    lines = failed.stderr.strip().splitlines()
    (index,) = [i for i, line in enumerate(lines) if line.startswith("lightning-fed fit: ")]
    assert "[ENOSPC]" in lines[index] and len(lines[index:]) <= 3, failed.stderr[-3000:]
    assert marker.exists()

    (small_disk / "filler").unlink()
    resumed = _cli(*args, "--trainer.default_root_dir", str(small_disk), "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    reference = _cli(*args, "--trainer.default_root_dir", str(root))
    assert reference.returncode == 0, reference.stderr[-3000:]
    (got,) = (small_disk / "runs").glob("*/checkpoints/last.ckpt")
    (expected,) = (root / "runs").glob("*/checkpoints/last.ckpt")
    got_state = torch.load(got, weights_only=True)["state_dict"]
    expected_state = torch.load(expected, weights_only=True)["state_dict"]
    assert got_state.keys() == expected_state.keys()
    assert all(torch.equal(got_state[name], value) for name, value in expected_state.items())


def test_environment_errors_are_one_line(read_only_dir):
    with pytest.raises(OSError) as info:
        (read_only_dir / "x").write_text("x")
    line = error_line(info.value)
    assert line is not None and "x" in line and "\n" not in line
    if not os.path.exists("/dev/full"):
        return
    with pytest.raises(OSError) as full_info, open("/dev/full", "w") as full:  # noqa: PT012
        full.write("x" * 65536)
        full.flush()
    assert error_line(full_info.value).startswith("No space left on device [ENOSPC]; free some space")


def test_an_error_in_user_code_names_client_round_and_checkpoint(setup_files, monkeypatch):
    root, _, config, _ = setup_files
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    args = ["fit", "--config", str(config), "--trainer.default_root_dir", str(root), "--trainer.num_rounds", "3"]
    args += ["--model", f"{FAULTS}.FailingClassifier", f"{CB}{FAULTS}.TellClient"]
    with pytest.raises(RuntimeError, match="the user's training_step failed") as info:
        main(args)
    note = info.value.__notes__[-1]
    assert note.startswith("lightning-fed: raised while client 1 trained in round 2; last checkpoint: "), note
    assert note.split("last checkpoint: ")[1].split(" ")[0].endswith(".ckpt")
