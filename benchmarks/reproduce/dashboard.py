"""The report on the W&B dashboard: one extra W&B run holding the report's figures and the claims' table, beside
the training runs (same project and group), offline when there are no credentials."""

from __future__ import annotations

from pathlib import Path

from benchmarks.reproduce.claims import Claim
from benchmarks.reproduce.report import Report
from benchmarks.reproduce.runner import WandbOptions
from lightning_fed.loggers.wandb import has_wandb_credentials


def log_report(report: Report, claims: list[Claim] | tuple[Claim, ...], options: WandbOptions, out_dir: Path) -> None:
    """Logs every figure as an image and the verdicts as a ``wandb.Table`` under ``report/``."""
    import wandb

    mode = "online" if has_wandb_credentials() else "offline"
    run = wandb.init(
        project=options.project,
        group=options.group,
        name=f"report-{options.group}",
        job_type="report",
        dir=str(out_dir),
        mode=mode,
    )
    try:
        images = {f"report/{path.stem}": wandb.Image(str(path)) for path in report.figures}
        rows = [
            [c.number, c.text, c.paper, report.verdicts[c.key].ours, report.verdicts[c.key].verdict] for c in claims
        ]
        table = wandb.Table(columns=["claim", "text", "paper", "ours", "verdict"], data=rows)
        run.log({**images, "report/claims": table})
    finally:
        run.finish()


__all__ = ["log_report"]
