"""The reproduction runs: each one YAML file (or a composition) under ``configs/``, and how a profile scales it.

The YAML files hold every hyperparameter, fixed from the papers before any result was seen. A run adds only the
variable of its sweep (an EMD level, a shared fraction β) and, per profile, the scaling overrides below:

* ``smoke``: one round on tiny data, to check the whole pipeline in the test suite;
* ``small``: the YAML files as they are (each scaled to a 2-core CPU, see their comments);
* ``full``: the papers' round counts and client numbers, as closely as the data allow (same data subsets).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

PROFILES = ("smoke", "small", "full")

#: The reproduction's versions: v1 as REPRODUCTION.md describes it, v2 as PROTOCOL.md pre-registers it.
PROTOCOLS = ("v1", "v2")

#: Seeds each profile runs every experiment with (``--seeds`` changes them). A seed sets ``seed_everything``: the
#: model's initialisation, client sampling and data order; the split stays the preset's (its partitioner seed), as
#: the split is part of the setting a claim is about.
DEFAULT_SEEDS: dict[str, tuple[int, ...]] = {"smoke": (0,), "small": (0, 1, 2), "full": (0,)}
ALL, SMALL_AND_FULL, FULL = frozenset(PROFILES), frozenset({"small", "full"}), frozenset({"full"})

_ONE_ROUND = ("--trainer.num_rounds", "1")
_MNIST1D_SMOKE = (*_ONE_ROUND, "--trainer.local_epochs", "1", "--data.init_args.num_samples", "1000")
_FMNIST_ZHAO_SMOKE = (*_ONE_ROUND, "--data.init_args.val_fraction", "0.99")

#: Zhao §3.2's protocol: 500 rounds at B = 100 (the small profile's B = 10 gives 40 rounds the paper's number of
#: local steps; at 500 rounds it would take ~15 min a run, and the 13 Zhao runs alone would outlast the 2-hour
#: budget of the full profile on 2 cores). The global model is evaluated every 5 rounds (final round included).
_ZHAO_FULL = ("--trainer.num_rounds", "500", "--data.init_args.batch_size", "100", "--trainer.eval_every_n_rounds", "5")

#: The exploratory claim-5 set (REPRODUCTION.md, declared before it runs): FedCurv's Table 1 other E, 40 rounds.
CLAIM5_E50_ROUNDS, CLAIM5_E50_EPOCHS = 40, 50

#: Profile overrides per family of runs. Full-profile sources: Zhao §3.2 trains 500 rounds at B = 100; FedCurv
#: needs ~100 rounds at E = 10 (Table 1); FedGG runs R = 100; rFedAvg records 60 rounds. FedAMP's round
#: counts are in its Appendix C, which we do not have: 100 rounds, twice the presets' 50.
SCALING: dict[str, dict[str, tuple[str, ...]]] = {
    "zhao": {"smoke": _FMNIST_ZHAO_SMOKE, "small": (), "full": _ZHAO_FULL},
    # 60 examples per client cannot place every client at the target EMD within the default 0.02.
    "zhao_target": {
        "smoke": (*_FMNIST_ZHAO_SMOKE, "--data.init_args.partitioner.init_args.tolerance", "0.05"),
        "small": (),
        "full": _ZHAO_FULL,
    },
    "zhao_sharing": {
        "smoke": (*_FMNIST_ZHAO_SMOKE, "--data.init_args.sharing.warmup_epochs", "1"),
        "small": (),
        "full": _ZHAO_FULL,
    },
    "pathological": {
        "smoke": (*_ONE_ROUND, "--data.init_args.val_fraction", "0.98", "--data.init_args.client_test_size", "20"),
        "small": (),
        "full": ("--trainer.num_rounds", "100"),
    },
    "practical": {
        "smoke": (
            *_ONE_ROUND,
            "--data.init_args.partitioner.init_args.samples_per_client=[60,45,30]",
            "--data.init_args.client_test_size",
            "15",
        ),
        "small": (),
        "full": ("--trainer.num_rounds", "100"),
    },
    "fedcurv": {
        "smoke": (*_FMNIST_ZHAO_SMOKE, "--trainer.local_epochs", "1"),
        "small": (),
        "full": ("--trainer.num_rounds", "100"),
    },
    "fedgg": {"smoke": _MNIST1D_SMOKE, "small": (), "full": ("--trainer.num_rounds", "100")},
    "rfedavg": {
        "smoke": (*_FMNIST_ZHAO_SMOKE, "--trainer.local_epochs", "1"),
        "small": (),
        "full": ("--trainer.num_rounds", "60"),
    },
    # v2 (PROTOCOL.md): claim 5 at the paper's eta = 0.01 needs more rounds for FedAvg to plateau.
    "fedcurv_v2": {
        "smoke": (*_FMNIST_ZHAO_SMOKE, "--trainer.local_epochs", "1"),
        "small": ("--trainer.num_rounds", "100"),
        "full": ("--trainer.num_rounds", "200"),
    },
    # v2 (PROTOCOL.md, claim 4): the practical split at the paper's client sizes, which the smoke profile keeps
    # (one round) so that it checks the split can be drawn at those sizes.
    "practical_v2": {"smoke": _ONE_ROUND, "small": (), "full": ("--trainer.num_rounds", "100")},
    # The exploratory claim-5 set (benchmarks/reproduce/exploratory.py): the paper's E = 50, as many rounds as fit
    # about 2 h on the 2-core machine; the same in every profile but smoke.
    "fedcurv_e50": {
        "smoke": (*_FMNIST_ZHAO_SMOKE, "--trainer.local_epochs", "1"),
        "small": ("--trainer.num_rounds", str(CLAIM5_E50_ROUNDS), "--trainer.local_epochs", str(CLAIM5_E50_EPOCHS)),
        "full": ("--trainer.num_rounds", str(CLAIM5_E50_ROUNDS), "--trainer.local_epochs", str(CLAIM5_E50_EPOCHS)),
    },
    # v2: claims 7 and 8a on Fashion-MNIST with LeNet-5; the preset holds the paper's R = 100.
    "fedgg_fmnist": {
        "smoke": (*_FMNIST_ZHAO_SMOKE, "--trainer.local_epochs", "1"),
        "small": ("--trainer.num_rounds", "50"),
        "full": (),
    },
}


#: The settings chosen by the hyperparameter search (``lightning-fed reproduce --tune --write-presets``): one file
#: per run, named after it and composed after its presets, with the search's table in its header.
TUNED_DIR = "configs/tuned"
#: v2's tuned settings (``lightning-fed reproduce --protocol v2 --tune --write-presets``), apart from v1's.
TUNED_DIR_V2 = "configs/tuned_v2"
TUNED_DIRS = {"v1": TUNED_DIR, "v2": TUNED_DIR_V2}
_REPOSITORY = Path(__file__).resolve().parents[2]


def with_tuned(name: str, configs: tuple[str, ...], tuned_dir: str = TUNED_DIR) -> tuple[str, ...]:
    """``configs`` followed by the run's tuned preset, when the search has written one."""
    tuned = f"{tuned_dir}/{name}.yaml"
    return (*configs, tuned) if (_REPOSITORY / tuned).is_file() else configs


def without_tuned(experiment: Experiment, tuned_dir: str) -> Experiment:
    """``experiment`` composed of its presets only, without its tuned file from ``tuned_dir``.

    A search starts from the presets: a choice written by an earlier search must not be part of the next one's
    runs (their commands, and what they compose).
    """
    configs = tuple(config for config in experiment.configs if not config.startswith(f"{tuned_dir}/"))
    return replace(experiment, configs=configs)


@dataclass(frozen=True)
class Experiment:
    """One run: its YAML files, its sweep value and the profiles it belongs to.

    Args:
        name: Unique; also the run directory's name.
        configs: YAML files relative to the repository root, composed in order (``--config a --config b``).
        family: Key of :data:`SCALING`.
        args: Overrides that define the run within its sweep (e.g. the target EMD), the same in every profile.
        value: The sweep variable (EMD level, β) for plots, or ``None``.
        profiles: Profiles that include the run.
        seed: The run seed (``--seed_everything``); ``None`` keeps the YAML's.
    """

    name: str
    configs: tuple[str, ...]
    family: str
    args: tuple[str, ...] = ()
    value: float | None = None
    profiles: frozenset[str] = field(default=ALL)
    seed: int | None = None

    @property
    def run_name(self) -> str:
        """The run directory's name: ``name``, with ``.seed<k>`` when the run sets a seed."""
        return self.name if self.seed is None else f"{self.name}.seed{self.seed}"

    def with_seed(self, seed: int) -> Experiment:
        """The same run under another seed."""
        return replace(self, seed=seed)

    def cli_args(self, profile: str) -> list[str]:
        """``--config`` flags, the sweep overrides, the profile's scaling and the seed, for ``lightning-fed fit``."""
        if profile not in PROFILES:
            raise ValueError(f"`profile` must be one of {PROFILES}, got {profile!r}.")
        flags = [part for config in self.configs for part in ("--config", config)]
        seed = () if self.seed is None else ("--seed_everything", str(self.seed))
        return [*flags, *self.args, *SCALING[self.family][profile], *seed]

    def missing_configs(self, root: Path) -> list[str]:
        """The YAML files that do not exist under ``root``."""
        return [config for config in self.configs if not (root / config).is_file()]


def _zhao() -> list[Experiment]:
    emd_levels = {0.36: FULL, 0.72: SMALL_AND_FULL, 1.08: FULL, 1.44: SMALL_AND_FULL, 1.62: FULL, 1.764: FULL}
    target_emd = (
        "--data.init_args.partitioner",
        "lightning_fed.datamodules.TargetEmdPartitioner",
        "--data.init_args.partitioner.init_args.num_partitions",
        "10",
        "--data.init_args.partitioner.init_args.target_emd",
    )
    runs = [Experiment("zhao_iid", ("configs/experiments/zhao_iid.yaml",), "zhao", value=0.0)]
    runs += [
        Experiment(
            f"zhao_emd_{level:g}",
            ("configs/experiments/zhao_emd.yaml",),
            "zhao_target",
            (*target_emd, str(level)),
            level,
            profiles,
        )
        for level, profiles in emd_levels.items()
    ]
    runs += [
        Experiment("zhao_2class", ("configs/experiments/zhao_2class.yaml",), "zhao", profiles=SMALL_AND_FULL),
        Experiment("zhao_1class", ("configs/experiments/zhao_1class.yaml",), "zhao", value=0.0),
    ]
    betas = {0.025: FULL, 0.05: ALL, 0.1: SMALL_AND_FULL, 0.2: FULL}
    runs += [
        Experiment(
            f"zhao_share_{beta:g}",
            ("configs/experiments/zhao_sharing.yaml",),
            "zhao_sharing",
            ("--data.init_args.sharing.beta", str(beta)),
            beta,
            profiles,
        )
        for beta, profiles in betas.items()
    ]
    return runs


#: FedAMP's comparison (its Tables 2 and 3). The pathological split runs the extra baselines only in `full`: no
#: claim rests on them there, and the small profile must fit one hour. The smoke profile keeps the runs each
#: claim's verdict needs (and one baseline), so that it stays well under a minute.
PERSONALIZED_METHODS = ("fedamp", "heurfedamp", "separate", "fedavg", "apfl", "fedavg_ft", "fedprox_ft")
_PERSONALIZED_PROFILES = {
    "pathological": {"fedamp": ALL, "heurfedamp": ALL, "separate": ALL, "fedavg": ALL},
    "practical": {
        "fedamp": ALL,
        "separate": ALL,
        "fedavg": ALL,
        "apfl": ALL,
        "heurfedamp": SMALL_AND_FULL,
        "fedavg_ft": SMALL_AND_FULL,
        "fedprox_ft": SMALL_AND_FULL,
    },
}


#: v2 (PROTOCOL.md, claim 4): the practical split at the paper's stated client sizes, 1000 / 700 / 400 training
#: images per group plus each client's 100 test images.
PRACTICAL_SIZES_V2 = ("--data.init_args.partitioner.init_args.samples_per_client=[1100,800,500]",)


def _personalized(protocol: str = "v1") -> list[Experiment]:
    runs = []
    for split in ("pathological", "practical"):
        v2_practical = protocol == "v2" and split == "practical"
        args, family = (PRACTICAL_SIZES_V2, "practical_v2") if v2_practical else ((), split)
        for method in PERSONALIZED_METHODS:
            profiles = _PERSONALIZED_PROFILES[split].get(method, FULL)
            configs = (f"configs/fmnist/personalized/{split}.yaml", f"configs/fmnist/personalized/{method}.yaml")
            name = f"{split}_{method}"
            runs.append(
                Experiment(name, with_tuned(name, configs, TUNED_DIRS[protocol]), family, args, profiles=profiles)
            )
    return runs


#: The global-model comparisons (claims 5-8b): run name -> (setting file, method file or None for FedAvg), under
#: configs/experiments/. Claims 5, 6 and 8b run on Fashion-MNIST (configs/experiments/fmnist/, whose headers set
#: the papers' protocols beside ours); claims 7 and 8a on MNIST-1D, as FedGG's setting was scaled before.
_GLOBAL_RUNS: dict[str, dict[str, tuple[str, ...]]] = {
    "fedcurv": {
        "fedcurv_paper": ("fmnist/shards_e10.yaml", "fmnist/fedcurv.yaml"),
        "fedavg_fedcurv": ("fmnist/shards_e10.yaml",),
    },
    "rfedavg": {
        "rfedavg_paper_sim0": ("fmnist/sim0.yaml", "fmnist/rfedavg_plus.yaml"),
        "fedavg_rfedavg_sim0": ("fmnist/sim0.yaml",),
        "fedprox_rfedavg_sim0": ("fmnist/sim0.yaml", "fmnist/fedprox.yaml"),
        "scaffold_rfedavg_sim0": ("fmnist/sim0.yaml", "fmnist/scaffold.yaml"),
        "qfedavg_rfedavg_sim0": ("fmnist/sim0.yaml", "fmnist/qfedavg.yaml"),
    },
    "fedgg": {
        "fedgg_paper_beta01": ("fedgg_paper_beta01.yaml",),
        "fedavg_fedgg_beta01": ("fedavg_fedgg_beta01.yaml",),
        "fedprox_fedgg_beta01": ("fedprox_fedgg_beta01.yaml",),
        "scaffold_fedgg_beta01": ("scaffold_fedgg_beta01.yaml",),
    },
}

#: The runs the smoke profile keeps: the ones each claim's verdict needs, and one baseline.
_SMOKE_GLOBAL_RUNS = {
    "fedcurv_paper",
    "fedavg_fedcurv",
    "rfedavg_paper_sim0",
    "fedavg_rfedavg_sim0",
    "fedprox_rfedavg_sim0",
    "fedgg_paper_beta01",
    "fedavg_fedgg_beta01",
    "scaffold_fedgg_beta01",
}


def _global_model_runs() -> list[Experiment]:
    return [
        Experiment(
            name,
            with_tuned(name, tuple(f"configs/experiments/{config}" for config in configs)),
            family,
            profiles=ALL if name in _SMOKE_GLOBAL_RUNS else SMALL_AND_FULL,
        )
        for family, runs in _GLOBAL_RUNS.items()
        for name, configs in runs.items()
    ]


EXPERIMENTS: dict[str, Experiment] = {run.name: run for run in [*_zhao(), *_personalized(), *_global_model_runs()]}

#: v2's claims 7 and 8a (PROTOCOL.md): run name -> method file after fmnist/dirichlet01.yaml (None for FedAvg).
FEDGG_FMNIST_RUNS: dict[str, str | None] = {
    "fedgg_fmnist_beta01": "fmnist/fedgg.yaml",
    "fedavg_fmnist_beta01": None,
    "fedprox_fmnist_beta01": "fmnist/fedprox.yaml",
    "scaffold_fmnist_beta01": "fmnist/scaffold_dirichlet.yaml",
}
#: The suffix of the same runs at the paper's lr 0.01 (and the method files' paper values, FedGG and FedProx
#: mu = 0.01), without a tuned file.
PAPER_LR_SUFFIX = "_lr001"
_PAPER_LR = ("--model.init_args.lr", "0.01")
#: The smoke profile runs every method of claims 7 and 8a once (SCAFFOLD's momentum path included; a smoke-profile
#: search then covers the whole comparison) and the paper-lr runs claim 7 reads, so that both lr columns of the
#: report get a verdict.
_SMOKE_FEDGG_FMNIST = {
    *FEDGG_FMNIST_RUNS,
    "fedgg_fmnist_beta01" + PAPER_LR_SUFFIX,
    "fedavg_fmnist_beta01" + PAPER_LR_SUFFIX,
}


def _v2_global_model_runs() -> list[Experiment]:
    """Claims 5, 6, 8b as in v1 but tuned by v2's search (claim 5 at eta = 0.01, more rounds); 7 and 8a on
    Fashion-MNIST with LeNet-5, at the fair-search choice and at the paper's lr 0.01."""
    runs = []
    for name, configs in _GLOBAL_RUNS["fedcurv"].items():
        paths = tuple(f"configs/experiments/{config}" for config in configs)
        runs.append(Experiment(name, with_tuned(name, paths, TUNED_DIR_V2), "fedcurv_v2", _PAPER_LR, profiles=ALL))
    for name, configs in _GLOBAL_RUNS["rfedavg"].items():
        paths = tuple(f"configs/experiments/{config}" for config in configs)
        profiles = ALL if name in _SMOKE_GLOBAL_RUNS else SMALL_AND_FULL
        runs.append(Experiment(name, with_tuned(name, paths, TUNED_DIR_V2), "rfedavg", profiles=profiles))
    for name, method in FEDGG_FMNIST_RUNS.items():
        paths = ("configs/experiments/fmnist/dirichlet01.yaml", *((f"configs/experiments/{method}",) if method else ()))
        profiles = ALL if name in _SMOKE_FEDGG_FMNIST else SMALL_AND_FULL
        runs.append(Experiment(name, with_tuned(name, paths, TUNED_DIR_V2), "fedgg_fmnist", profiles=profiles))
        paper = name + PAPER_LR_SUFFIX
        profiles = ALL if paper in _SMOKE_FEDGG_FMNIST else SMALL_AND_FULL
        runs.append(Experiment(paper, paths, "fedgg_fmnist", _PAPER_LR, profiles=profiles))
    return runs


#: v2's runs (PROTOCOL.md): Zhao's as in v1; FedAMP's with v2's tuned files and the practical split at the paper's
#: client sizes; the global-model comparisons of :func:`_v2_global_model_runs`.
EXPERIMENTS_V2: dict[str, Experiment] = {
    run.name: run for run in [*_zhao(), *_personalized("v2"), *_v2_global_model_runs()]
}
REGISTRIES: dict[str, dict[str, Experiment]] = {"v1": EXPERIMENTS, "v2": EXPERIMENTS_V2}

#: v2's full profile runs three seeds for the runs claims 3, 4 and 7 require, and seed 0 for the rest.
FULL_THREE_SEEDS_V2 = frozenset(
    {
        *(f"pathological_{method}" for method in ("fedamp", "heurfedamp", "fedavg", "separate")),
        *(f"practical_{method}" for method in ("fedamp", "separate", "fedavg")),
        "fedgg_fmnist_beta01",
        "fedavg_fmnist_beta01",
    }
)


def default_seeds(protocol: str, profile: str, name: str) -> tuple[int, ...]:
    """The seeds a run gets when ``--seeds`` is not given."""
    if protocol == "v2" and profile == "full":
        return (0, 1, 2) if name in FULL_THREE_SEEDS_V2 else (0,)
    return DEFAULT_SEEDS[profile]


def experiments_for(profile: str, names: list[str] | None = None, protocol: str = "v1") -> list[Experiment]:
    """The profile's runs, in registry order; ``names`` restricts them (unknown names are an error)."""
    if profile not in PROFILES:
        raise ValueError(f"`profile` must be one of {PROFILES}, got {profile!r}.")
    if protocol not in PROTOCOLS:
        raise ValueError(f"`protocol` must be one of {PROTOCOLS}, got {protocol!r}.")
    registry = REGISTRIES[protocol]
    unknown = sorted(set(names or ()) - set(registry))
    if unknown:
        raise ValueError(f"Unknown experiment names {unknown}; choose from {sorted(registry)}.")
    chosen = [run for run in registry.values() if profile in run.profiles]
    return [run for run in chosen if names is None or run.name in names]


def seeded(experiments: list[Experiment], seeds: tuple[int, ...]) -> list[Experiment]:
    """Every experiment under every seed, seeds innermost (so a claim's runs for seed 0 come first)."""
    return [experiment.with_seed(seed) for experiment in experiments for seed in seeds]


__all__ = [
    "DEFAULT_SEEDS",
    "EXPERIMENTS",
    "EXPERIMENTS_V2",
    "FEDGG_FMNIST_RUNS",
    "PAPER_LR_SUFFIX",
    "PROTOCOLS",
    "REGISTRIES",
    "TUNED_DIR_V2",
    "default_seeds",
    "PERSONALIZED_METHODS",
    "PROFILES",
    "SCALING",
    "TUNED_DIR",
    "without_tuned",
    "Experiment",
    "experiments_for",
    "seeded",
    "with_tuned",
]
