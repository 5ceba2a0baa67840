"""Every Python and YAML block of the documentation (docs/ and README.md) is run or checked, so the docs cannot rot.

* A Python block is executed, in a fresh namespace and an empty working directory, unless an HTML comment right
  above it says ``<!-- docs-test: compile, names: A, B -->``: it is then compiled, its imports run, every name it
  uses must be imported, defined, a builtin or one of the listed placeholders (``MyLightningModule``: the user's
  own class), and every call to an imported class or function must bind to its signature. That marker is for
  blocks that would train for minutes or need data that tests do not download.
* A marker may also name the optional modules a block needs (``<!-- docs-test: run, needs: transformers, peft
  -->``): without them the block is skipped (the README's command installs no extras; CI installs them).
* A YAML block is parsed. One that is a LightningCLI config (top-level ``trainer``, ``model`` or ``data``) is laid
  over ``configs/quickstart.yaml`` (a section naming another ``class_path`` replaces the quickstart's) and built by
  ``lightning-fed``'s own parser, as the presets are in ``tests/cli/test_cli.py``.
* Every ``configs/...yaml`` and ``benchmarks/...`` path the pages name exists.
"""

from __future__ import annotations

import ast
import builtins
import copy
import importlib
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from lightning_fed import FederatedTrainer
from lightning_fed.cli.main import FederatedCLI

ROOT = Path(__file__).parents[2]
PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
CLI_SECTIONS = {"trainer", "model", "data"}

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
_MARKER = re.compile(
    r"<!-- docs-test: (?P<mode>\w+)(?:, names: (?P<names>[\w, ]+?))?(?:, needs: (?P<needs>[\w, ]+))? -->\s*$"
)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    mode: str  # "run" or "compile"
    placeholders: frozenset[str]
    needs: tuple[str, ...] = ()  # optional modules (an extra's); the block is skipped without them

    def skip_without_its_modules(self) -> None:
        for module in self.needs:
            pytest.importorskip(module, reason=f"{self.name} needs {module} (an optional extra, e.g. `llm`)")

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        indent = len(match["indent"])
        code = "\n".join(line[indent:] for line in match["body"].splitlines())
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.search(before)
        names = frozenset(n.strip() for n in (marker["names"] or "").split(",") if n.strip()) if marker else frozenset()
        needs = tuple(n.strip() for n in (marker["needs"] or "").split(",") if n.strip()) if marker else ()
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(page, line, match["lang"], code, marker["mode"] if marker else "run", names, needs))
    return found


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]
PYTHON = [b for b in ALL_BLOCKS if b.lang == "python"]
YAML = [b for b in ALL_BLOCKS if b.lang == "yaml"]


def test_the_pages_have_the_blocks_this_test_checks():
    # Catches a fence this file's pattern stopped seeing (then nothing below would run).
    assert len(PYTHON) >= 3 and len(YAML) >= 4
    assert {b.mode for b in PYTHON} <= {"run", "compile"}
    # ... or a marker whose `needs` it stopped reading (then those blocks would run without their extra).
    assert any(b.needs for b in ALL_BLOCKS)


@pytest.mark.parametrize("block", [b for b in PYTHON if b.mode == "run"], ids=lambda b: b.name)
def test_python_block_runs(block, tmp_path, monkeypatch):
    block.skip_without_its_modules()
    monkeypatch.chdir(tmp_path)  # what a block writes (runs/, W&B) lands here
    monkeypatch.setenv("WANDB_MODE", "offline")
    exec(compile(block.code, block.name, "exec"), {"__name__": "__docs__"})


def _imported(tree: ast.Module) -> dict[str, object]:
    """Runs the block's imports; returns the names they bind."""
    namespace: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            exec(compile(ast.Module([node], []), "<imports>", "exec"), namespace)
    namespace.pop("__builtins__", None)
    return namespace


def _assigned(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def _callee(node: ast.expr, namespace: dict[str, object]) -> object | None:
    if isinstance(node, ast.Name):
        return namespace.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _callee(node.value, namespace)
        if owner is None:
            return None
        assert hasattr(owner, node.attr), f"{ast.unparse(node)} does not exist"
        return getattr(owner, node.attr)
    return None


@pytest.mark.parametrize("block", [b for b in PYTHON if b.mode == "compile"], ids=lambda b: b.name)
def test_python_block_compiles_and_its_names_resolve(block):
    block.skip_without_its_modules()
    tree = ast.parse(block.code, block.name)
    imported = _imported(tree)
    known = set(imported) | _assigned(tree) | set(dir(builtins)) | block.placeholders
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    assert used <= known, f"{block.name} uses undefined names {sorted(used - known)}"
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        target = _callee(call.func, imported)
        if target is None or not callable(target):
            continue
        args = [object() for _ in call.args]
        kwargs = {k.arg: object() for k in call.keywords if k.arg is not None}
        try:
            inspect.signature(target).bind(*args, **kwargs)
        except TypeError as err:
            pytest.fail(f"{block.name}: `{ast.unparse(call)[:80]}` does not match {target}'s signature: {err}")


def _lay_over(base: dict, fragment: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in fragment.items():
        old = merged.get(key)
        if (
            isinstance(value, dict)
            and isinstance(old, dict)
            and value.get("class_path", old.get("class_path")) == old.get("class_path")
        ):
            merged[key] = _lay_over(old, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@pytest.mark.parametrize("block", YAML, ids=lambda b: b.name)
def test_yaml_block_parses_and_cli_configs_build(block, tmp_path):
    config = yaml.safe_load(block.code)
    assert isinstance(config, dict), f"{block.name} is not a YAML mapping"
    if not set(config) & CLI_SECTIONS:
        return
    block.skip_without_its_modules()
    merged = _lay_over(yaml.safe_load(QUICKSTART.read_text()), config)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(merged))
    cli = FederatedCLI(
        args=["--config", str(path), "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path)],
        run=False,
    )
    assert isinstance(cli.trainer, FederatedTrainer)
    for section, value in config.items():  # what the block sets is what was built
        if section == "trainer":
            for key, setting in value.items():
                if isinstance(setting, list):  # callbacks: each one named is built
                    built_types = {f"{type(c).__module__}.{type(c).__name__}" for c in getattr(cli.trainer, key)}
                    for item in setting:
                        module, _, name = item["class_path"].rpartition(".")
                        wanted = getattr(importlib.import_module(module), name)
                        assert any(isinstance(c, wanted) for c in getattr(cli.trainer, key)), built_types
                elif not isinstance(setting, dict) and hasattr(cli.trainer, key):
                    assert getattr(cli.trainer, key) == setting, f"{block.name}: trainer.{key}"
        if isinstance(value, dict) and "class_path" in value:
            built = {"model": cli.model, "data": cli.datamodule}[section]
            module, _, name = value["class_path"].rpartition(".")
            assert isinstance(built, getattr(importlib.import_module(module), name))


_REPOSITORY_PATH = re.compile(r"(?<![\w/.-])((?:configs|benchmarks)/[^\s`)\]|'\"]*)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_configs_and_benchmarks_a_page_names_exist(page):
    text = page.read_text(encoding="utf-8")
    named = {path.rstrip(".,:;") for path in _REPOSITORY_PATH.findall(text)}
    # A pattern (`<preset>.yaml`, `*.yaml`, `{a,b}.yaml`) names a family of files, not one.
    missing = sorted(p for p in named if not any(c in p for c in "*<{") and not (ROOT / p).exists())
    assert not missing, f"{page.name} names {missing}, which are not in the repository"
