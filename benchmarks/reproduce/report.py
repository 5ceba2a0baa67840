"""``REPRODUCTION.md``: the claims' table (claim, paper figure, our figure, verdict), the rules, the runs and the
figures; ``reproduction.json`` holds the same verdicts for scripts. Failed runs are listed with their error, and a
claim that needs them gets "no verdict"; the rest of the report is written as usual."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from benchmarks.load import footnote
from benchmarks.reproduce import figures, measures
from benchmarks.reproduce.claims import CLIENT_DISTRIBUTIONS, GLOBAL_ACC, Claim, zhao_beta_points, zhao_emd_points
from benchmarks.reproduce.measures import MissingMetricError, Summary
from benchmarks.reproduce.rules import Verdict
from benchmarks.reproduce.runner import RunResult
from benchmarks.reproduce.seeds import SeededSummaries, mean_summaries, per_seed_summaries, spread


@dataclass
class Report:
    """What :func:`write_report` produced."""

    path: Path
    verdicts: dict[str, Verdict]
    figures: list[Path] = field(default_factory=list)
    figure_errors: list[str] = field(default_factory=list)
    seed_verdicts: dict[int, dict[str, Verdict]] = field(default_factory=dict)


def _summaries(results: Sequence[RunResult]) -> SeededSummaries:
    """Run name -> seed -> summary, over the successful runs (a run without a seed counts as seed 0)."""
    seeded: dict[str, dict[int, Summary]] = {}
    for result in results:
        if result.ok:
            seeded.setdefault(result.experiment, {})[result.seed or 0] = result.summary()
    return seeded


def _mean_and_spread(by_seed: Mapping[int, Summary], measure: Callable[[Summary], float]) -> str:
    """``"mean ± std (v0, v1, v2)"`` in percent, or ``"–"`` when no seed logged the metric."""
    try:
        mean, std, values = spread(by_seed, measure)
    except MissingMetricError:
        return "–"
    if len(values) == 1:
        return f"{100 * mean:.1f}"
    return f"{100 * mean:.1f} ± {100 * std:.1f} ({', '.join(f'{100 * v:.1f}' for v in values)})"


def _seed_tables(
    claims: Sequence[Claim], seeded: SeededSummaries, seed_verdicts: Mapping[int, Mapping[str, Verdict]]
) -> list[str]:
    """Each claim's verdict per seed, and each run's final accuracy and BMTA as mean ± std over the seeds."""
    seeds = list(seed_verdicts)
    lines = [
        "## Per seed",
        "",
        "The verdicts above are judged on the runs' means over seeds (round by round); each seed on its own gives:",
        "",
        "| # | " + " | ".join(f"seed {seed}" for seed in seeds) + " |",
        "|---|" + "---|" * len(seeds),
        *(
            f"| {c.number} | "
            + " | ".join(
                f"{seed_verdicts[seed][c.key].verdict}: {_cell(seed_verdicts[seed][c.key].ours)}" for seed in seeds
            )
            + " |"
            for c in claims
        ),
        "",
        "| run | seeds ok | final global test accuracy, % | BMTA, % |",
        "|---|---|---|---|",
    ]
    for name, by_seed in seeded.items():
        final = _mean_and_spread(by_seed, lambda summary: measures.final(summary, GLOBAL_ACC))
        bmta = _mean_and_spread(by_seed, measures.bmta)
        lines.append(f"| {name} | {len(by_seed)} | {final} | {bmta} |")
    return [*lines, ""]


def _beta_with_baseline(summaries: Mapping[str, Summary]) -> dict[float, float]:
    """The sharing sweep with the 1-class run as β = 0."""
    points = zhao_beta_points(summaries)
    if "zhao_1class" in summaries:
        points[0.0] = measures.final(summaries["zhao_1class"], "global/test_acc")
    return points


def _figure_jobs(claims: Sequence[Claim], summaries: Mapping[str, Summary]) -> dict[str, Callable[[Path], Path | None]]:
    """File name to the function that draws it there."""
    keys = {claim.key for claim in claims}
    jobs: dict[str, Callable[[Path], Path | None]] = {
        f"curves_{claim.key}.png": partial(figures.round_curves, claim, summaries) for claim in claims
    }
    # The sweeps' points are read inside the job, so that a run lacking a metric costs only that figure.
    if "zhao_emd" in keys:
        jobs["accuracy_vs_emd.png"] = lambda path: figures.accuracy_vs(
            zhao_emd_points(summaries), "mean EMD", "Zhao: FedAvg test accuracy vs EMD", path
        )
    if "zhao_sharing" in keys:
        jobs["accuracy_vs_beta.png"] = lambda path: figures.accuracy_vs(
            _beta_with_baseline(summaries), "shared fraction beta", "Zhao: 1-class non-IID with data sharing", path
        )
    for split, curves in CLIENT_DISTRIBUTIONS.items():
        if f"fedamp_{split}" in keys:
            jobs[f"client_accuracy_{split}.png"] = partial(
                figures.client_distribution,
                curves,
                summaries,
                f"Per-client accuracy, {split} non-IID (last evaluation)",
            )
    return jobs


def _draw(
    out_dir: Path, claims: Sequence[Claim], summaries: Mapping[str, Summary], results: Sequence[RunResult]
) -> tuple[list[Path], list[str]]:
    """Every figure; a figure that cannot be drawn is reported and skipped."""
    drawn, errors = [], []
    for name, job in _figure_jobs(claims, summaries).items():
        try:
            path = job(out_dir / name)
        except Exception as error:
            errors.append(f"{name}: {type(error).__name__}: {error}")
            continue
        if path is not None:
            drawn.append(path)
    # The ξ heatmaps of each FedAMP run's first successful seed.
    fedamp_runs: dict[str, Path] = {}
    for result in sorted(results, key=lambda r: r.seed or 0):
        if result.ok and "fedamp" in result.experiment:
            fedamp_runs.setdefault(result.experiment, Path(result.run_dir))
    drawn += figures.copy_xi_heatmaps(fedamp_runs, out_dir)
    return drawn, errors


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown(
    profile: str,
    claims: Sequence[Claim],
    verdicts: Mapping[str, Verdict],
    results: Sequence[RunResult],
    drawn: Sequence[Path],
    errors: Sequence[str],
    context: Mapping[str, str],
    seed_lines: Sequence[str] = (),
) -> str:
    failed = [result for result in results if not result.ok]
    lines = [
        f"# Reproduction report ({profile if 'protocol' in profile else profile + ' profile'})",
        "",
        *(f"- {key}: {value}" for key, value in context.items()),
        f"- runs: {len(results) - len(failed)} ok, {len(failed)} failed",
        "",
        "| # | claim | paper | ours | verdict |",
        "|---|---|---|---|---|",
        *(
            f"| {c.number} | {_cell(c.text)} | {_cell(c.paper)} | {_cell(verdicts[c.key].ours)} | "
            f"**{verdicts[c.key].verdict}** |"
            for c in claims
        ),
        "",
        *seed_lines,
        "## Verdict rules (fixed before any result)",
        "",
        *(f"- **{c.number}** ({c.key}): {c.rule}" for c in claims),
        "",
        "## Runs",
        "",
        "| run | status | wall time | command |",
        "|---|---|---|---|",
        *(
            f"| {r.name} | {'ok' if r.ok else '**FAILED**'} | {r.wall_s:.0f} s{r.wall_mark} | `{_cell(r.command)}` |"
            for r in results
        ),
    ]
    loads = [record for record in (r.load_record for r in results) if record is not None]
    if loads:
        lines += ["", *footnote(loads).splitlines()]
    if failed:
        lines += ["", "## Failed runs", ""]
        for result in failed:
            lines += [f"### {result.name}", "", "```", (result.error or "").strip(), "```", ""]
    lines += ["", "## Figures", "", *(f"![{path.stem}]({path.name})" for path in drawn)]
    if errors:
        lines += ["", "Figures that could not be drawn:", "", *(f"- {_cell(error)}" for error in errors)]
    return "\n".join(lines) + "\n"


def read_v1_verdicts(path: Path | None) -> dict[str, str]:
    """Claim number -> verdict of a v1 ``reproduction.json`` (empty when there is none)."""
    if path is None or not path.is_file():
        return {}
    payload = json.loads(path.read_text())
    return {claim["number"]: claim["verdict"] for claim in payload.get("claims", [])}


def shown_path(path: Path) -> str:
    """``path`` as a report shows it: relative to the working directory where it lies below it (the repository
    root, as a rule), so that a committed report names no machine's directories; otherwise as it is."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _side_by_side(
    claims: Sequence[Claim],
    verdicts: Mapping[str, Verdict],
    v1_rule: Mapping[str, Verdict | None],
    v1_verdicts: Mapping[str, str],
    v1_report: Path | None,
) -> list[str]:
    """v2's verdict beside v1's rule on the same runs (where v2 amended it) and v1's own verdict."""
    shown = None if v1_report is None else shown_path(v1_report)
    source = f"`{shown}`" if v1_verdicts else "none found" + (f" at `{shown}`" if shown else "")
    lines = [
        "## v1 beside v2",
        "",
        f"v1's verdicts come from its own runs (v1 report: {source}). Where PROTOCOL.md amended a rule, v1's rule "
        "on these v2 runs is shown too.",
        "",
        "| # | v2 verdict | v1's rule on the v2 runs | v1 verdict (v1 runs) |",
        "|---|---|---|---|",
    ]
    for claim in claims:
        rule = v1_rule.get(claim.key)
        shown = "same rule" if rule is None else f"{rule.verdict}: {_cell(rule.ours)}"
        number = claim.compared_to
        v1 = "– (new in v2)" if number is None else v1_verdicts.get(number, "–")
        lines.append(f"| {claim.number} | **{verdicts[claim.key].verdict}** | {shown} | {v1} |")
    return [*lines, ""]


def run_context(command: str, wall_s: float, how: str) -> dict[str, str]:
    """Date, machine, command and wall time, as the report header shows them."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.platform()}",
        "command": f"`{command}`",
        "wall time": f"{wall_s / 60:.1f} min ({how})",
    }


def invocation_context(
    command: str,
    results: Sequence[RunResult],
    wall_s: float,
    how: str,
    *,
    report_only: bool = False,
    reused: Sequence[RunResult] = (),
) -> dict[str, str]:
    """The report header of one invocation, with a wall time that counts every run the report reads.

    Args:
        command: the invocation, as the header shows it.
        results: every run the report reads.
        wall_s: this invocation's own clock.
        how: how its runs ran (workers, or in one process).
        report_only: it ran nothing, so its clock says nothing of the runs: the header gives the sum of the runs'
            own wall times instead.
        reused: runs that earlier invocations finished and this one read back (``--resume``, or a search resumed
            after a stop). Its clock misses them: the header says how many, and what their own wall times sum to.

    Returns:
        The header's entries (:func:`run_context`).
    """
    if report_only:
        total = sum(result.wall_s for result in results)
        return run_context(command, total, f"sum of the {len(results)} runs' own wall times")
    context = run_context(command, wall_s, how)
    if reused:
        own = sum(result.wall_s for result in reused) / 60
        context["wall time"] += (
            f"; {len(reused)} of {len(results)} runs were finished by earlier invocations and read back "
            f"(their own wall times sum to {own:.1f} min)"
        )
    return context


def write_report(
    out_dir: Path,
    profile: str,
    claims: Sequence[Claim],
    results: Sequence[RunResult],
    context: Mapping[str, str],
    protocol: str = "v1",
    v1_report: Path | None = None,
) -> Report:
    """Writes ``REPRODUCTION.md``, ``reproduction.json`` and the figures into ``out_dir``.

    With ``protocol`` v2 the report also prints v1's verdicts beside v2's: from ``v1_report`` (a v1
    ``reproduction.json``) and, for the rules PROTOCOL.md amended, v1's rule applied to these runs.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    seeded = _summaries(results)
    summaries = mean_summaries(seeded)
    verdicts = {claim.key: claim.evaluate(summaries, seeded) for claim in claims}
    seed_verdicts = {
        seed: {
            claim.key: claim.evaluate(runs, {name: {seed: summary} for name, summary in runs.items()})
            for claim in claims
        }
        for seed, runs in per_seed_summaries(seeded).items()
    }
    seed_lines = _seed_tables(claims, seeded, seed_verdicts) if len(seed_verdicts) > 1 else []
    v1_rule = {claim.key: claim.evaluate_v1_rule(summaries) for claim in claims}
    v1_verdicts = read_v1_verdicts(v1_report)
    if protocol == "v2":
        seed_lines = [*_side_by_side(claims, verdicts, v1_rule, v1_verdicts, v1_report), *seed_lines]
    drawn, errors = _draw(out_dir, claims, summaries, results)
    path = out_dir / "REPRODUCTION.md"
    title = profile if protocol == "v1" else f"{profile} profile, protocol {protocol}"
    path.write_text(_markdown(title, claims, verdicts, results, drawn, errors, context, seed_lines))
    payload = {
        "profile": profile,
        "protocol": protocol,
        **context,
        "claims": [
            {
                "number": c.number,
                "key": c.key,
                "claim": c.text,
                "paper": c.paper,
                "rule": c.rule,
                "ours": verdicts[c.key].ours,
                "verdict": verdicts[c.key].verdict,
                "per_seed": {str(seed): seed_verdicts[seed][c.key].verdict for seed in seed_verdicts},
                **(
                    {
                        "v1_rule_on_these_runs": None if v1_rule[c.key] is None else v1_rule[c.key].verdict,  # type: ignore[union-attr]
                        "v1_verdict": None if c.compared_to is None else v1_verdicts.get(c.compared_to),
                    }
                    if protocol == "v2"
                    else {}
                ),
            }
            for c in claims
        ],
        "runs": [
            {
                "name": r.name,
                "experiment": r.experiment,
                "seed": r.seed,
                "status": r.status,
                "wall_s": r.wall_s,
                "load": r.load,
                "error": r.error,
            }
            for r in results
        ],
    }
    (out_dir / "reproduction.json").write_text(json.dumps(payload, indent=2))
    return Report(path, verdicts, drawn, errors, seed_verdicts)


__all__ = ["Report", "invocation_context", "read_v1_verdicts", "run_context", "shown_path", "write_report"]
