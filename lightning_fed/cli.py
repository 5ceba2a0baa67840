"""``lightning-fed``: LightningCLI with federated defaults.

Examples::

    lightning-fed fit --config configs/quickstart.yaml
    lightning-fed fit --config configs/quickstart.yaml --trainer.num_rounds 5
    lightning-fed fit --config configs/quickstart.yaml --ckpt_path last      # resume a killed run
    lightning-fed fit --config configs/quickstart.yaml --print_config
    lightning-fed reproduce --profile small     # the papers' claims, from a repository checkout (benchmarks/reproduce/)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from typing_extensions import override

from lightning_fed.callbacks.base import federated_trainer
from lightning_fed.datamodules.base import FederatedDataModule
from lightning_fed.reporting import resolve_run_dir
from lightning_fed.trainer import FederatedTrainer


class SaveConfigToRunDir(SaveConfigCallback):
    """Saves the resolved ``config.yaml`` in the run directory, beside ``summary.json``.

    Lightning's default puts it in ``trainer.log_dir``, which for W&B is the working directory: every run would
    overwrite the same file there. Each run directory is the run's own, so its config stays with its results.
    """

    @override
    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        run_dir = resolve_run_dir(federated_trainer(trainer, self))
        run_dir.mkdir(parents=True, exist_ok=True)
        self.parser.save(
            self.config, str(run_dir / self.config_filename), skip_none=False, overwrite=True, multifile=self.multifile
        )


class FederatedCLI(LightningCLI):
    """LightningCLI whose trainer is :class:`~lightning_fed.FederatedTrainer`.

    ``model`` is any ``LightningModule`` (``class_path`` + ``init_args``) and ``data`` any
    :class:`~lightning_fed.datamodules.FederatedDataModule`. When the model takes ``num_classes`` and the YAML leaves
    it out, it is filled in from the datamodule. Unknown keys are rejected by the parser with the key's name.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("save_config_callback", SaveConfigToRunDir)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True, "save_to_log_dir": False})
        # Positional arguments after the two classes are LightningCLI's own (save_config_callback, ...); the
        # keywords below are not among them.
        super().__init__(  # type: ignore[misc]
            LightningModule,
            FederatedDataModule,
            *args,
            trainer_class=FederatedTrainer,
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
    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if not config.get("fill_num_classes", True):
            return
        model, data = config.get("model"), config.get("data")
        if model is None or data is None or "init_args" not in model:
            return
        init_args = model["init_args"]
        if "num_classes" in init_args and init_args["num_classes"] is None:
            init_args["num_classes"] = _num_classes_of(data)


def _num_classes_of(data_config: Any) -> int | None:
    """The datamodule class's ``num_classes`` (a class attribute or an init argument) without building it."""

    init_args = data_config.get("init_args") or {}
    if init_args.get("num_classes") is not None:
        return int(init_args["num_classes"])
    module_name, _, class_name = str(data_config["class_path"]).rpartition(".")
    value = getattr(getattr(importlib.import_module(module_name), class_name), "num_classes", None)
    return value if isinstance(value, int) else None


_REPRODUCE_COMMAND = Path("benchmarks", "reproduce", "command.py")
# A checkout when the package is installed in editable mode (or imported from the repository root).
_PACKAGE_PARENT = Path(__file__).resolve().parents[1]


def find_checkout(argv: Sequence[str] = (), start: Path | None = None) -> Path | None:
    """The repository checkout that holds the reproduction suite (``benchmarks/reproduce/``), or ``None``.

    Looked for, in order: the ``--root`` given in ``argv``; ``start`` (default: the working directory) and its
    parents; the directory above this package, which is a checkout when the package is installed in editable mode.
    """
    candidates: list[Path] = []
    for i, arg in enumerate(argv):
        if arg == "--root" and i + 1 < len(argv):
            candidates.append(Path(argv[i + 1]))
        elif arg.startswith("--root="):
            candidates.append(Path(arg.split("=", 1)[1]))
    here = (start or Path.cwd()).resolve()
    candidates += [here, *here.parents, _PACKAGE_PARENT]
    return next((path.resolve() for path in candidates if (path / _REPRODUCE_COMMAND).is_file()), None)


def reproduce(argv: Sequence[str]) -> int:
    """``lightning-fed reproduce``: runs the reproduction suite of the repository checkout found by
    :func:`find_checkout`.

    The suite is not part of the installed package: its runs are the YAML files under the repository's
    ``configs/``. Outside a checkout this exits with a message that says how to get one.
    """
    checkout = find_checkout(argv)
    if checkout is None:
        print(
            "lightning-fed reproduce: no lightning-fed repository checkout found. The reproduction suite"
            f" ({_REPRODUCE_COMMAND.parent}/) and its configs/ ship with the repository, not with the installed"
            " package: clone the repository and run the command from its root, or pass --root PATH_TO_CHECKOUT.",
            file=sys.stderr,
        )
        return 2
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    command = importlib.import_module("benchmarks.reproduce.command")
    if not Path(command.__file__ or "").resolve().is_relative_to(checkout):
        print(
            f"lightning-fed reproduce: `benchmarks` was imported from {command.__file__}, not from the checkout"
            f" {checkout}: another package named `benchmarks` shadows it. Run `python benchmarks/reproduce.py`"
            " from the checkout's root instead.",
            file=sys.stderr,
        )
        return 2
    return int(command.main(list(argv)))


def main() -> None:
    """Console entry point of ``lightning-fed``."""
    # LightningCLI's subcommands are fixed (fit, validate, test, ...): `reproduce` is dispatched before it parses.
    if sys.argv[1:2] == ["reproduce"]:
        sys.exit(reproduce(sys.argv[2:]))
    FederatedCLI()


if __name__ == "__main__":
    main()
