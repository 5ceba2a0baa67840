"""Exploratory run sets: runs declared in REPRODUCTION.md before they run, reported apart and never a verdict.

A protocol's verdicts rest on the runs PROTOCOL.md fixed. An exploratory set asks a further question the protocol
did not settle (claim 5 at the paper's other local-work setting, say); its report applies the claim's rule to
show what the rule would say, under a header that labels it exploratory. ``lightning-fed reproduce --protocol v2
--exploratory NAME`` runs one set, ``--list`` prints its runs and the estimate below without running them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from benchmarks.reproduce.claims import CLAIMS_V2, Claim, rounds_to_two_targets
from benchmarks.reproduce.experiments import CLAIM5_E50_EPOCHS, CLAIM5_E50_ROUNDS, Experiment

_SHARDS = "configs/experiments/fmnist/shards_e10.yaml"
_PAPER_LR = ("--model.init_args.lr", "0.01")

#: Seconds one run spends per round and local epoch on this claim's split, from v2's small profile on the 2-core
#: machine with 2 workers (claim 5's 100-round runs at E = 10 took 15-22 min: 0.9-1.3 s).
SECONDS_PER_ROUND_EPOCH = (0.9, 1.3)


@dataclass(frozen=True)
class ExploratorySet:
    """One exploratory set: its runs (unseeded), the seeds, and the claims its report applies (labelled)."""

    name: str
    question: str
    experiments: tuple[Experiment, ...]
    seeds: tuple[int, ...]
    claims: tuple[Claim, ...]
    rounds: int
    local_epochs: int

    def seeded(self) -> list[Experiment]:
        return [run.with_seed(seed) for run in self.experiments for seed in self.seeds]

    def estimate_minutes(self, workers: int = 2) -> tuple[float, float, float, float]:
        """``(worker-minutes low, high, elapsed minutes low, high)`` on ``workers`` workers."""
        runs = len(self.seeded())
        low, high = (runs * self.rounds * self.local_epochs * s / 60 for s in SECONDS_PER_ROUND_EPOCH)
        return low, high, low / workers, high / workers


def _claim5_e50() -> ExploratorySet:
    fedavg = Experiment("fedavg_fedcurv_e50", (_SHARDS,), "fedcurv_e50", _PAPER_LR)
    runs = {
        "1": Experiment(
            "fedcurv_e50_lam1", (_SHARDS, "configs/experiments/fmnist/fedcurv.yaml"), "fedcurv_e50", _PAPER_LR
        ),
        "1e-3": Experiment(
            "fedcurv_e50_lam1e-3",
            (_SHARDS, "configs/experiments/fmnist/fedcurv_lam1e-3.yaml"),
            "fedcurv_e50",
            _PAPER_LR,
        ),
    }
    claim5 = next(claim for claim in CLAIMS_V2 if claim.key == "fedcurv_rounds")
    claims = tuple(
        replace(
            claim5,
            key=f"exploratory_{run.name}",
            number=f"5 (exploratory: E = {CLAIM5_E50_EPOCHS}, λ = {lam})",
            text=f"{claim5.text} Exploratory, not a verdict: E = {CLAIM5_E50_EPOCHS}, λ = {lam}.",
            curves=(("FedCurv", run.name), ("FedAvg", fedavg.name)),
            requires=(run.name, fedavg.name),
            measure=rounds_to_two_targets(run.name, fedavg.name),
            v1_measure=None,
            v1_number=None,
        )
        for lam, run in runs.items()
    )
    return ExploratorySet(
        "claim5-e50",
        f"claim 5 at the paper's E = {CLAIM5_E50_EPOCHS}, η = 0.01, λ = 1 (the paper's) and 1e-3, {CLAIM5_E50_ROUNDS} "
        "rounds, seeds 0 and 1",
        (fedavg, *runs.values()),
        (0, 1),
        claims,
        CLAIM5_E50_ROUNDS,
        CLAIM5_E50_EPOCHS,
    )


EXPLORATORY: dict[str, ExploratorySet] = {run_set.name: run_set for run_set in (_claim5_e50(),)}

__all__ = ["EXPLORATORY", "SECONDS_PER_ROUND_EPOCH", "ExploratorySet"]
