"""``lightning-fed``: LightningCLI with federated defaults.

Examples::

    lightning-fed fit --config configs/quickstart.yaml
    lightning-fed fit --config configs/quickstart.yaml --trainer.num_rounds 5
    lightning-fed fit --config configs/quickstart.yaml --ckpt_path last      # resume a killed run
    lightning-fed fit --config configs/quickstart.yaml --print_config
    lightning-fed reproduce --profile small     # the papers' claims; needs `pip install -e benchmarks/` from a checkout

Subcommands besides LightningCLI's come from other installed distributions, through the entry-point group
``lightning_fed.commands`` (:data:`COMMANDS_GROUP`): the repository's ``benchmarks/`` declares ``reproduce`` there.

A bad argument, config entry or data setting stops the command before anything is written, with one line on
stderr that names the setting by its config path, the value given and what is allowed (see :func:`main`).
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, cast

from jsonargparse import set_parsing_settings
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from typing_extensions import override

from lightning_fed.checks import InvalidArgumentError
from lightning_fed.cli.errors import (
    HeldOutput,
    error_line,
    exception_chain,
    find_environment_error,
    parser_error_line,
    report,
    traceback_requested,
)
from lightning_fed.datamodules.base import FederatedDataModule
from lightning_fed.hooks import FedCallback, federated_trainer
from lightning_fed.loggers.wandb import end_run_quietly
from lightning_fed.run.identity import check_run_ids
from lightning_fed.run.module_checks import (
    check_federated_part,
    check_lightning_package,
    check_loss_scaling,
    check_module_definition,
    check_optimization_setup,
)
from lightning_fed.run.reporting import resolve_run_dir
from lightning_fed.run.resume import check_resumable
from lightning_fed.run.setup_checks import (
    check_checkpoint_path,
    check_clients_per_round,
    check_epoch_args,
    check_lightning_settings,
    check_num_classes,
    check_output_dir,
    check_seed_everything,
)
from lightning_fed.trainer import FederatedTrainer
from lightning_fed.utilities.atomic import write_text_atomic
from lightning_fed.utilities.dependency_notices import without_dependency_notices
from lightning_fed.utilities.extras import MissingExtraError


class SaveConfigToRunDir(SaveConfigCallback):
    """Saves the resolved ``config.yaml`` in the run directory, beside ``summary.json``.

    Lightning's default puts it in ``trainer.log_dir``, which for W&B is the working directory: every run would
    overwrite the same file there. Each run directory is the run's own, so its config stays with its results.
    """

    @override
    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        federated_trainer(trainer, self)  # one clear error for a plain Trainer
        run_dir = resolve_run_dir(cast(FederatedTrainer, trainer))
        run_dir.mkdir(parents=True, exist_ok=True)
        if self.multifile:
            self.parser.save(
                self.config, str(run_dir / self.config_filename), skip_none=False, overwrite=True, multifile=True
            )
            return
        # Written beside its final name and moved into place: a crash never leaves half a config.yaml.
        write_text_atomic(run_dir / self.config_filename, self.parser.dump(self.config, skip_none=False))


#: Import paths that a config may not name, besides jsonargparse's own deny-list (``os``, ``subprocess``, ``shutil``,
#: ``pickle``, ``importlib``, ``functools``, ``builtins.eval``, ...): each downloads, compiles or unpickles code.
EXTRA_DENIED_IMPORT_PATHS = ("torch.hub", "torch.utils.cpp_extension", "pandas.read_pickle", "dill", "cloudpickle")


def enforce_import_denylist() -> None:
    """Makes jsonargparse refuse a config that names a denied import path, instead of only warning.

    A ``Callable`` argument takes the dotted path of any function, so without this a config could hand ``os.system``
    to, say, a dataset's ``is_valid_file`` and run a command for every file name while it is built. jsonargparse
    checks such paths against its deny-list but, until version 5, only warns (and the CLI holds warnings back);
    giving it any deny-list turns the check into an error, which ``main`` reports in one line before anything runs.
    The setting is process-wide, as jsonargparse's settings are (and enforcing is jsonargparse 5's default). An
    older jsonargparse without the deny-list has nothing to enforce: there a config can name any function.
    """
    if "import_path_denylist" in inspect.signature(set_parsing_settings).parameters:
        set_parsing_settings(import_path_denylist=list(EXTRA_DENIED_IMPORT_PATHS))


class FederatedCLI(LightningCLI):
    """LightningCLI whose trainer is :class:`~lightning_fed.FederatedTrainer`.

    ``model`` is any ``LightningModule`` (``class_path`` + ``init_args``) and ``data`` any
    :class:`~lightning_fed.datamodules.FederatedDataModule`. When the model takes ``num_classes`` and the YAML leaves
    it out, it is filled in from the datamodule. Unknown keys are rejected by the parser with the key's name.
    """

    def __init__(self, *args: Any, progress: CLIProgress | None = None, **kwargs: Any) -> None:
        # Set first: LightningCLI's constructor parses, builds and runs, and `main` reports a failure by stage.
        self.progress = progress if progress is not None else CLIProgress()
        enforce_import_denylist()
        kwargs.setdefault("save_config_callback", SaveConfigToRunDir)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True, "save_to_log_dir": False})
        # Positional arguments after the two classes are LightningCLI's own (save_config_callback, ...); the
        # keywords below are not among them.
        super().__init__(  # type: ignore[misc]
            LightningModule,
            FederatedDataModule,
            *args,
            trainer_class=kwargs.pop("trainer_class", FederatedTrainer),
            subclass_mode_model=True,
            subclass_mode_data=True,
            **kwargs,
        )

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--fill_num_classes",
            type=bool,
            default=True,
            help="Set the model's `num_classes` init argument from the datamodule when the YAML leaves it out.",
        )

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parses, then checks the settings that no constructor sees (``seed_everything``, output directories).

        Raises:
            InvalidArgumentError: A config entry names an import path that configs may not import
                (:func:`enforce_import_denylist`), named by its config path.
        """
        try:
            super().parse_arguments(parser, args)
        except Exception as error:
            # jsonargparse's `ImportDenied` (an ImportError) is private: it is known by its message.
            denied = next((_DENIED.search(str(link)) for link in exception_chain(error) if _is_denial(link)), None)
            if denied is None:
                given = _GIVEN_MODEL.search(str(error))
                if given is not None:
                    check_lightning_package(_loaded_class(given.group(1)))
                raise
            raise _denied_import_error(error, *denied.groups()) from error
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        self.progress.config, self.progress.subcommand = config, subcommand
        check_config(config)

    @override
    def _parse_ckpt_path(self) -> None:
        """Keeps the config as parsed: a checkpoint file never rewrites it.

        Lightning re-parses the model's config from a checkpoint file's ``hyper_parameters`` (its ``_class_path``
        included), so a ``--ckpt_path`` file would silently override the command line (``--model.init_args.lr``),
        defeat the fingerprint check that refuses a changed configuration, and let the checkpoint choose which
        module is imported. Here the command line and the config win, and a file resumes under the same rules as a
        run id (:func:`lightning_fed.run.resume.resolve_ckpt_path`). ``tests/engine/test_lightning_canary.py`` fails if
        Lightning stops calling this method, or calls it under another name.
        """

    @override
    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        self.progress.stage = "building"
        model, data = config.get("model"), config.get("data")
        if model is None or data is None or "init_args" not in model:
            return
        init_args = model["init_args"]
        if config.get("fill_num_classes", True) and "num_classes" in init_args and init_args["num_classes"] is None:
            init_args["num_classes"] = _num_classes_of(data)
        check_config_num_classes(model, data)

    def before_fit(self) -> None:
        """Checks the whole setup, data included, before ``fit`` writes anything."""
        self.check_before_run("fit")

    def before_validate(self) -> None:
        """Checks the whole setup, data included, before ``validate`` writes anything."""
        self.check_before_run("validate")

    def before_test(self) -> None:
        """Checks the whole setup, data included, before ``test`` writes anything."""
        self.check_before_run("test")

    def check_before_run(self, stage: str) -> None:
        """Runs every check of the settings that the run would otherwise meet only after it has started writing.

        Lightning creates the W&B run and saves ``config.yaml`` in its setup hook, before the datamodule's data is
        split and before the round loop checks the trainer against the data. Here the datamodule is set up first
        (its ``setup`` is idempotent, so the run's own call later does nothing), and the checks that need the data
        run on it. The data is only set up early in the process that starts the run: processes launched by a
        cluster or by ``torchrun`` load it in the run, as before.
        """
        self.progress.stage = "checking"
        trainer, model, datamodule = self.trainer, self.model, self.datamodule
        if isinstance(trainer, FederatedTrainer) and isinstance(datamodule, FederatedDataModule):
            if _starts_the_run(trainer):
                datamodule.prepare_data()
                datamodule.setup(stage)
            check_module_definition(model)
            check_optimization_setup(trainer, model, datamodule)
            check_federated_part(trainer, model)
            check_run_ids(trainer)
            with _prefixed("trainer."):
                check_num_classes(model, datamodule, name="model.init_args.num_classes")
                check_clients_per_round(trainer.sampler.clients_per_round, datamodule.num_clients)
                check_loss_scaling(trainer)
                trainer.aggregator.check_setup(trainer, datamodule)
                for callback in trainer.callbacks:
                    if isinstance(callback, FedCallback):
                        callback.check_setup(trainer, datamodule)
            # While Lightning's banner is held back: a refused resume is then the one line printed.
            config = self.config[self.subcommand] if self.subcommand else self.config
            check_resumable(trainer, model, datamodule, stage, config.get("ckpt_path"))
        self.progress.started()


@dataclass
class CLIProgress:
    """How far a ``lightning-fed`` command got, for :func:`main` to report a failure.

    Attributes:
        config: The parsed config of the subcommand (``None`` before parsing).
        subcommand: ``fit``, ``validate``, ...
        stage: ``"parsing"``, ``"building"`` (the config's objects), ``"checking"`` (the setup, before the run),
            ``"running"``.
        held: Lightning's log lines and warnings held back until the checks have passed.
    """

    config: Any = None
    subcommand: str | None = None
    stage: str = "parsing"
    held: HeldOutput = field(default_factory=HeldOutput)

    @property
    def before_run(self) -> bool:
        return self.stage != "running"

    def started(self) -> None:
        """The checks have passed: the run starts, and what was held back is printed."""
        self.stage = "running"
        self.held.release()


_DENIED = re.compile(r"Importing '([^']+)' is not allowed, denied by the '([^']+)' entry")


# The class a `model` entry named, in the parser's error: the value itself, or the `class_path` of a mapping.
_GIVEN_MODEL = re.compile(r'Parser key "model":.*Given value: (?:\{.*?\'class_path\': \')?([A-Za-z_][\w.]*)', re.S)


def _loaded_class(path: str) -> Any:
    """The class at an import path that the parser has already imported (nothing is imported here), or ``None``."""
    module_name, _, name = path.rpartition(".")
    return getattr(sys.modules.get(module_name), name, None)


def _is_denial(error: BaseException) -> bool:
    return isinstance(error, ImportError) and _DENIED.search(str(error)) is not None


def _denied_import_error(error: BaseException, path: str, entry: str) -> InvalidArgumentError:
    """The one-line error for a config entry that names the denied import ``path``, by the entry's config path."""
    # jsonargparse names the entry only in its nested parse error; its one-line summary starts with the path.
    name = re.match(r"`([^`]+)`", parser_error_line(str(error)))
    return InvalidArgumentError(
        name.group(1) if name else "config",
        path,
        f"an import path that configs may import, and {entry!r} is denied (configs may not name code that runs"
        " commands, changes files or loads code: os, subprocess, shutil, pickle, importlib, ...; see"
        ' "Configs are code" in docs/cli.md)',
    )


def check_config(config: Any) -> None:
    """Checks the parsed settings that no constructor checks, by their config paths."""
    check_seed_everything("seed_everything", config.get("seed_everything"))
    check_checkpoint_path("ckpt_path", config.get("ckpt_path"))
    trainer = config.get("trainer")
    if trainer is None:
        return
    check_epoch_args(trainer, prefix="trainer.")
    check_lightning_settings(trainer.get("check_val_every_n_epoch"), prefix="trainer.")
    check_output_dir("trainer.default_root_dir", trainer.get("default_root_dir"))
    check_output_dir("trainer.run_dir", trainer.get("run_dir"))


def check_config_num_classes(model: Any, data: Any) -> None:
    """The model's ``num_classes`` (and its backbone's) must be the datamodule's, when the config says them."""
    data_classes = _num_classes_of(data)
    if data_classes is None:
        return
    entries = [("model.init_args.num_classes", model["init_args"].get("num_classes"))]
    backbone = model["init_args"].get("backbone")
    if backbone is not None and hasattr(backbone, "get") and backbone.get("init_args") is not None:
        entries.append(("model.init_args.backbone.init_args.num_classes", backbone["init_args"].get("num_classes")))
    for name, value in entries:
        if value is not None and value != data_classes:
            allowed = (
                f"the datamodule's number of classes, {data_classes} ({str(data['class_path']).rpartition('.')[2]})"
            )
            raise InvalidArgumentError(name, value, allowed)


def _starts_the_run(trainer: FederatedTrainer) -> bool:
    """Whether this process starts the run (it is alone, or it will launch the others), not one launched for it."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    return environment is None or not environment.creates_processes_externally


@contextmanager
def _prefixed(prefix: str) -> Iterator[None]:
    """Names an :class:`InvalidArgumentError` raised inside by its config path (``clients_per_round`` →
    ``trainer.clients_per_round``), unless it already is one."""
    try:
        yield
    except InvalidArgumentError as error:
        if "." in error.argument:
            raise
        raise InvalidArgumentError(prefix + error.argument, error.value, error.allowed) from error


def _num_classes_of(data_config: Any) -> int | None:
    """The datamodule class's ``num_classes`` (a class attribute or an init argument) without building it."""

    init_args = data_config.get("init_args") or {}
    if init_args.get("num_classes") is not None:
        return int(init_args["num_classes"])
    module_name, _, class_name = str(data_config["class_path"]).rpartition(".")
    value = getattr(getattr(importlib.import_module(module_name), class_name), "num_classes", None)
    return value if isinstance(value, int) else None


#: The entry-point group of the extra subcommands: ``name = "module:function"``, where ``function(argv)`` takes the
#: arguments after the name and returns the exit status. Another distribution adds ``lightning-fed NAME`` by
#: declaring it there; this package never imports it by name.
COMMANDS_GROUP = "lightning_fed.commands"

#: LightningCLI's own subcommands, which an extra command cannot replace.
_LIGHTNING_SUBCOMMANDS = frozenset({"fit", "validate", "test", "predict"})

#: Extra subcommands that the documentation names, and what to install for each when it is missing.
_MISSING_COMMAND_HINTS = {
    "reproduce": (
        "the reproduction suite is not installed. It ships with the repository, not with the package: from a"
        " checkout's root, run `pip install -e benchmarks/` (or `python benchmarks/reproduce.py ...`)."
    ),
}


def extra_commands() -> dict[str, EntryPoint]:
    """The subcommands that installed distributions declare in the :data:`COMMANDS_GROUP` entry-point group."""
    found = {entry.name: entry for entry in entry_points(group=COMMANDS_GROUP)}
    return {name: entry for name, entry in found.items() if name not in _LIGHTNING_SUBCOMMANDS}


def run_extra_command(name: str, argv: Sequence[str]) -> int | None:
    """Runs the extra subcommand ``name`` on ``argv`` and returns its exit status; ``None`` if ``name`` is none.

    A subcommand that the documentation names but that is not installed prints one line saying what to install
    and returns 2.
    """
    entry = extra_commands().get(name)
    if entry is not None:
        try:
            return int(entry.load()(list(argv)) or 0)
        except MissingExtraError as missing:
            print(f"lightning-fed {name}: {missing}", file=sys.stderr)
            return 2
    if name in _MISSING_COMMAND_HINTS:
        print(f"lightning-fed {name}: {_MISSING_COMMAND_HINTS[name]}", file=sys.stderr)
        return 2
    return None


def main(args: Sequence[str] | None = None) -> None:
    """Console entry point of ``lightning-fed``.

    A bad input (an invalid argument, config entry or data setting; an unknown key; a value of the wrong type)
    exits with status 2 and two lines on stderr: the setting's config path with the value given and what is
    allowed, e.g. ``lightning-fed fit: `trainer.num_rounds` must be an integer >= 1; got 0.``, and how to see the
    traceback. Every check runs before the run writes anything (no run directory, ``config.yaml``, checkpoint or
    W&B run is left behind). Lightning's log lines and warnings are held back until the checks have passed.

    Set the environment variable ``LIGHTNING_FED_TRACEBACK=1`` to get Python's traceback for a bad input
    instead. Errors raised once the run has started (after the checks) always show their traceback.

    Args:
        args: The command line without the program name; ``None`` reads ``sys.argv``.
    """
    argv = list(sys.argv[1:] if args is None else args)
    # LightningCLI's subcommands are fixed (fit, validate, test, ...): the extra ones are dispatched before it parses.
    if argv and argv[0] not in _LIGHTNING_SUBCOMMANDS and not argv[0].startswith("-"):
        status = run_extra_command(argv[0], argv[1:])
        if status is not None:
            sys.exit(status)
    # Entered before the output is held: holding restores the warning filters it found when it lets go.
    with without_dependency_notices():
        _run_cli(args, argv)


def _run_cli(args: Sequence[str] | None, argv: list[str]) -> None:
    if traceback_requested():
        FederatedCLI(args=None if args is None else argv)
        return
    progress = CLIProgress(subcommand=argv[0] if argv and not argv[0].startswith("-") else None)
    progress.held.hold()
    try:
        FederatedCLI(args=None if args is None else argv, parser_kwargs={"exit_on_error": False}, progress=progress)
    except Exception as error:
        line = error_line(error, progress.config, before_run=progress.before_run)
        if line is None:
            progress.held.release()
            raise
        if find_environment_error(error) is not None:
            # W&B's service and log files are on the same full or read-only disk: its teardown at exit would print
            # a traceback for every record it fails to write.
            end_run_quietly()
        progress.held.discard()
        sys.stderr.write(report(line, progress.subcommand))
        sys.exit(2)
    finally:
        # `--help`, `--print_config` and subcommands without checks (predict) end here with nothing to report.
        progress.held.release()


if __name__ == "__main__":
    main()
