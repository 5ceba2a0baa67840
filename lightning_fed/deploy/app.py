"""``lightning-fed flower-app``: writes the Flower app directory of a deployment from the YAML of ``lightning-fed fit``.

Example::

    lightning-fed deploy-keys --out keys --sites 3
    lightning-fed flower-app --config configs/quickstart.yaml --config deploy.yaml --roster keys/roster.json --out app

The directory holds ``pyproject.toml`` (the app's components, :mod:`lightning_fed.deploy.flower`'s ServerApp and
ClientApp, and its run config), the resolved ``config.yaml`` that the server and every site build from, the roster
(``roster.json``: which node's key may serve which client, :mod:`~lightning_fed.deploy.roster`) and a README whose
commands run the SuperLink with TLS and authenticated SuperNodes. The configuration and the roster are checked
first, as ``fit`` would, and as a deployment's server would (:func:`~lightning_fed.deploy.server.check_server`): a
bad one is reported in one line and nothing is written. ``--insecure`` instead of ``--roster`` writes an app for a
local trial: no roster, so any SuperNode may serve any client.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_fed.utilities.atomic import write_text_atomic

PROGRAM = "lightning-fed flower-app"

#: The run config of a written app; ``flwr run --run-config "key=value"`` overrides any of them.
DEFAULT_RUN_CONFIG: dict[str, Any] = {
    "round-timeout": 600.0,
    "resume": False,
    "workdir": "",
    "state-dir": "",
    "roster": "",
}
#: The name of the roster in a written app directory (it travels with the app to the SuperLink).
ROSTER_FILE = "roster.json"

#: What ``--secagg`` adds to the run config: SecAgg+'s settings (:class:`~lightning_fed.deploy.flower.
#: SecureGridTransport`), Flower's defaults for the fixed point (±8 in 2**22 levels).
SECAGG_RUN_CONFIG: dict[str, Any] = {
    "secagg": True,
    "secagg-clipping-range": 8.0,
    "secagg-quantization-range": 4194304,
    "secagg-num-shares": 1.0,
    "secagg-reconstruction-threshold": 0.67,
}

_README = """\
# {name}: a lightning_fed deployment on Flower

Written by `lightning-fed flower-app`. `config.yaml` is the resolved configuration of the fit: the server and every
site build from it. Run config (`pyproject.toml`, `[tool.flwr.app.config]`; override with
`flwr run . <connection> --run-config "key=value"`):

- `round-timeout`: seconds the server waits for a round's replies; a site that has not replied by then is dropped
  from that round (`0`: wait for every site).
- `resume`: `true` resumes the newest run of this configuration from its last checkpoint (`--ckpt_path last`).
- `workdir`: the server's working directory (where `default_root_dir` leads); default: the SuperLink's.
- `state-dir`: where sites keep their clients' state when their node config sets none (simulation).
- `roster`: which node's key may serve which client (`roster.json` in this directory; empty: a local trial where any
  node may serve any client). A node must sign its claim to a client, and every reply, with that key; anything
  else is refused and named in the server's log.
- `secagg` (written by `--secagg`): the round's sums reach the server only as their total, under Flower's SecAgg+.
  `secagg-clipping-range` c: every entry a site sums must lie in [-c, c] (a site beyond it rejects its own update and
  says so); each client's value is rounded to a grid of step 2c / `secagg-quantization-range`.
  `secagg-num-shares` and `secagg-reconstruction-threshold`: SecAgg+'s shares per secret and how many rebuild one
  (fractions of the round's sites).

{run}
Every machine needs `pip install "lightning-fed[flower]"` (the same lightning_fed version everywhere).
"""

_SECURE_RUN = """\
The SuperLink runs with TLS and authenticates every SuperNode (keys from `lightning-fed deploy-keys`; `ca.key`
stays off the SuperLink), and each site's public key is registered before its SuperNode starts:

    flower-superlink --ssl-ca-certfile keys/ca.pem --ssl-certfile keys/superlink.pem \\
        --ssl-keyfile keys/superlink.key --enable-supernode-auth --database superlink.db
    flwr supernode register keys/site-0.pub <connection>

The connection (`$FLWR_HOME/config.toml`) names the SuperLink and the CA, as an absolute path:

    [superlink.<connection>]
    address = "<host>:<port>"
    root-certificates = "/absolute/path/to/keys/ca.pem"

Each site starts a SuperNode that trusts the CA, authenticates with its key, and names its client, its state
directory and the same key (it signs the site's replies; optionally also a YAML whose `data` section replaces this
one's, to point the datamodule at the site's own files):

    flower-supernode --root-certificates keys/ca.pem --auth-supernode-private-key keys/site-0.key \\
        --superlink <host>:<port> \\
        --node-config "client-id=0 state-dir='site-0-state' site-key='keys/site-0.key' data-config='site-data.yaml'"
"""

_TRIAL_RUN = """\
This app was written with `--insecure`: it has no roster, so any SuperNode may serve any client and nothing a site
sends is signed. For a trial on one machine only (local trial: no TLS, no SuperNode authentication):

    flower-supernode --insecure --superlink 127.0.0.1:<port> --node-config "client-id=0 state-dir='site-0-state'"

For a deployment, write the app again with `--roster` (`lightning-fed deploy-keys` writes the keys and a roster).
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--config",
        action="append",
        required=True,
        help="A YAML of `lightning-fed fit`; repeat it to override key by key, as fit's --config does.",
    )
    parser.add_argument(
        "--out", required=True, help="The app directory to write (created; must be empty if it exists)."
    )
    parser.add_argument("--name", default=None, help="The app's name (default: the --out directory's name).")
    parser.add_argument(
        "--round-timeout",
        type=float,
        default=DEFAULT_RUN_CONFIG["round-timeout"],
        help="Seconds to wait for a round's replies before dropping the sites that have not replied (0: wait).",
    )
    security = parser.add_mutually_exclusive_group()
    security.add_argument(
        "--roster",
        help="The roster: which node's public key may serve which client (JSON, as `lightning-fed deploy-keys`"
        " writes it); copied into the app.",
    )
    security.add_argument(
        "--insecure",
        action="store_true",
        help="A local trial: no roster, any SuperNode may serve any client (with Flower's --insecure).",
    )
    parser.add_argument(
        "--secagg",
        action="store_true",
        help="Secure aggregation: the server sees the round's sums only as their total (Flower's SecAgg+); refused"
        " for algorithms that need more than sums.",
    )
    return parser


def resolved_config(configs: Sequence[str | Path], secure: bool = False) -> str:
    """The YAML that ``lightning-fed fit --config <each of configs>`` resolves, once checked as a deployment's server
    (``secure``: under secure aggregation).

    Raises:
        Exception: What parsing, building or :func:`~lightning_fed.deploy.server.check_server` raised.
    """
    from lightning_fed.cli.main import FederatedCLI
    from lightning_fed.deploy.server import check_server
    from lightning_fed.trainer import FederatedTrainer

    args: list[str] = []
    for config in configs:
        args += ["--config", str(config)]
    cli = FederatedCLI(args=args, run=False, save_config_callback=None, parser_kwargs={"exit_on_error": False})
    assert isinstance(cli.trainer, FederatedTrainer)
    check_server(cli.trainer, secure=secure)
    cli.check_before_run("fit")  # what `fit` checks before it writes anything, the server's data included
    text = cli.parser.dump(cli.config, skip_none=False, skip_check=True)
    return str(text)


def app_name(out: Path, name: str | None) -> str:
    """A Flower project name (letters, digits and ``-``, starting with a letter) from ``name`` or ``out``."""
    raw = name or out.resolve().name
    cleaned = re.sub(r"[^A-Za-z0-9-]+", "-", raw).strip("-") or "app"
    return cleaned if cleaned[0].isalpha() else f"app-{cleaned}"


def pyproject(name: str, run_config: dict[str, Any]) -> str:
    """The app's ``pyproject.toml``."""
    lines = [
        "[build-system]",
        'requires = ["hatchling"]',
        'build-backend = "hatchling.build"',
        "",
        "[project]",
        f'name = "{name}"',
        'version = "1.0.0"',
        'description = "A lightning_fed deployment (written by `lightning-fed flower-app`)."',
        'license = "Apache-2.0"',
        'dependencies = ["lightning-fed[flower]"]',
        "",
        "[tool.hatch.build.targets.wheel]",
        'packages = ["."]',
        "",
        "[tool.flwr.app]",
        'publisher = "lightning-fed"',
        "",
        "[tool.flwr.app.components]",
        'serverapp = "lightning_fed.deploy.flower:server_app"',
        'clientapp = "lightning_fed.deploy.flower:client_app"',
        "",
        "[tool.flwr.app.config]",
    ]
    for key, value in run_config.items():
        lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def write_app(
    configs: Sequence[str | Path],
    out: str | Path,
    *,
    name: str | None = None,
    round_timeout: float = 600.0,
    secagg: bool = False,
    roster: str | Path | None = None,
) -> Path:
    """Checks the configuration and the roster, then writes the Flower app directory ``out``; returns it.

    With ``secagg`` the run config turns secure aggregation on (:data:`SECAGG_RUN_CONFIG`), and an algorithm that
    needs more than sums is refused first. With ``roster`` (:class:`~lightning_fed.deploy.roster.Roster`'s JSON)
    the app carries it as :data:`ROSTER_FILE` and the server accepts each client from the node that holds its key
    only; without (``None``) the app is a local trial in which any SuperNode may serve any client (Flower's
    simulation engine, whose virtual nodes hold no keys, runs such an app).

    Raises:
        FileExistsError: If ``out`` exists and is not an empty directory (checked before anything is written).
        ValueError: If ``roster`` cannot be read as a roster.
        Exception: What checking the configuration raised (nothing is written then).
    """
    out = Path(out)
    _check_out(out)
    checked = None
    if roster is not None:
        # Keys need the `flower` extra (cryptography); a local trial without a roster does not.
        from lightning_fed.deploy.roster import Roster

        checked = Roster.load(roster)
    text = resolved_config(configs, secure=secagg)
    project = app_name(out, name)
    run_config = dict(DEFAULT_RUN_CONFIG, **{"round-timeout": float(round_timeout)})
    if checked is not None:
        run_config["roster"] = ROSTER_FILE
    if secagg:
        run_config.update(SECAGG_RUN_CONFIG)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "config.yaml", text)
    write_text_atomic(out / "pyproject.toml", pyproject(project, run_config))
    if checked is not None:
        checked.write(out / ROSTER_FILE)
    run = _SECURE_RUN if checked is not None else _TRIAL_RUN
    write_text_atomic(out / "README.md", _README.format(name=project, run=run))
    return out


class MissingRosterError(ValueError):
    """``flower-app`` was given neither ``--roster`` nor ``--insecure``."""


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"--out {out} exists and is not an empty directory; name a new one.")


def main(argv: Sequence[str] | None = None) -> int:
    """The command: 0 once the app is written, 2 with one line on stderr for a bad input."""
    from lightning_fed.cli.errors import HeldOutput, error_line, traceback_requested

    args = _parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.round_timeout < 0:
        print(
            f"{PROGRAM}: --round-timeout must be >= 0 (0: wait for every site); got {args.round_timeout}.",
            file=sys.stderr,
        )
        return 2
    # Building the trainer logs ("GPU available: ...") and warns: the command prints its one line only.
    held = HeldOutput()
    held.hold()
    try:
        if args.roster is None and not args.insecure:
            # What is wrong with the rest is said first, as it would be with a roster.
            _check_out(Path(args.out))
            resolved_config(args.config, secure=args.secagg)
            raise MissingRosterError(
                "name the deployment's roster with --roster <roster.json> (`lightning-fed deploy-keys` writes one), or"
                " write an app for a local trial with --insecure."
            )
        out = write_app(
            args.config,
            args.out,
            name=args.name,
            round_timeout=args.round_timeout,
            secagg=args.secagg,
            roster=args.roster,
        )
    except Exception as error:
        held.discard()
        if traceback_requested():
            raise
        plain = isinstance(error, (FileExistsError, MissingRosterError)) or str(error).startswith("The roster ")
        line = str(error) if plain else error_line(error, before_run=True)
        if line is None:
            raise
        print(f"{PROGRAM}: {line}", file=sys.stderr)
        return 2
    held.discard()
    if args.insecure:
        print(
            f"{PROGRAM}: --insecure: a local trial only; any SuperNode may serve any client and nothing a site sends"
            " is signed (write the app with --roster to deploy).",
            file=sys.stderr,
        )
    print(f"Wrote the Flower app {out}: run it with `flwr run {out} <connection>`.")
    return 0


__all__ = [
    "DEFAULT_RUN_CONFIG",
    "ROSTER_FILE",
    "SECAGG_RUN_CONFIG",
    "main",
    "pyproject",
    "resolved_config",
    "write_app",
]


if __name__ == "__main__":
    sys.exit(main())
