"""``lightning-fed reproduce --tune``: the same hyperparameter search for every method, chosen on validation data.

Every method of a comparison, baselines included, gets :data:`BUDGET` settings over the same learning-rate range:
three values of its own hyperparameter (FedAMP's and HeurFedAMP's λ/α_k, FedProx's μ, FedCurv's λ, rFedAvg's λ,
FedGG's μ, q-FedAvg's q, APFL's α, the fine-tuning epochs) crossed with the comparison's three learning rates, or,
for a method that has none of its own (FedAvg, Separate, SCAFFOLD), nine learning rates spaced geometrically between
the same lowest and highest ones (:func:`lr_span`). The range is shared so that no method can win by a learning rate
that its rivals were not allowed. On FedAMP's practical split, FedAMP's σ is searched instead of λ/α_k (see
:func:`_fedamp`). A tuning run is its preset with one setting and
``evaluation_split: validation``: it is evaluated on a validation set carved from the training data (the global
one, and per client a holdout of its own training split), never on test data. The setting whose validation score
is highest is chosen, with the claim's own metric: BMTA for the personalised comparisons, the mean of the last five
rounds' global accuracy otherwise.
Tuning uses one seed (0) and, by default, half the ``small`` profile's rounds (``--tune-rounds``), so that the
whole search (198 runs for the small profile's runs) fits one session on 2 cores; that favours settings that learn
fast, for every method alike.

``--write-presets`` writes each chosen setting to ``configs/tuned/<run>.yaml``, with the search's table in the
file's header, so that a reader sees what was searched and what won.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from benchmarks.reproduce import measures
from benchmarks.reproduce.claims import GLOBAL_ACC
from benchmarks.reproduce.experiments import TUNED_DIR, Experiment, without_tuned
from benchmarks.reproduce.measures import MissingMetricError, Summary
from benchmarks.reproduce.runner import RunResult

#: Settings per method: every method gets the same number.
BUDGET = 9

#: One setting: a parameter path to its value. Paths: ``lr`` (the module's learning rate), ``<Callback>.<arg>`` (a
#: callback of the preset, by class name), ``aggregator.<arg>``.
Setting = Mapping[str, Any]

_PERSONALIZED_PREFIXES = ("pathological_", "practical_")


def _grid(**axes: Sequence[Any]) -> tuple[Setting, ...]:
    """The product of the axes, first axis outermost."""
    names = list(axes)
    return tuple(dict(zip(names, values, strict=True)) for values in itertools.product(*axes.values()))


#: FedAMP's proximal strength λ/α_k: weak, balanced, and √50 (its Theorem 2 setting α_k = λ/√K for K = 50).
_PROX_RATIOS = (0.1, 1.0, 7.07)


def _fedamp(
    lrs: Sequence[float], sigmas: Sequence[float] = (0.05,), ratios: Sequence[float] = _PROX_RATIOS
) -> tuple[Setting, ...]:
    """σ × λ/α_k × the learning rate, at α_k = σ/19 (the largest step keeping ξ_ii ≥ 0 for 20 clients).

    On the pathological split σ stays at the preset's 0.05: a pilot search on the validation data (σ ∈ {0.05, 0.5}
    × λ/α_k) scored σ = 0.5 below σ = 0.05 at every λ/α_k (87.5 / 87.2 / 67.0 against 90.1 / 89.5 / 84.5 % BMTA).

    On the practical split σ = 0.05 drives ξ_ii to 1 within 11 rounds, so FedAMP is Separate; σ, which decides how
    much a client takes from the others, is searched there instead, at λ/α_k = 0.1: the earlier search's choice on
    that split at every learning rate (72.5 / 69.6 / 41.4 % validation BMTA for 0.1 / 1 / 7.07 at lr 0.1). Those 9
    runs, and a 4-run σ diagnostic at lr 0.1, are extra validation budget that FedAMP alone received.
    """
    return tuple(
        {"FedAMP.sigma": sigma, "FedAMP.alpha_k": sigma / 19, "FedAMP.lam": round(ratio * sigma / 19, 6), "lr": lr}
        for sigma in sigmas
        for ratio in ratios
        for lr in lrs
    )


def _heurfedamp(lrs: Sequence[float], alpha_k: float = 0.1414) -> tuple[Setting, ...]:
    """λ/α_k crossed with the learning rate, at the preset's α_k and self-weight."""
    return tuple({"HeurFedAMP.lam": round(ratio * alpha_k, 6), "lr": lr} for ratio in _PROX_RATIOS for lr in lrs)


def lr_span(lrs: Sequence[float], points: int = BUDGET) -> tuple[float, ...]:
    """``points`` learning rates spaced geometrically from ``min(lrs)`` to ``max(lrs)``, to 3 significant digits.

    The grid of a method without a hyperparameter of its own: as many settings as its rivals get, over their range.
    """
    low, high = min(lrs), max(lrs)
    return tuple(float(f"{low * (high / low) ** (step / (points - 1)):.3g}") for step in range(points))


#: Each comparison's three learning rates (for a method with a hyperparameter of its own); the methods without one
#: get :func:`lr_span` of the same three.
_PERSONAL_LRS = (0.05, 0.1, 0.15)
_CURV_LRS, _SIM0_LRS, _FEDGG_LRS = (0.025, 0.05, 0.1), (0.05, 0.1, 0.15), (0.005, 0.01, 0.02)


def _personalized(split: str, fedamp: tuple[Setting, ...]) -> dict[str, tuple[Setting, ...]]:
    return {
        f"{split}_fedamp": fedamp,
        f"{split}_heurfedamp": _heurfedamp(_PERSONAL_LRS),
        f"{split}_separate": _grid(lr=lr_span(_PERSONAL_LRS)),
        f"{split}_fedavg": _grid(lr=lr_span(_PERSONAL_LRS)),
        f"{split}_apfl": _grid(**{"APFL.alpha": (0.25, 0.5, 0.75), "lr": _PERSONAL_LRS}),
        f"{split}_fedavg_ft": _grid(**{"FineTune.epochs": (1, 2, 5), "lr": _PERSONAL_LRS}),
        f"{split}_fedprox_ft": _grid(**{"FedProx.mu": (0.01, 0.1, 1.0), "lr": _PERSONAL_LRS}),
    }


#: The search of every tunable run (the Zhao runs study FedAvg under a data setting and have nothing to choose).
SEARCHES: dict[str, tuple[Setting, ...]] = {
    **_personalized("pathological", _fedamp(_PERSONAL_LRS)),
    **_personalized("practical", _fedamp(_PERSONAL_LRS, sigmas=(0.05, 5.0, 50.0), ratios=(0.1,))),
    "fedcurv_paper": _grid(**{"FedCurv.lam": (0.01, 0.1, 1.0), "lr": _CURV_LRS}),
    "fedavg_fedcurv": _grid(lr=lr_span(_CURV_LRS)),
    "rfedavg_paper_sim0": _grid(**{"RFedAvg.lam": (1e-5, 1e-4, 1e-3), "lr": _SIM0_LRS}),
    "fedavg_rfedavg_sim0": _grid(lr=lr_span(_SIM0_LRS)),
    "fedprox_rfedavg_sim0": _grid(**{"FedProx.mu": (0.001, 0.01, 0.1), "lr": _SIM0_LRS}),
    "scaffold_rfedavg_sim0": _grid(lr=lr_span(_SIM0_LRS)),
    "qfedavg_rfedavg_sim0": _grid(**{"aggregator.q": (0.1, 1.0, 5.0), "lr": _SIM0_LRS}),
    "fedgg_paper_beta01": _grid(**{"FedGG.mu": (0.001, 0.01, 0.1), "lr": _FEDGG_LRS}),
    "fedavg_fedgg_beta01": _grid(lr=lr_span(_FEDGG_LRS)),
    "fedprox_fedgg_beta01": _grid(**{"FedProx.mu": (0.001, 0.01, 0.1), "lr": _FEDGG_LRS}),
    "scaffold_fedgg_beta01": _grid(lr=lr_span(_FEDGG_LRS)),
}


def selection_metric(run: str) -> Callable[[Summary], float]:
    """The validation score a setting is chosen by: the claim's own metric."""
    if run.startswith(_PERSONALIZED_PREFIXES):
        return measures.bmta
    return lambda summary: measures.tail_mean(summary, GLOBAL_ACC)


def compose(root: Path, configs: Sequence[str]) -> dict[str, Any]:
    """The YAML files merged as LightningCLI composes ``--config`` files: later keys win, lists are replaced, and a
    new ``class_path`` replaces the old class with its arguments."""

    def merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
        for key, value in update.items():
            old = base.get(key)
            mergeable = isinstance(value, Mapping) and isinstance(old, dict)
            if mergeable and old.get("class_path") in (None, value.get("class_path")):
                merge(base[key], value)
            else:
                base[key] = copy.deepcopy(value)
        return base

    composed: dict[str, Any] = {}
    for config in configs:
        merge(composed, yaml.safe_load((root / config).read_text()) or {})
    return composed


def _callback(callbacks: list[dict[str, Any]], name: str, run: str) -> dict[str, Any]:
    for callback in callbacks:
        if callback.get("class_path", "").rsplit(".", 1)[-1] == name:
            return callback
    raise ValueError(f"the search of {run!r} sets {name} arguments, but its preset has no {name} callback")


def setting_overrides(composed: Mapping[str, Any], setting: Setting, run: str) -> dict[str, Any]:
    """The YAML that applies ``setting`` on top of the preset: each section it touches, whole (lists replace)."""
    trainer = composed.get("trainer", {})
    model = copy.deepcopy(composed["model"])
    callbacks = copy.deepcopy(trainer.get("callbacks", []))
    aggregator = copy.deepcopy(trainer.get("aggregator", {}))
    touched: set[str] = set()
    for path, value in setting.items():
        owner, _, argument = path.rpartition(".")
        if not owner:
            model.setdefault("init_args", {})[argument] = value
            touched.add("model")
        elif owner == "aggregator":
            aggregator.setdefault("init_args", {})[argument] = value
            touched.add("aggregator")
        else:
            _callback(callbacks, owner, run).setdefault("init_args", {})[argument] = value
            touched.add("callbacks")
    overrides: dict[str, Any] = {"model": model} if "model" in touched else {}
    trainer_overrides = {
        **({"callbacks": callbacks} if "callbacks" in touched else {}),
        **({"aggregator": aggregator} if "aggregator" in touched else {}),
    }
    if trainer_overrides:
        overrides["trainer"] = trainer_overrides
    return overrides


def _tuning_args(composed: Mapping[str, Any], rounds_fraction: float) -> tuple[str, ...]:
    """Validation data instead of test data, and ``rounds_fraction`` of the preset's rounds (at least 5)."""
    data_args = composed.get("data", {}).get("init_args", {})
    args: tuple[str, ...] = ("--data.init_args.evaluation_split", "validation")
    if not data_args.get("val_fraction"):
        args += ("--data.init_args.val_fraction", "0.1")
    rounds = composed.get("trainer", {}).get("num_rounds")
    if rounds is not None and rounds_fraction != 1.0:
        args += ("--trainer.num_rounds", str(max(5, round(rounds * rounds_fraction))))
    return args


def tuning_runs(
    experiments: Sequence[Experiment], root: Path, out_dir: Path, rounds_fraction: float = 0.5
) -> dict[str, list[Experiment]]:
    """Run name -> one tuning run per setting of its search, each with its settings YAML written under ``out_dir``.

    Runs without a search are left out; each tuning run trains ``rounds_fraction`` of its preset's rounds.
    """
    settings_dir = out_dir / "settings"
    settings_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[Experiment]] = {}
    for experiment in experiments:
        search = SEARCHES.get(experiment.name)
        if search is None:
            continue
        composed = compose(root, experiment.configs)
        for index, setting in enumerate(search):
            path = settings_dir / f"{experiment.name}__t{index}.yaml"
            path.write_text(yaml.safe_dump(setting_overrides(composed, setting, experiment.name), sort_keys=False))
            runs.setdefault(experiment.name, []).append(
                replace(
                    experiment,
                    name=f"{experiment.name}__t{index}",
                    configs=(*experiment.configs, str(path)),
                    args=(*experiment.args, *_tuning_args(composed, rounds_fraction)),
                    seed=0,
                )
            )
    return runs


@dataclass(frozen=True)
class SearchResult:
    """One run's search: each setting's validation score (``None`` when its run failed) and the chosen index."""

    run: str
    settings: tuple[Setting, ...]
    scores: tuple[float | None, ...]

    @property
    def chosen(self) -> int | None:
        scored = [(score, index) for index, score in enumerate(self.scores) if score is not None]
        return max(scored, key=lambda pair: (pair[0], -pair[1]))[1] if scored else None


def collect(run: str, results: Sequence[RunResult]) -> SearchResult:
    """The scores of ``run``'s tuning runs, in search order."""
    by_name = {result.experiment: result for result in results}
    metric = selection_metric(run)
    scores: list[float | None] = []
    for index in range(len(SEARCHES[run])):
        result = by_name.get(f"{run}__t{index}")
        try:
            scores.append(metric(result.summary()) if result is not None and result.ok else None)
        except MissingMetricError:
            scores.append(None)
    return SearchResult(run, SEARCHES[run], tuple(scores))


def _describe(setting: Setting) -> str:
    return ", ".join(
        f"{path}={value:g}" if isinstance(value, float) else f"{path}={value}" for path, value in setting.items()
    )


def write_tuning_report(out_dir: Path, searches: Sequence[SearchResult], context: Mapping[str, str]) -> Path:
    """``TUNING.md`` (one table per run: setting, validation score, the chosen one in bold) and ``tuning.json``."""
    lines = [
        "# Hyperparameter search (validation data only)",
        "",
        *(f"- {key}: {value}" for key, value in context.items()),
        f"- budget: {BUDGET} settings per method, seed 0; the score is the claim's metric "
        "(BMTA, or the last-5-round mean global accuracy) on validation data carved from the training data",
        "",
    ]
    for search in searches:
        lines += [f"## {search.run}", "", "| setting | validation score, % |", "|---|---|"]
        for index, (setting, score) in enumerate(zip(search.settings, search.scores, strict=True)):
            cells = [_describe(setting), "failed" if score is None else f"{100 * score:.2f}"]
            if index == search.chosen:
                cells = [f"**{cell}**" for cell in cells]
            lines.append(f"| {cells[0]} | {cells[1]} |")
        lines.append("")
    path = out_dir / "TUNING.md"
    path.write_text("\n".join(lines) + "\n")
    payload = {
        search.run: {
            "settings": [dict(setting) for setting in search.settings],
            "scores": list(search.scores),
            "chosen": None if search.chosen is None else dict(search.settings[search.chosen]),
        }
        for search in searches
    }
    (out_dir / "tuning.json").write_text(json.dumps({**context, "searches": payload}, indent=2))
    return path


def tuned_preset_text(experiment: Experiment, search: SearchResult, root: Path, context: Mapping[str, str]) -> str:
    """The YAML that applies ``search``'s chosen setting to ``experiment``, with the search's table as its header.

    The file is composed after the run's own presets; each section it sets is whole (lists replace), so it pins the
    searched values and repeats everything else of those sections unchanged.
    """
    if search.chosen is None:
        raise ValueError(f"the search of {search.run!r} has no successful run to choose from")
    base = list(without_tuned(experiment, TUNED_DIR).configs)
    setting = search.settings[search.chosen]
    overrides = setting_overrides(compose(root, base), setting, search.run)
    header = [
        f"{search.run}: the setting chosen by the hyperparameter search on validation data, never test data.",
        f"Compose after {' '.join(base)}.",
        f"Chosen: {_describe(setting)}.",
        f"Search ({BUDGET} settings, seed 0, {context.get('rounds', 'half of the rounds')}, scored by the claim's",
        "metric on validation data carved from the training data; benchmarks/reproduce/tuning.py):",
        *(
            f"  {_describe(candidate)}: {'failed' if score is None else f'{100 * score:.2f} %'}"
            for candidate, score in zip(search.settings, search.scores, strict=True)
        ),
        f"Table written {context.get('date', '')} on {context.get('machine', '')}.",
        "Written by `lightning-fed reproduce --tune --report-only --write-presets`.",
    ]
    body = yaml.safe_dump(overrides, sort_keys=False)
    return "".join(f"# {line}\n" for line in header) + body


def write_tuned_presets(
    experiments: Sequence[Experiment],
    searches: Sequence[SearchResult],
    root: Path,
    context: Mapping[str, str],
    out_dir: Path | None = None,
) -> list[Path]:
    """Writes ``<run>.yaml`` into ``out_dir`` (default ``root/configs/tuned``) for every search that chose a setting.

    Returns the files written. ``root`` holds the presets the settings are applied to.
    """
    by_name = {experiment.name: experiment for experiment in experiments}
    target = root / TUNED_DIR if out_dir is None else out_dir
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for search in searches:
        if search.chosen is None:
            continue
        path = target / f"{search.run}.yaml"
        path.write_text(tuned_preset_text(by_name[search.run], search, root, context))
        written.append(path)
    return written


__all__ = [
    "BUDGET",
    "SEARCHES",
    "SearchResult",
    "collect",
    "compose",
    "lr_span",
    "selection_metric",
    "setting_overrides",
    "tuned_preset_text",
    "tuning_runs",
    "write_tuned_presets",
    "write_tuning_report",
]
