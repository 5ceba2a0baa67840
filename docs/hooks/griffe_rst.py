"""Griffe extension: the docstrings' reStructuredText roles and directives, as the Markdown the site renders.

lightning_fed's docstrings are Google-style with Sphinx's math and cross-reference roles. mkdocstrings renders
docstrings as Markdown, so before they are parsed this turns

* ``.. math::`` blocks into ``$$ … $$`` and ``:math:`x``` into ``$x$`` (pymdownx.arithmatex, rendered by KaTeX);
* ``:class:`~lightning_fed.aggregators.FedAvg``` (and ``:func:``, ``:meth:``, ``:attr:``, ``:mod:``, ...) into a
  link to that object's API entry when the site documents it, else into its name in code;
* an argument list that shares one description (``a, b,`` then ``c: As in X.``) into one entry per argument;
* a free-form titled block (``Conventions:`` followed by an indented block, which Markdown would show as code) into
  a bold title and its text.

A role naming a ``lightning_fed`` object that does not exist is reported as a warning, which ``mkdocs build
--strict`` turns into a failure: a docstring that names a renamed class is caught like a broken link.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import griffe

_log = logging.getLogger("mkdocs.plugins.griffe_rst")

# Google-style sections griffe parses itself: their indented blocks are left alone.
_GOOGLE_SECTIONS = {
    "args",
    "arguments",
    "params",
    "parameters",
    "keyword args",
    "keyword arguments",
    "other args",
    "other arguments",
    "other params",
    "other parameters",
    "raises",
    "exceptions",
    "returns",
    "yields",
    "receives",
    "examples",
    "example",
    "attributes",
    "functions",
    "methods",
    "classes",
    "modules",
    "warns",
    "warnings",
    "warning",
    "note",
    "notes",
    "see also",
    "references",
    "todo",
    "deprecated",
    "abstract",
    "attention",
    "bug",
    "caution",
    "danger",
    "error",
    "info",
    "tip",
    "hint",
    "important",
    "failure",
    "question",
    "quote",
    "success",
}

_ROLE = re.compile(r":(?P<role>class|func|meth|attr|mod|data|exc|obj|const|ref|py:\w+):`(?P<body>[^`]+)`")
_MATH_ROLE = re.compile(r":math:`(?P<tex>[^`]+)`")
# Griffe reads `Examples:` as doctests; the singular `Example:` would be an admonition whose `>>>` lines are text.
_EXAMPLE_HEADER = re.compile(r"^(?P<indent>\s*)Example:\s*$")
_NAMES_LINE = re.compile(r"^(?P<indent>\s*)(?P<names>[a-z_]\w*(?:, *[a-z_]\w*)*),\s*$")
_NAMES_ONLY = re.compile(r"^[a-z_]\w*(?:, *[a-z_]\w*)*,$")
_LAST_NAMES_LINE = re.compile(r"^(?P<names>[a-z_]\w*(?:, *[a-z_]\w*)+): (?P<description>.*)$")
_TITLED_BLOCK = re.compile(r"^(?P<indent>\s*)(?P<title>[A-Z][\w ,'()-]*):\s*$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _math_blocks(lines: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped.startswith(".. math::"):
            out.append(line)
            i += 1
            continue
        indent = " " * _indent(line)
        body = [stripped[len(".. math::") :].strip()] if stripped[len(".. math::") :].strip() else []
        i += 1
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > len(indent)):
            body.append(lines[i])
            i += 1
        while body and not body[-1].strip():
            body.pop()
        while body and not body[0].strip():
            body.pop(0)
        depth = min((_indent(b) for b in body if b.strip()), default=0)
        body = [b[depth:] for b in body]
        if any("&" in b or b.rstrip().endswith("\\\\") for b in body):
            # Sphinx wraps a math block's rows in an alignment itself; KaTeX needs the environment written out.
            body = ["\\begin{aligned}", *body, "\\end{aligned}"]
        out += ["", f"{indent}$$", *(f"{indent}{b}" for b in body), f"{indent}$$", ""]
    return out


def _titled_blocks(lines: list[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = _TITLED_BLOCK.match(lines[i])
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if not match or match["title"].lower() in _GOOGLE_SECTIONS or _indent(nxt) <= len(match["indent"]):
            out.append(lines[i])
            i += 1
            continue
        indent = match["indent"]
        out += [f"{indent}**{match['title']}:**", ""]
        i += 1
        block: list[str] = []
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > len(indent)):
            block.append(lines[i])
            i += 1
        depth = min((_indent(b) for b in block if b.strip()), default=len(indent))
        out += [f"{indent}{b[depth:]}" if b.strip() else "" for b in block]
    return out


def _grouped_arguments(lines: list[str]) -> list[str]:
    """``a, b,`` / ``c: As in X.`` (several arguments sharing one description) -> one entry per argument."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        start = _NAMES_LINE.match(lines[i])
        if not start:
            out.append(lines[i])
            i += 1
            continue
        indent, joined, j, last = start["indent"], lines[i].strip(), i + 1, None
        # The names may run over several lines, at the entry's indent or deeper, up to the one with the colon.
        while j < len(lines) and lines[j].strip() and _indent(lines[j]) >= len(indent):
            joined += " " + lines[j].strip()
            j += 1
            if last := _LAST_NAMES_LINE.match(joined):
                break
            if not _NAMES_ONLY.match(joined):
                break
        if not last:
            out.append(lines[i])
            i += 1
            continue
        continuation = []
        while j < len(lines) and lines[j].strip() and _indent(lines[j]) > len(indent):
            continuation.append(lines[j])
            j += 1
        for name in (n.strip() for n in last["names"].split(",")):
            out += [f"{indent}{name}: {last['description']}", *continuation]
        i = j
    return out


class RstToMarkdown(griffe.Extension):
    """Rewrites every docstring of the loaded package once the package is loaded."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        # Once the whole package is loaded, so that a role can name any module of it.
        self._rewrite(pkg, loader)

    def _rewrite(self, obj: griffe.Object, loader: griffe.GriffeLoader) -> None:
        if obj.docstring is not None:
            lines = [_EXAMPLE_HEADER.sub(r"\g<indent>Examples:", line) for line in obj.docstring.value.splitlines()]
            text = "\n".join(_grouped_arguments(_titled_blocks(_math_blocks(lines))))
            text = _MATH_ROLE.sub(lambda m: f"${m['tex'].strip()}$", text)
            obj.docstring.value = _ROLE.sub(lambda m: self._reference(m, obj, loader), text)
        for member in obj.members.values():
            if not member.is_alias:
                self._rewrite(member, loader)  # type: ignore[arg-type]

    def _reference(self, match: re.Match[str], obj: griffe.Object, loader: griffe.GriffeLoader) -> str:
        body = match["body"].strip()
        explicit = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^>]+)>", body)
        target = re.sub(r"\s+", "", explicit["target"] if explicit else body).lstrip("~").lstrip(".").removesuffix("()")
        if explicit:
            title = explicit["title"]
        else:
            title = target.rsplit(".", 1)[-1] if body.startswith("~") else target
            if match["role"] in ("func", "meth"):
                title += "()"
        identifier = self._resolve(target, obj, loader)
        if identifier is None:
            if target.startswith("lightning_fed."):
                _log.warning("%s: its docstring names %s, which does not exist", obj.path, target)
            return f"`{title}`"
        return f'<autoref identifier="{identifier}" optional><code>{title}</code></autoref>'

    @staticmethod
    def _resolve(target: str, obj: griffe.Object, loader: griffe.GriffeLoader) -> str | None:
        scopes = [""]
        scope: griffe.Object | None = obj
        while scope is not None:
            scopes.append(scope.path + ".")
            scope = scope.parent
        for prefix in scopes:
            try:
                found = loader.modules_collection[prefix + target]
            except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
            return found.path
        return None
