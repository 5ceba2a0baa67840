"""The package's import rules: every module imports on its own, no run-time import cycle, the layers contract.

The layers themselves (``cli`` > ``trainer``/``run`` > the algorithms > ``engine`` > ...) are import-linter's
contract in ``pyproject.toml``; ``lint-imports`` checks it in CI, and :func:`test_layers_contract` here when it is
installed. The cycle check is this file's own: import-linter counts imports under ``if TYPE_CHECKING:``, which never
run, while a cycle of imports that do run makes a module's import fail or depend on which module came first.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_fed"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _run_time_imports(tree: ast.AST, module_level: bool = True) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at module level or in a function, except those under ``if TYPE_CHECKING:`` and those
    in a module's ``__getattr__`` (PEP 562: it runs when a name is looked up on the module, not when it is
    imported, which is how an old import path of a name that moved keeps working)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _run_time_imports(ast.Module(body=[child], type_ignores=[]), module_level)
            continue
        if module_level and isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _run_time_imports(node, module_level=False)


def import_graph() -> dict[str, set[str]]:
    """Module -> the ``lightning_fed`` modules its run-time import statements name.

    ``from package import name`` points at ``package.name`` when that is a module, else at ``package`` (its
    ``__init__``). The parent packages that Python initialises on the way are not counted: every module would
    otherwise be in a cycle with ``lightning_fed/__init__.py``, which Python resolves by initialising the parent first.
    """
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _run_time_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in modules else base)
        graph[name] = {target for target in targets if target in modules and target != name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle per strongly connected component of ``graph`` with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the graph has ~150 nodes, recursion is fine.
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_shortest_cycle(graph, component) for component in components]


def _shortest_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    best: list[str] = []
    for start in sorted(component):
        paths = {start: [start]}
        frontier = [start]
        while frontier:
            following = []
            for node in frontier:
                for target in sorted(graph[node] & component):
                    if target == start and (not best or len(paths[node]) < len(best) - 1):
                        best = [*paths[node], start]
                    if target not in paths:
                        paths[target] = [*paths[node], target]
                        following.append(target)
            frontier = following
    return best


def test_find_cycles_reports_a_cycle_and_ignores_a_chain():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_import_graph_skips_type_checking_imports(tmp_path):
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "import a\n"
        "if TYPE_CHECKING:\n    import b\nelse:\n    import c\n"
        "def f():\n    import d\n"
        "def __getattr__(name):\n    import e\n"
        "class C:\n    def __getattr__(self, name):\n        import f\n"
    )
    assert sorted(alias.name for node in _run_time_imports(tree) for alias in node.names) == [
        "TYPE_CHECKING",
        "a",
        "c",
        "d",
        "f",
    ]


def test_no_run_time_import_cycle():
    cycles = find_cycles(import_graph())
    assert not cycles, "run-time import cycles (imports under `if TYPE_CHECKING:` excluded):\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles
    )


#: The packages that import an extra's distribution: ``{package: (the distribution's import name, the extra)}``.
#: Their modules import where the extra is installed; every other module must import without any extra.
EXTRA_PACKAGES = {
    "lightning_fed.deploy.flower": ("flwr", "flower"),
    # A deployment's keys and roster (TLS, node keys, signatures): cryptography, which the `flower` extra installs.
    "lightning_fed.deploy.keys": ("cryptography", "flower"),
    "lightning_fed.deploy.roster": ("cryptography", "flower"),
}


def _of_an_extra(name: str) -> str | None:
    return next((package for package in EXTRA_PACKAGES if name == package or name.startswith(package + ".")), None)


def _import_in_a_fresh_process(names: list[str]) -> None:
    """Imports ``names`` one after the other in a fresh interpreter (one per module would take minutes)."""
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    result = subprocess.run([sys.executable, "-c", code, *names], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr


def test_every_module_imports_in_a_fresh_process():
    """Every module but those of an extra's package (:data:`EXTRA_PACKAGES`): the README's install, ``[test]``
    only, imports them all."""
    _import_in_a_fresh_process([name for name in sorted(_modules()) if _of_an_extra(name) is None])


@pytest.mark.parametrize("package", sorted(EXTRA_PACKAGES))
def test_every_module_of_an_extra_imports_where_it_is_installed(package):
    distribution, extra = EXTRA_PACKAGES[package]
    pytest.importorskip(distribution, reason=f"{package} needs the `{extra}` extra: pip install -e '.[{extra}]'")
    _import_in_a_fresh_process([name for name in sorted(_modules()) if _of_an_extra(name) == package])


def test_layers_contract():
    """import-linter's contract of ``pyproject.toml`` (the ``lint`` extra installs it)."""
    beside = Path(sys.executable).with_name("lint-imports")
    lint_imports = str(beside) if beside.is_file() else shutil.which("lint-imports")
    if lint_imports is None:
        pytest.skip("import-linter is not installed (pip install -e '.[lint]')")
    result = subprocess.run(
        [lint_imports, "--no-cache", "--no-logo"], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
