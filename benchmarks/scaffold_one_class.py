"""SCAFFOLD on one-class clients (claim 8b's split): what the control variates do, round by round.

Usage (from the repository root)::

    python benchmarks/scaffold_one_class.py                          # lr 0.1 and 0.01, 8 rounds each (a few min)
    python benchmarks/scaffold_one_class.py --lrs 0.1 0.03 0.01 0.003 --rounds 10 --out runs/scaffold_one_class

It runs ``configs/experiments/fmnist/sim0.yaml`` (Fashion-MNIST, 20 clients with one class each, all of them every
round, E = 5, B = 100, plain SGD, so K = 15 local steps) with SCAFFOLD option II, through a probe that subclasses
:class:`lightning_fed.callbacks.Scaffold` and measures, for every client and round:

* ``corr``: ‖c − c_i‖, the correction added to every local gradient;
* ``grad``: ‖∇f_i‖, the client's raw minibatch gradient (before the correction), averaged over its K steps, and
  ``grad0``, the one at its first step (at the global model x);
* ``share``: corr / grad, the correction's size against the local gradient's;
* ``update``: ‖y_i − x‖, the client's update;
* ``check``: ‖c_i⁺ − mean_k g_k‖ / ‖mean_k g_k‖, where g_k are the raw gradients of the K steps. For plain SGD,
  option II's c_i⁺ = c_i − c + (x − y_i)/(K η) is exactly mean_k g_k (SCAFFOLD, Algorithm 1), so this is ~1e-7 when
  the callback's arithmetic (K, η, the sign, which c and c_i) is right;
* per round: ‖c‖, the rejected (non-finite) updates, and the global test accuracy.

Lines go to stdout and, with ``--out``, to ``<out>/lr<lr>.jsonl``. REPRODUCTION.md ("SCAFFOLD on one-class
clients") reads them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from typing_extensions import override

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from lightning_fed.callbacks import Scaffold  # noqa: E402

SETTING = "configs/experiments/fmnist/sim0.yaml"


def _norm(tensors: Any) -> float:
    return math.sqrt(sum(float(t.double().pow(2).sum()) for t in tensors))


class ScaffoldProbe(Scaffold):
    """SCAFFOLD, unchanged, that also records the quantities of the module docstring (one client at a time)."""

    def __init__(self, log_path: str | None = None) -> None:
        super().__init__()
        self.log_path = log_path
        self._clients: dict[int, dict[str, Any]] = {}

    @override
    def on_client_train_start(self, trainer, pl_module, client_ctx, dataloader) -> None:  # type: ignore[no-untyped-def]
        super().on_client_train_start(trainer, pl_module, client_ctx, dataloader)
        correction = client_ctx.extras[self.namespace].correction
        self._clients[client_ctx.client_id] = {
            "corr": _norm(correction.values()),
            "grads": [],
            "grad_sum": None,
            "first_nonfinite_step": None,
        }

    @override
    def on_client_before_optimizer_step(self, trainer, pl_module, step) -> None:  # type: ignore[no-untyped-def]
        for position, member in enumerate(step.members):
            ctx = step.group.contexts[member]
            record = self._clients[ctx.client_id]
            raw = {name: grad[position].detach().clone() for name, grad in step.grads.items()}
            norm = _norm(raw.values())
            if not math.isfinite(norm) and record["first_nonfinite_step"] is None:
                record["first_nonfinite_step"] = ctx.num_steps
            record["grads"].append(norm)
            if record["grad_sum"] is None:
                record["grad_sum"] = raw
            else:
                for name, value in raw.items():
                    record["grad_sum"][name] += value
        super().on_client_before_optimizer_step(trainer, pl_module, step)

    @override
    def on_client_end(self, trainer, pl_module, client_ctx, update) -> None:  # type: ignore[no-untyped-def]
        super().on_client_end(trainer, pl_module, client_ctx, update)
        record = self._clients[client_ctx.client_id]
        x, y = client_ctx.initial_params, update.params
        record["update"] = _norm(y[name] - x[name] for name in self._server_control)
        new_control = client_ctx.store.get(self.namespace, client_ctx.client_id)
        if record["grad_sum"] is not None and new_control is not None:
            mean_grad = {name: value / client_ctx.num_steps for name, value in record["grad_sum"].items()}
            error = _norm(new_control[name].to(mean_grad[name].device) - mean_grad[name] for name in mean_grad)
            record["check"] = error / max(_norm(mean_grad.values()), 1e-30)
            record["control"] = _norm(new_control.values())

    @override
    def on_round_end(self, trainer, pl_module, round_ctx, metrics) -> None:  # type: ignore[no-untyped-def]
        super().on_round_end(trainer, pl_module, round_ctx, metrics)
        clients = []
        for client_id in sorted(self._clients):
            record = self._clients[client_id]
            grads = [g for g in record["grads"] if math.isfinite(g)]
            grad = sum(grads) / len(grads) if grads else float("nan")
            clients.append(
                {
                    "client": client_id,
                    "corr": record["corr"],
                    "grad0": record["grads"][0] if record["grads"] else float("nan"),
                    "grad": grad,
                    "share": record["corr"] / grad if grads and grad > 0 else float("nan"),
                    "update": record.get("update", float("nan")),
                    "check": record.get("check", float("nan")),
                    "control": record.get("control", float("nan")),
                    "first_nonfinite_step": record["first_nonfinite_step"],
                }
            )
        accuracy = next((v for k, v in metrics.items() if k.endswith("test_acc") and k.startswith("global")), None)
        row = {
            "round": round_ctx.round_idx,
            "server_control": metrics.get("scaffold/server_control_norm"),
            "rejected": len(round_ctx.rejected),
            "test_acc": accuracy,
            "clients": clients,
        }
        self._clients = {}
        if self.log_path:
            with open(self.log_path, "a") as log:
                log.write(json.dumps(row) + "\n")


def _median(values: list[float]) -> float:
    finite = sorted(v for v in values if math.isfinite(v))
    return finite[len(finite) // 2] if finite else float("nan")


def summary_line(row: dict[str, Any]) -> str:
    """One round: medians over the clients (and the worst share), ‖c‖, rejections and test accuracy."""
    clients = row["clients"]

    def med(key: str) -> float:
        return _median([c[key] for c in clients])

    worst_share = max((c["share"] for c in clients if math.isfinite(c["share"])), default=float("nan"))
    checks = [c["check"] for c in clients if math.isfinite(c["check"])]
    accuracy = row["test_acc"]
    return (
        f"round {row['round']:>2}  |c-c_i| {med('corr'):8.3f}  |grad_i| {med('grad'):8.3f} (at x {med('grad0'):8.3f})"
        f"  share {med('share'):6.2f} (max {worst_share:6.2f})  |y_i-x| {med('update'):8.3f}"
        f"  |c| {row['server_control'] or 0:7.3f}  rejected {row['rejected']:>2}"
        f"  test acc {'-' if accuracy is None else f'{100 * accuracy:5.1f}'}"
        f"  check {max(checks) if checks else float('nan'):.1e}"
    )


def run(lr: float, rounds: int, seed: int, log_path: Path | None) -> list[dict[str, Any]]:
    """One SCAFFOLD fit on the one-class split at ``lr``; returns the probe's rows."""
    from lightning_fed.cli import FederatedCLI

    with tempfile.TemporaryDirectory() as tmp:
        # The CLI builds its own probe (from this module imported by name), so the rows come back through the file.
        log_path = log_path or Path(tmp) / "probe.jsonl"
        log_path.unlink(missing_ok=True)
        callback = {
            "class_path": "benchmarks.scaffold_one_class.ScaffoldProbe",
            "init_args": {"log_path": str(log_path)},
        }
        probe_config = Path(tmp) / "probe.yaml"
        probe_config.write_text(json.dumps({"trainer": {"callbacks": [callback]}}))
        args = ["fit", "--config", str(ROOT / SETTING), "--config", str(probe_config)]
        args += ["--model.init_args.lr", str(lr), "--trainer.num_rounds", str(rounds), "--seed_everything", str(seed)]
        args += ["--trainer.run_dir", str(Path(tmp) / "run"), "--trainer.default_root_dir", str(Path(tmp) / "run")]
        args += ["--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false"]
        args += ["--trainer.enable_model_summary", "false"]
        log = io.StringIO()
        try:
            with warnings.catch_warnings(), contextlib.redirect_stderr(log):
                warnings.simplefilter("ignore")
                FederatedCLI(args=args)
        except (Exception, SystemExit):
            print(log.getvalue(), file=sys.stderr)
            raise
        return [json.loads(line) for line in log_path.read_text().splitlines()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lrs", type=float, nargs="+", default=[0.1, 0.01], help="client learning rates")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="folder for the per-client JSON lines")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    for lr in args.lrs:
        print(f"# SCAFFOLD, one class per client, lr {lr:g}, {args.rounds} rounds, seed {args.seed}", flush=True)
        log_path = None if args.out is None else args.out / f"lr{lr:g}.jsonl"
        for row in run(lr, args.rounds, args.seed, log_path):
            print(summary_line(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
