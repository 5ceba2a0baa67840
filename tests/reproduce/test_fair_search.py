"""Protocol v2's search (PROTOCOL.md): equal budgets per cell, the edge-extension rule on fake score tables, claim 5's
λ stages, and the v2 registry and claims."""

import pytest

from benchmarks.reproduce import measures, rules
from benchmarks.reproduce.claims import CLAIMS_V2, claims_for
from benchmarks.reproduce.experiments import EXPERIMENTS_V2, default_seeds, experiments_for
from benchmarks.reproduce.fair_search import (
    Comparison,
    Ladder,
    assess,
    fedcurv_lambda_grid,
    fewest_rounds_choice,
    ladder_cells,
    next_cell,
    own_grid_edges,
    run_search,
    search_settings,
)
from benchmarks.reproduce.tuning_v2 import COMPARISONS

_TOY = Comparison("toy", (0.03, 0.1, 0.3), 2, {"a": ({"mu": 1}, {"mu": 2}), "b": None}, max_extensions=2)


def _table(best_lr: dict[str, float]):
    """A fake score: each method peaks at its ``best_lr`` (its score falls with the log-distance from it)."""
    import math

    def score(run, suffix, setting):
        return 1.0 - abs(math.log10(setting["lr"]) - math.log10(best_lr[run]))

    return score


def test_the_1_3_series_and_the_ladder_grow_on_both_sides():
    assert next_cell(0.1, +1) == 0.3 and next_cell(0.3, +1) == 1.0 and next_cell(0.03, -1) == 0.01
    assert list(ladder_cells(_TOY, Ladder(1, 1)).values()) == [0.01, 0.03, 0.1, 0.3, 1.0]


def test_every_method_gets_k_settings_per_cell():
    for comparison in COMPARISONS:
        counts = {len(search_settings(comparison, run, Ladder(1, 0))) for run in comparison.methods}
        assert counts == {comparison.k * (len(comparison.cells) + 1)}, comparison.name
    rates = [s["lr"] for s in search_settings(_TOY, "b", Ladder()).values()]
    assert len(rates) == 6 and rates == sorted(rates) and min(rates) < 0.03 < max(rates) < 0.6


def test_an_optimum_on_an_edge_extends_that_edge_for_every_method():
    scores = {
        run: {
            suffix: _table({"a": 0.3, "b": 0.1})(run, suffix, s)
            for suffix, s in search_settings(_TOY, run, Ladder()).items()
        }
        for run in _TOY.methods
    }
    outcome = assess(_TOY, Ladder(), scores)
    assert outcome.status == {"a": "edge: high", "b": "interior"}
    assert outcome.next_ladder == Ladder(0, 1)
    # The new cell is searched for both methods, the same K settings each.
    new = {
        run: set(search_settings(_TOY, run, Ladder(0, 1))) - set(search_settings(_TOY, run, Ladder())) for run in "ab"
    }
    assert new["a"] == new["b"] == {"c3k0", "c3k1"}


def test_interior_optima_stop_the_search():
    ladder, outcome = run_search(_TOY, _table({"a": 0.1, "b": 0.1}))
    assert ladder == Ladder() and outcome.next_ladder is None and set(outcome.status.values()) == {"interior"}


def test_the_search_grows_until_interior():
    # 0.01 is the lowest cell after one extension, so still an edge: a second one makes it interior.
    ladder, outcome = run_search(_TOY, _table({"a": 0.01, "b": 0.1}))
    assert ladder == Ladder(2, 0) and outcome.status == {"a": "interior", "b": "interior"}


def test_a_bound_stops_the_search_and_is_reported():
    ladder, outcome = run_search(_TOY, _table({"a": 5.0, "b": 0.1}))  # the lr bound 1.0 is reached first
    assert ladder == Ladder(0, 1) and outcome.next_ladder is None
    assert outcome.status["a"] == "bounded: high (lr 1)" and outcome.status["b"] == "interior"
    capped = Comparison("c", (0.003, 0.01, 0.03), 2, {"a": None}, max_extensions=1)
    ladder, outcome = run_search(capped, _table({"a": 1e-6}))
    assert ladder == Ladder(1, 0) and outcome.status["a"] == "bounded: low (lr 0.001)"


def test_fedcurv_lambda_stages_follow_the_papers_x10_then_x2_grid():
    grid, stage = fedcurv_lambda_grid()
    assert stage == "x10" and grid == (0.001, 0.01, 0.1, 1.0, 10.0)
    results = {0.001: (None, 0.6), 0.01: (40, 0.7), 0.1: (30, 0.71), 1.0: (35, 0.7), 10.0: (None, 0.5)}
    assert fewest_rounds_choice(results) == 0.1
    assert fedcurv_lambda_grid(results) == ((0.05, 0.2), "x2")
    assert fedcurv_lambda_grid({**results, 0.05: (30, 0.72), 0.2: (31, 0.7)}) == ((), "done")
    at_edge = {0.001: (20, 0.7), 0.01: (30, 0.7), 0.1: (None, 0.6), 1.0: (None, 0.5), 10.0: (None, 0.4)}
    assert fedcurv_lambda_grid(at_edge) == ((0.0001,), "x10")


def test_claim_5_is_judged_at_two_targets():
    assert rules.fewer_rounds_two_targets("FedCurv", (35, 51, 0.9), (99, 106, 0.95)).verdict == rules.REPRODUCED
    assert rules.fewer_rounds_two_targets("FedCurv", (35, 51, 0.9), (110, 106, 0.95)).verdict == rules.PARTLY
    assert rules.fewer_rounds_two_targets("FedCurv", (60, 51, 0.9), (None, 106, 0.95)).verdict == rules.NOT


def _summary(values):
    return {"history": [{"round": i + 1, "global/test_acc": v} for i, v in enumerate(values)]}


def test_at_fraction_and_late_gain():
    run = _summary([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    assert measures.at_fraction(run, "global/test_acc") == 0.5
    flat = _summary([0.5] * 40)
    assert measures.late_gain(flat, "global/test_acc") == pytest.approx(0.0)


def test_claim_6_v2_judges_steadiness_per_run_not_on_the_seed_mean():
    # FedAvg oscillates out of phase in two seeds: the mean curve is flat, each run is not.
    up_down = [0.5, 0.6] * 10
    down_up = [0.6, 0.5] * 10
    steady = [0.55 + 0.01 * (i % 2) for i in range(20)]
    seeded = {
        "rfedavg_paper_sim0": {0: _summary(steady), 1: _summary(steady)},
        "fedavg_rfedavg_sim0": {0: _summary(up_down), 1: _summary(down_up)},
    }
    from benchmarks.reproduce.seeds import mean_summaries

    means = mean_summaries(seeded)
    claim = next(c for c in CLAIMS_V2 if c.key == "rfedavg_sim0")
    assert claim.evaluate(means, seeded).verdict == rules.REPRODUCED
    assert claim.evaluate_v1_rule(means).verdict == rules.PARTLY


def test_v2_registry_claims_and_seeds():
    names = {run.name for run in experiments_for("small", protocol="v2")}
    assert {"fedgg_fmnist_beta01", "fedavg_fmnist_beta01_lr001"} <= names and "fedgg_paper_beta01" not in names
    assert any("[1100,800,500]" in arg for arg in EXPERIMENTS_V2["practical_fedamp"].args)
    assert EXPERIMENTS_V2["fedcurv_paper"].args == ("--model.init_args.lr", "0.01")
    assert default_seeds("v2", "full", "practical_fedamp") == (0, 1, 2)
    assert default_seeds("v2", "full", "fedcurv_paper") == (0,)
    assert [c.number for c in claims_for(["7"], "v2")] == ["7", "7 (lr 0.01)"]
    searched = {run for comparison in COMPARISONS for run in comparison.methods}
    required = {
        run for c in CLAIMS_V2 for run in c.requires if not run.startswith(("zhao_", "fedcurv", "fedavg_fedcurv"))
    }
    assert {r for r in required if not r.endswith("_lr001")} <= searched


def test_a_choice_next_to_a_cell_without_scores_is_not_called_interior():
    # Both methods peak in the middle cell (0.1); method "a"'s runs at 0.3 all failed (no score).
    scores = {
        run: {
            suffix: _table({"a": 0.1, "b": 0.1})(run, suffix, s)
            for suffix, s in search_settings(_TOY, run, Ladder()).items()
        }
        for run in _TOY.methods
    }
    for suffix, setting in search_settings(_TOY, "a", Ladder()).items():
        if setting["lr"] > 0.2:
            scores["a"][suffix] = None
    outcome = assess(_TOY, Ladder(), scores)
    assert outcome.status == {"a": "edge: no score at lr 0.3", "b": "interior"}
    assert outcome.next_ladder is None


def test_a_choice_at_an_end_of_its_own_grid_is_named_once_per_independent_key():
    by_name = {comparison.name: comparison for comparison in COMPARISONS}
    dirichlet, practical = by_name["Dirichlet 0.1"], by_name["practical"]
    # FedGG's μ grid is 0.001, 0.01, 0.1, 1: the ends are marked, the middle is not, whatever the cell.
    assert own_grid_edges(dirichlet, "fedgg_fmnist_beta01", "c1k3") == ["FedGG.mu=1 (highest)"]
    assert own_grid_edges(dirichlet, "fedgg_fmnist_beta01", "cm1k0") == ["FedGG.mu=0.001 (lowest)"]
    assert own_grid_edges(dirichlet, "fedgg_fmnist_beta01", "c2k1") == []
    assert own_grid_edges(dirichlet, "fedavg_fmnist_beta01", "c0k0") == []  # no own grid: the rates are the lr rule's
    # FedAMP's α_k and λ follow σ: one mark, by σ.
    assert own_grid_edges(practical, "practical_fedamp", "c0k0") == ["FedAMP.sigma=0.1 (lowest)"]
    assert own_grid_edges(practical, "practical_fedamp", "c0k1") == []
    # HeurFedAMP's σ and ξ_ii vary independently on 2 values each: every choice is at an end of both.
    assert own_grid_edges(practical, "practical_heurfedamp", "c1k3") == [
        "HeurFedAMP.sigma=1000 (highest)",
        "HeurFedAMP.self_weight=0.6 (highest)",
    ]
