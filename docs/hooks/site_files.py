"""MkDocs hook: the pages that are the repository's own top-level files, and the KaTeX files the math needs.

* REPRODUCTION.md, PROTOCOL.md, ARCHITECTURE.md and configs/tuned_v2/TUNING.md stay where they are (the one source of
  truth, read on GitHub and by the tests); the site gets each as a generated page, its links between those files
  rewritten to the pages' addresses. Any other relative link is left as written, so ``mkdocs build --strict``
  reports it.
* KaTeX is not committed: it comes from Debian's ``libjs-katex`` (or the directory named by ``KATEX_DIR``) at build
  time, and is copied into the site under ``assets/katex/``, so the math renders offline.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]

# Repository file -> the page it becomes.
REPOSITORY_PAGES = {
    "REPRODUCTION.md": "reproduction/record.md",
    "PROTOCOL.md": "reproduction/protocol.md",
    "configs/tuned_v2/TUNING.md": "reproduction/tuning-v2.md",
    "ARCHITECTURE.md": "architecture.md",
}

KATEX_DIR = Path(os.environ.get("KATEX_DIR", "/usr/share/javascript/katex"))
# KaTeX's files the site loads (mkdocs.yml's extra_javascript / extra_css) and the fonts its stylesheet names.
KATEX_FILES = ("katex.min.js", "katex.min.css", "contrib/auto-render.min.js")

_LINK = re.compile(r"\]\((?P<target>[^)\s#]+)(?P<fragment>#[^)\s]*)?\)")


def rewrite_links(markdown: str, source: str) -> str:
    """Point ``source``'s relative links to the other repository pages at those pages' addresses."""
    page = REPOSITORY_PAGES[source]

    def replace(match: re.Match[str]) -> str:
        target = match["target"]
        if "://" in target or target.startswith(("mailto:", "/")):
            return match[0]
        repository_path = posixpath.normpath(posixpath.join(posixpath.dirname(source), target))
        if repository_path not in REPOSITORY_PAGES:
            return match[0]
        new = posixpath.relpath(REPOSITORY_PAGES[repository_path], posixpath.dirname(page) or ".")
        return f"]({new}{match['fragment'] or ''})"

    return _LINK.sub(replace, markdown)


def _katex_file(name: str) -> Path:
    path = KATEX_DIR / name
    if not path.is_file() and name.endswith(".min.js"):
        path = path.with_name(path.name.replace(".min.js", ".js"))  # Debian ships contrib/ unminified
    if not path.is_file():
        raise PluginError(
            f"KaTeX's {name} is not in {KATEX_DIR}: install Debian's libjs-katex (apt-get install libjs-katex) or "
            "set KATEX_DIR to a KaTeX distribution directory."
        )
    return path


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for source, page in REPOSITORY_PAGES.items():
        text = rewrite_links((ROOT / source).read_text(encoding="utf-8"), source)
        note = f"\n\n---\n\n*This page is `{source}` of the repository, where it is maintained.*\n"
        files.append(File.generated(config, page, content=text + note))
    for name in KATEX_FILES:
        files.append(File.generated(config, f"assets/katex/{name}", abs_src_path=str(_katex_file(name))))
    for font in sorted((KATEX_DIR / "fonts").glob("*.woff2")):
        files.append(File.generated(config, f"assets/katex/fonts/{font.name}", abs_src_path=str(font)))
    return files
