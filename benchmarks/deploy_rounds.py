"""The docs' 3-site deployment quickstart, timed: per-round wall time deployed against simulated, with warm sites.

Follows ``docs/deploying.md`` with real processes on loopback (1 SuperLink, 3 SuperNodes, ``flwr run``, offline):
``configs/quickstart.yaml`` + the page's ``deploy.yaml`` (3 rounds, 3 clients, per-client evaluation), then the same
configuration with ``lightning-fed fit``. Prints one JSON line: each round's ``time/round_s`` in both runs, the final
global test accuracy and loss of both, and where a deployed round's time goes:

* ``site_work_s``: what the warm workers spent answering the round's tasks (their logs), summed over sites;
* ``clientapp_import_s``: what a per-message ClientApp process pays before forwarding (importing
  ``lightning_fed.deploy.flower`` in a fresh interpreter; measured here, median of 3);
* the rest is Flower: its polls (``Grid.send_and_receive`` polls every 3 s in deployment) and process starts.

Usage (``--secagg``: the app under Flower's SecAgg+; ``--secure``: the page's secure deployment, with TLS,
authenticated SuperNodes and a roster, the keys from ``lightning-fed deploy-keys``; without it the page's local
trial, ``--insecure``)::

    OMP_NUM_THREADS=1 python benchmarks/deploy_rounds.py --out /tmp/deploy-rounds [--secagg] [--secure]

Needs the ``flower`` extra and Flower's executables beside this Python (or on ``PATH``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEPLOY_YAML = """trainer:
  num_rounds: 3
  clients_per_round: 3
data:
  init_args:
    partitioner:
      init_args:
        num_partitions: 3
model:
  init_args:
    momentum: 0.0
"""


def _tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"`{name}` was found neither beside {sys.executable} nor on PATH: pip install -e '.[flower]'")
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _history(run_root: Path) -> list[dict[str, float]]:
    summaries = sorted(run_root.rglob("summary.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(summaries[-1].read_text())["history"]


def _clientapp_import_s() -> float:
    times = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import lightning_fed.deploy.flower"], check=True, cwd=ROOT)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="an empty working directory")
    parser.add_argument("--secagg", action="store_true", help="the app under Flower's SecAgg+ (`flower-app --secagg`)")
    parser.add_argument(
        "--secure", action="store_true", help="TLS, authenticated SuperNodes and a roster (else the local trial)"
    )
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "deploy.yaml").write_text(DEPLOY_YAML)
    env = dict(os.environ, FLWR_HOME=str(out / "flwr-home"), FLWR_TELEMETRY_ENABLED="0")
    env.update(FLWR_DISABLE_UPDATE_CHECK="1", WANDB_MODE="offline", PYTHONPATH=str(ROOT))
    configs = ["--config", str(ROOT / "configs/quickstart.yaml"), "--config", str(out / "deploy.yaml")]
    fed = [_tool("lightning-fed")]
    secagg = ["--secagg"] if args.secagg else []
    keys = out / "keys"
    if args.secure:
        # `lightning-fed deploy-keys`, run as its module (an editable install may predate the command's entry point).
        subprocess.run(
            [sys.executable, "-m", "lightning_fed.deploy.keys", "--out", str(keys), "--sites", "3"], check=True, env=env
        )
    security = ["--roster", str(keys / "roster.json")] if args.secure else ["--insecure"]
    subprocess.run(
        [*fed, "flower-app", *configs, "--out", str(out / "app"), *secagg, *security], check=True, env=env, cwd=out
    )
    port = _free_port()
    (out / "flwr-home").mkdir(exist_ok=True)
    trust = f'root-certificates = "{keys / "ca.pem"}"' if args.secure else "insecure = true"
    (out / "flwr-home" / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{port}"\n{trust}\n'
    )
    processes: list[subprocess.Popen[bytes]] = []

    def start(name: str, *command: str) -> None:
        log = open(out / f"{name}.log", "wb")  # noqa: SIM115 - kept open for the process's life
        processes.append(subprocess.Popen(command, stdout=log, stderr=log, env=env, cwd=out, start_new_session=True))

    try:
        tls = ["--ssl-ca-certfile", str(keys / "ca.pem"), "--ssl-certfile", str(keys / "superlink.pem")]
        tls += ["--ssl-keyfile", str(keys / "superlink.key"), "--enable-supernode-auth"]
        start(
            "superlink",
            _tool("flower-superlink"),
            *(tls if args.secure else ["--insecure"]),
            "--disable-runtime-dependency-installation",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--database",
            str(out / "superlink.db"),
        )
        deadline = time.monotonic() + 60
        scheme = "https" if args.secure else "http"
        context = ssl.create_default_context(cafile=str(keys / "ca.pem")) if args.secure else None
        while True:
            try:
                with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/health", timeout=1, context=context):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the SuperLink did not come up") from None
                time.sleep(0.5)
        for site in range(3):
            node_config = f"client-id={site} state-dir='{out / f'site-{site}-state'}'"
            trusted = ["--insecure"]
            if args.secure:
                key = keys / f"site-{site}.key"
                register = [_tool("flwr"), "supernode", "register", str(keys / f"site-{site}.pub")]
                subprocess.run(register, check=True, env=env, cwd=out, stdout=subprocess.DEVNULL)
                trusted = ["--root-certificates", str(keys / "ca.pem"), "--auth-supernode-private-key", str(key)]
                node_config += f" site-key='{key}'"
            start(
                f"supernode-{site}",
                _tool("flower-supernode"),
                *trusted,
                "--superlink",
                f"127.0.0.1:{port}",
                "--port",
                str(_free_port()),
                "--node-config",
                node_config,
            )
        started = time.perf_counter()
        subprocess.run(
            [_tool("flwr"), "run", str(out / "app"), "--stream", "--run-config", f"workdir='{out / 'server'}'"],
            check=True,
            env=env,
            cwd=out,
            stdout=subprocess.DEVNULL,
        )
        deployed_s = time.perf_counter() - started
    finally:
        for process in processes:
            os.killpg(process.pid, 15)
    deployed = _history(out / "server")
    (out / "fit").mkdir(exist_ok=True)
    subprocess.run([*fed, "fit", *configs], check=True, env=env, cwd=out / "fit", stdout=subprocess.DEVNULL)
    simulated = _history(out / "fit")
    site_work = [0.0] * len(deployed)
    for log in out.glob("site-*-state/worker-*.log"):
        for match in re.finditer(r"round (\d+) client \d+ \w+ in ([0-9.]+) s", log.read_text()):
            site_work[int(match.group(1))] += float(match.group(2))
    last = {key: value for key, value in deployed[-1].items() if key.startswith("global/test")}
    print(
        json.dumps(
            {
                "date": time.strftime("%Y-%m-%d"),
                "secagg": args.secagg,
                "secure": args.secure,
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "deployed_round_s": [round(r["time/round_s"], 2) for r in deployed],
                "simulated_round_s": [round(r["time/round_s"], 2) for r in simulated],
                "deployed_total_s": round(deployed_s, 1),
                "site_work_s": [round(s, 2) for s in site_work],
                "clientapp_import_s": round(_clientapp_import_s(), 2),
                "deployed_final": last,
                "simulated_final": {k: v for k, v in simulated[-1].items() if k.startswith("global/test")},
                "cpus": os.cpu_count(),
            }
        )
    )


if __name__ == "__main__":
    main()
