"""The deployment page's commands: secure first, `--insecure` only where a local trial is marked, every Flower flag
one the installed Flower takes, and `lightning-fed deploy-keys` writing the files the later commands name."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "deploying.md"
_FENCE = re.compile(r"^```bash\n(.*?)^```", re.M | re.S)


def _blocks(path: Path) -> list[tuple[str, str]]:
    """Each bash block of ``path`` with the paragraph of text just above it."""
    text = path.read_text()
    blocks = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip().split("\n\n")[-1]
        blocks.append((before, match.group(1)))
    return blocks


def _commands(block: str) -> list[list[str]]:
    lines = [line for line in block.replace("\\\n", " ").splitlines() if line.strip() and not line.startswith("#")]
    commands = []
    for line in lines:
        try:
            commands.append(shlex.split(line, comments=True))
        except ValueError:
            continue  # a heredoc's body
    return [command for command in commands if command]


@pytest.mark.parametrize("path", [PAGE, ROOT / "README.md"], ids=lambda p: p.name)
def test_no_command_runs_insecure_except_the_marked_local_trial(path):
    trials = 0
    for before, block in _blocks(path):
        if "--insecure" in block or "insecure = true" in block:
            assert "local trial" in before.lower(), f"{path.name}: an --insecure command outside the local trial"
            trials += 1
    assert trials <= 1


def test_the_secure_flow_comes_first_with_its_keys_and_roster():
    (before, first), *_ = _blocks(PAGE)
    commands = [" ".join(command[:2]) for command in _commands(first)]
    keys = commands.index("lightning-fed deploy-keys")
    assert keys < commands.index("lightning-fed flower-app") < commands.index("flwr run")
    assert "--roster keys/roster.json" in first and "root-certificates" in first
    assert "--enable-supernode-auth" in first and "flwr supernode register" in first


def _flags(executable: list[str]) -> set[str]:
    done = subprocess.run([*executable, "--help"], capture_output=True, text=True, timeout=120)
    return set(re.findall(r"--[a-z][a-z-]+", done.stdout + done.stderr))


def test_every_flower_flag_on_the_page_is_one_the_installed_flower_takes():
    pytest.importorskip("flwr", reason="Flower is the `flower` extra")
    from helpers.flower_processes import flower_executable

    known: dict[tuple[str, ...], set[str]] = {}
    checked = 0
    for _, block in _blocks(PAGE):
        for command in _commands(block):
            name = command[0]
            if name in ("flower-superlink", "flower-supernode"):
                tool: tuple[str, ...] = (name,)
            elif command[:3] == ["flwr", "supernode", "register"] or command[:2] == ["flwr", "run"]:
                tool = tuple(command[:3] if command[1] == "supernode" else command[:2])
            else:
                continue
            if tool not in known:
                known[tool] = _flags([flower_executable(tool[0]), *tool[1:]])
            used = {word.split("=")[0] for word in command if word.startswith("--")}
            assert used <= known[tool], f"{' '.join(tool)} has no {sorted(used - known[tool])}"
            checked += 1
    assert checked >= 6


def test_deploy_keys_writes_every_file_the_page_names(tmp_path):
    pytest.importorskip("cryptography", reason="the `flower` extra installs cryptography")
    from lightning_fed.deploy.keys import main

    (_, first), *_ = _blocks(PAGE)
    (command,) = [c for c in _commands(first) if c[:2] == ["lightning-fed", "deploy-keys"]]
    out = tmp_path / command[command.index("--out") + 1]
    argv = command[2:]
    argv[argv.index("--out") + 1] = str(out)
    assert main(argv) == 0
    named = set(re.findall(r"keys/([\w.-]+\.(?:pem|key|pub|json))", PAGE.read_text()))
    named = {name.replace("$site", "0") for name in named}
    assert named and named <= {path.name for path in out.iterdir()}
