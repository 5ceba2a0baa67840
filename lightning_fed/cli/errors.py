"""How ``lightning-fed`` reports a bad argument: one line that names it, instead of a traceback.

An invalid setting can fail in many places: jsonargparse's parser (unknown key, wrong type), a constructor that
jsonargparse calls while it builds the objects of the config (whose error it buries in a dump of every union
alternative), or a check that runs once the data is loaded. Each of them is reduced here to the line that matters::

    lightning-fed: `data.init_args.partitioner.init_args.alpha` must be a finite number > 0.0; got -1.0.

The argument's name is the config path the user wrote: a constructor's
:class:`~lightning_fed.checks.InvalidArgumentError` names its own argument (``alpha``), and the path of the object
that was being built (``data.init_args.partitioner``) is found by matching the class of the object under
construction against the ``class_path`` entries of the parsed config.

An error of the environment once the run has started (a full disk, a read-only file system, a permission denied
while writing) is reported the same way, by its message alone (:func:`environment_error_line`): the user can act on
it, and the traceback of the library's writer would only bury it.

Set the environment variable ``LIGHTNING_FED_TRACEBACK=1`` to get the full traceback instead.
"""

from __future__ import annotations

import errno
import importlib
import logging
import os
import re
import warnings
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Trainer

from lightning_fed.checks import InvalidArgumentError
from lightning_fed.run.resume import ResumeError
from lightning_fed.utilities.extras import MissingExtraError

TRACEBACK_ENV = "LIGHTNING_FED_TRACEBACK"
"""Environment variable that, set to anything but ``""``/``0``/``false``, shows tracebacks of bad-input errors."""

PROGRAM = "lightning-fed"
TRACEBACK_HINT = f"(set {TRACEBACK_ENV}=1 for the traceback)"


def traceback_requested() -> bool:
    """Whether the user asked for tracebacks of bad-input errors (``LIGHTNING_FED_TRACEBACK``)."""
    return os.environ.get(TRACEBACK_ENV, "").strip().lower() not in ("", "0", "false", "no")


def exception_chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and every exception it was raised from or while handling (unless suppressed), outermost first."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)


def find_invalid_argument(error: BaseException) -> InvalidArgumentError | None:
    """The outermost :class:`InvalidArgumentError` in ``error``'s chain.

    jsonargparse wraps a constructor's error in its own; a check that catches another's error and raises its own
    (``raise InvalidArgumentError(...) from error``) knows more, so the outermost one is the one to report.
    """
    return next((link for link in exception_chain(error) if isinstance(link, InvalidArgumentError)), None)


def is_parser_error(error: BaseException) -> bool:
    """Whether ``error`` is jsonargparse's ``ArgumentError`` (a parse failure: unknown key, wrong type, ...)."""
    from jsonargparse import ArgumentError

    return isinstance(error, ArgumentError)


# ----------------------------------------------------------------------------------------------------------------
# Where in the config an object was being built


def _walk_config(node: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every ``(path, node)`` of a parsed config (a jsonargparse ``Namespace``, dicts and lists)."""
    yield path, node
    if hasattr(node, "items") and callable(node.items):
        items = node.items(branches=True) if _is_namespace(node) else node.items()
        for key, value in items:
            yield from _walk_config(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            yield from _walk_config(value, f"{path}[{index}]")


def _is_namespace(node: Any) -> bool:
    from jsonargparse import Namespace

    return isinstance(node, Namespace)


def _get(node: Any, key: str) -> Any:
    if _is_namespace(node) or isinstance(node, dict):
        return node.get(key)
    return None


def _import(class_path: str) -> Any:
    module_name, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _class_paths(config: Any) -> list[tuple[str, type, Any]]:
    """``(path, class, init_args)`` of every ``class_path`` entry of the config."""
    found = []
    for path, node in _walk_config(config, ""):
        class_path = _get(node, "class_path")
        if isinstance(class_path, str):
            cls = _import(class_path)
            if isinstance(cls, type):
                found.append((path, cls, _get(node, "init_args")))
    return found


def _objects_under_construction(error: BaseException) -> list[Any]:
    """The ``self`` of every method on ``error``'s traceback, innermost first (constructors, ``setup``, ...)."""
    objects = []
    traceback: TracebackType | None = error.__traceback__
    while traceback is not None:
        candidate = traceback.tb_frame.f_locals.get("self")
        if candidate is not None:
            objects.append(candidate)
        traceback = traceback.tb_next
    return objects[::-1]


def component_path(error: BaseException, config: Any) -> str | None:
    """The config path of the innermost object of the config on ``error``'s traceback (``trainer`` for the
    trainer), e.g. ``data`` for an error raised while the datamodule loaded its data; ``None`` if none is."""
    if config is None:
        return None
    entries = _class_paths(config)
    for obj in _objects_under_construction(error):
        if isinstance(obj, Trainer):
            return "trainer"
        path = next((path for path, cls, _ in entries if type(obj) is cls), None)
        if path is not None:
            return path
    return None


def argument_path(error: InvalidArgumentError, config: Any) -> str:
    """The config path of ``error.argument``: e.g. ``model.init_args.lr`` for ClassifierModule's ``lr``.

    An argument already named by its path (it contains a dot) is returned as is. Otherwise the objects on the
    traceback are looked up, innermost first, among the config's ``class_path`` entries (the trainer is
    ``trainer``); among several entries of one class, the one whose ``init_args`` hold the offending value wins.
    """
    name = error.argument
    if "." in name or config is None:
        return name
    entries = _class_paths(config)
    for obj in _objects_under_construction(error):
        if isinstance(obj, Trainer):
            return f"trainer.{name}"
        matches = [(path, init_args) for path, cls, init_args in entries if type(obj) is cls]
        if matches:
            exact = [path for path, init_args in matches if _same(_get(init_args, name), error.value)]
            path = (exact or [path for path, _ in matches])[0]
            return f"{path}.init_args.{name}"
    return name


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # tensors and other values without a plain truth value
        return False


# ----------------------------------------------------------------------------------------------------------------
# jsonargparse's messages

_PARSER_KEY = re.compile(r'^Parser key "([^"]+)":\s*(.*)$')
_CLASS_PATH = re.compile(r"^Problem with given class_path '([^']+)':\s*(.*)$")
_EXPECTED = re.compile(r"^Expected an? (.+?)\. Got value: (.*)$")
_NOT_ACCEPTED = re.compile(r"^Option '([^']+)' is not accepted")
_REQUIRED = re.compile(r"^the following arguments are required: (.*)$")
_UNRECOGNIZED = re.compile(r"^unrecognized arguments: (\S+)(?:\s+(.*))?$")
_KEY_NOT_EXPECTED = re.compile(r'^Key "([^"]+)" is not expected')
_IMPORT = re.compile(r"^Expected a dot import path string: (.*)$|^Import path (\S+)")
_SUBTYPES = re.compile(r"^Subtypes: \[<class '([^']+)'>")
_SKIP = ("Does not validate against", "Subtypes:", "Errors:", "Given value", "Expected a <class 'NoneType'>")


def _type_name(text: str) -> str:
    """``<class 'int'>`` → ``an integer``; anything else as jsonargparse wrote it."""
    names = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string"}
    match = re.fullmatch(r"<class '([\w.]+)'>", text)
    if match:
        return names.get(match.group(1), f"a {match.group(1).rpartition('.')[2]}")
    match = re.fullmatch(r"typing\.Literal\[(.*)\]", text)
    if match:
        return f"one of {match.group(1)}"
    return text


def parser_error_line(message: str) -> str:
    """Reduces one of jsonargparse's (multi-line, nested) parse errors to ```name` must be ...; got ...``."""
    lines = [line.strip().removeprefix("- ").strip() for line in message.splitlines()]
    keys: list[str] = []
    base = None
    for line in lines:
        if not line:
            continue
        match = _UNRECOGNIZED.match(line)
        if match:
            flag = match.group(1).split("=", 1)[0].lstrip("-")
            return f"`{flag}` is not an accepted argument (misspelt, or not an argument of the class given)."
        match = _KEY_NOT_EXPECTED.match(line)
        if match:
            return f"`{'.'.join([*keys, match.group(1)])}` is not an accepted argument (misspelt?)."
        match = _PARSER_KEY.match(line)
        if match:
            keys.append(match.group(1))
            line = match.group(2)
            if not line:
                continue
        match = _CLASS_PATH.match(line)
        if match:
            keys.append("init_args")
            line = match.group(2)
            if not line:
                continue
        match = _SUBTYPES.match(line)
        if match and base is None:
            base = match.group(1).rpartition(".")[2]
        if line.startswith(_SKIP) or line.startswith("Expected a path but"):
            continue
        name = ".".join(keys) or "config"
        match = _EXPECTED.match(line)
        if match:
            return f"`{name}` must be {_type_name(match.group(1))}; got {match.group(2)!r}."
        match = _REQUIRED.match(line)
        if match:
            missing = ", ".join(f"`{name}.{key.strip()}`" for key in match.group(1).split(","))
            return f"{missing} must be given (a required argument without a default)."
        match = _NOT_ACCEPTED.match(line)
        if match:
            return f"`{name}.{match.group(1)}` is not an accepted argument of `{name.removesuffix('.init_args')}`."
        match = _IMPORT.match(line)
        if match:
            value = match.group(1) or match.group(2)
            allowed = f"the import path of a subclass of {base}" if base else "an importable class path"
            return f"`{name}` must be {allowed}; got {value!r}."
        return f"`{name}`: {line}"
    return next((line for line in lines if line), "invalid arguments")


# ----------------------------------------------------------------------------------------------------------------
# Errors of the environment

#: ``errno`` values that say the environment refused a write, with what the user can do about each.
ENVIRONMENT_ERRNOS: dict[int, str] = {
    errno.ENOSPC: "free some space (or choose another `trainer.default_root_dir`), then resume with --ckpt_path last",
    errno.EDQUOT: "free some of your quota (or choose another `trainer.default_root_dir`), then resume with"
    " --ckpt_path last",
    errno.EROFS: "the file system is read-only: choose a writable `trainer.default_root_dir`",
    errno.EACCES: "give this process permission there, or choose another `trainer.default_root_dir`",
    errno.EPERM: "give this process permission there, or choose another `trainer.default_root_dir`",
}


def find_environment_error(error: BaseException) -> OSError | None:
    """The outermost ``OSError`` in ``error``'s chain whose ``errno`` is in :data:`ENVIRONMENT_ERRNOS`."""
    return next(
        (link for link in exception_chain(error) if isinstance(link, OSError) and link.errno in ENVIRONMENT_ERRNOS),
        None,
    )


def environment_error_line(error: OSError) -> str:
    """One line for a write the environment refused: what failed, where, why (``errno`` name) and what to do.

    A message of the library's own (``DiskFullError``, a refused run directory) already says what to do and is kept
    as it is; the system's bare reason (``No space left on device``) is completed with the file and the advice.
    """
    code = error.errno if error.errno is not None else 0
    name = errno.errorcode.get(code, str(code))
    message = " ".join((error.strerror or str(error)).split())
    if message != os.strerror(code):
        return f"{message} [{name}]"
    where = f"{error.filename}: " if error.filename is not None else ""
    return f"{where}{message} [{name}]; {ENVIRONMENT_ERRNOS[code]}."


# ----------------------------------------------------------------------------------------------------------------
# The message


def error_line(error: BaseException, config: Any = None, before_run: bool = False) -> str | None:
    """The one line that reports ``error`` as a bad input, or ``None`` when it is not one (a bug: show it).

    Args:
        error: What was raised.
        config: The parsed config, to turn an argument's name into its config path.
        before_run: Whether ``error`` was raised while the config's objects were built or checked, before the run:
            a ``ValueError``, ``TypeError``, ``OSError`` or Lightning ``MisconfigurationException`` raised then is a
            consequence of the settings, reported by its message, prefixed with the config entry it came from.
    """

    resume = next((link for link in exception_chain(error) if isinstance(link, ResumeError)), None)
    if resume is not None:
        # A refused resume names what to change itself (one line per differing setting): no traceback adds to it.
        return str(resume)
    missing = next((link for link in exception_chain(error) if isinstance(link, MissingExtraError)), None)
    if missing is not None:
        # A component the config names needs an optional extra: the line names the extra to install.
        return str(missing)
    invalid = find_invalid_argument(error)
    if invalid is not None:
        path = argument_path(invalid, config)
        return f"`{path}` must be {invalid.allowed}; got {invalid.value!r}."
    if is_parser_error(error):
        return parser_error_line(str(error))
    environment = find_environment_error(error)
    if environment is not None:
        return environment_error_line(environment)
    if before_run and isinstance(error, (ValueError, TypeError, OSError, MisconfigurationException)):
        text = " ".join(str(error).split()) or type(error).__name__
        where = component_path(error, config)
        return f"`{where}`: {text}" if where else text
    return None


def report(line: str, subcommand: str | None = None) -> str:
    """The text printed on stderr for a bad input: the line, then how to see the traceback (two lines)."""
    program = f"{PROGRAM} {subcommand}" if subcommand else PROGRAM
    return f"{program}: {line}\n{TRACEBACK_HINT}\n"


# ----------------------------------------------------------------------------------------------------------------
# Output held back until the settings have passed their checks


class HeldOutput:
    """Holds back Lightning's log records and Python warnings until :meth:`release`.

    Building the trainer logs several lines ("GPU available: ...") and may warn; a run that then fails its checks
    should print only its one-line error, while a run that passes prints everything as before, just later.
    """

    _LOGGERS = ("lightning.pytorch", "lightning.fabric")

    def __init__(self) -> None:
        self._records: list[logging.LogRecord] = []
        self._handlers: dict[str, list[logging.Handler]] = {}
        self._warnings: warnings.catch_warnings | None = None
        self._caught: list[warnings.WarningMessage] = []
        self._holding = False

    def hold(self) -> None:
        """Starts holding back log records and warnings."""
        collector = _Collector(self._records)
        for name in self._LOGGERS:
            logger = logging.getLogger(name)
            self._handlers[name] = list(logger.handlers)
            logger.handlers = [collector]
        self._warnings = warnings.catch_warnings(record=True)
        self._caught = self._warnings.__enter__()
        self._holding = True

    def _stop(self) -> None:
        if not self._holding:
            return
        self._holding = False
        for name, handlers in self._handlers.items():
            logging.getLogger(name).handlers = handlers
        assert self._warnings is not None
        self._warnings.__exit__(None, None, None)

    def release(self) -> None:
        """Stops holding and prints what was held, in order (log records first, then warnings)."""
        if not self._holding:
            return
        self._stop()
        for record in self._records:
            logging.getLogger(record.name).handle(record)
        for caught in self._caught:
            warnings.showwarning(caught.message, caught.category, caught.filename, caught.lineno, caught.file)
        self._records.clear()
        self._caught.clear()

    def discard(self) -> None:
        """Stops holding and drops what was held (the run failed its checks: only the error is printed)."""
        self._stop()
        self._records.clear()
        self._caught.clear()


class _Collector(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__()
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


__all__ = [
    "ENVIRONMENT_ERRNOS",
    "TRACEBACK_ENV",
    "HeldOutput",
    "argument_path",
    "environment_error_line",
    "error_line",
    "find_environment_error",
    "find_invalid_argument",
    "parser_error_line",
    "report",
    "traceback_requested",
]
