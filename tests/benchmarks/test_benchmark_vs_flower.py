"""benchmarks/vs_flower.py without Flower: the timing formula, the work both sides do, the table and the skip."""

import json
import statistics
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from benchmarks.vs_flower import (
    FLOWER_APIS,
    Measurement,
    flower_version,
    format_table,
    main,
    make_datamodule,
    plan_runs,
    run_lightning_fed,
)
from benchmarks.vs_flower_work import (
    CASES,
    Case,
    client_batches,
    load_case_data,
    make_model,
    per_round_time,
    train_on_batches,
    write_case_data,
)
from lightning_fed.utilities.seeding import derive_seed

TINY = Case("tiny", num_clients=3, samples_per_client=10, clients_per_round=3)


@pytest.fixture
def tiny_data(tmp_path: Path) -> Path:
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(40, 1, 28, 28, generator=generator)
    labels = torch.randint(0, 10, (40,), generator=generator)
    path = tmp_path / "tiny.pt"
    write_case_data(TINY, images, labels, seed=1, path=path)
    return path


def test_per_round_time_is_the_mean_of_rounds_two_to_r():
    ends = [100.0, 103.0, 107.5, 109.0]  # the first round's end includes start-up, which must not count
    durations = [later - earlier for earlier, later in zip(ends, ends[1:])]
    assert per_round_time(ends) == pytest.approx(statistics.mean(durations))
    assert per_round_time(ends) == pytest.approx((ends[-1] - ends[0]) / (len(ends) - 1))
    with pytest.raises(ValueError, match="at least 2 rounds"):
        per_round_time([5.0])


def test_cases_are_the_issues_federations():
    shapes = {name: (c.num_clients, c.samples_per_client, c.clients_per_round) for name, c in CASES.items()}
    assert shapes == {
        "cross-silo": (10, 6000, 10),
        "cross-device-100": (100, 60, 100),
        "cross-device-1000": (1000, 60, 100),
    }
    assert CASES["cross-silo"].steps_per_round(32) == 10 * 188  # 6000 / 32 = 187.5: the last batch is short
    with pytest.raises(ValueError, match="clients_per_round"):
        Case("bad", 10, 60, 11)


def test_both_sides_train_the_same_batches(tiny_data: Path):
    """The Flower client's batches are, tensor for tensor, the ones lightning_fed's round gives the same client."""
    x, y = load_case_data(tiny_data)
    assert x.shape[0] == TINY.num_clients * TINY.samples_per_client
    dm = make_datamodule(TINY, tiny_data, batch_size=4, seed=7)
    dm.setup("fit")
    steps = 0
    for client_id in range(TINY.num_clients):
        assert dm.client_num_samples(client_id) == TINY.samples_per_client
        for round_idx in range(2):
            ours = list(dm.client_dataloader(client_id, seed=derive_seed(7, "data", round_idx, client_id)))
            theirs = client_batches(x, y, TINY, client_id, round_idx, batch_size=4, seed=7)
            assert len(ours) == len(theirs) == 3  # 4 + 4 + 2
            for (our_x, our_y), (their_x, their_y) in zip(ours, theirs):
                assert torch.equal(our_x, their_x) and torch.equal(our_y, their_y)
            steps += len(theirs) if round_idx == 0 else 0
    assert steps == TINY.steps_per_round(4)


def test_lightning_fed_side_computes_the_flower_clients_fedavg(tiny_data: Path, tmp_path: Path):
    """Two rounds of the lightning_fed worker equal FedAvg over the Flower client's training function."""
    out = str(tmp_path / "ours.json")
    run_lightning_fed(TINY, tiny_data, workers=1, rounds=2, batch_size=4, seed=3, out=out)
    ends = json.loads(Path(out).read_text())["round_ends"]
    assert len(ends) == 2 and ends[0] < ends[1]

    x, y = load_case_data(tiny_data)
    global_state = make_model(3).state_dict()
    for round_idx in range(2):
        client_states = []
        for client_id in range(TINY.num_clients):
            model = make_model(3)
            model.load_state_dict(global_state)
            train_on_batches(model, client_batches(x, y, TINY, client_id, round_idx, batch_size=4, seed=3))
            client_states.append(model.state_dict())
        global_state = {k: torch.stack([s[k] for s in client_states]).mean(0) for k in global_state}  # equal sizes
    ours = torch.load(out + ".pt", weights_only=True)
    assert ours.keys() == global_state.keys()
    for name, tensor in global_state.items():
        torch.testing.assert_close(ours[name], tensor, rtol=1e-5, atol=1e-6)


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_table_reports_medians_and_the_median_of_per_repeat_ratios_per_flower_api():
    message, numpy, ours = [3.0, 5.0, 4.0], [30.0, 44.0, 41.0], [1.0, 2.0, 1.0]
    table = format_table(
        [
            Measurement(CASES["cross-device-100"], 2, ours, {"message": message, "numpyclient": numpy}),
            Measurement(CASES["cross-silo"], 1, [2.5, 2.0, 3.0]),
        ],
        batch_size=32,
        flower_apis=["message", "numpyclient"],
    )
    rows = table.splitlines()
    assert len(rows) == 4 and rows[0].startswith("| case |") and set(rows[1]) <= set("|:-")
    assert _cells(rows[0])[4:] == [
        "Flower message API (s/round)",
        "Flower NumPyClient (s/round)",
        "lightning_fed (s/round)",
        "Flower message API / lightning_fed",
        "Flower NumPyClient / lightning_fed",
    ]
    assert rows[1].count("|") == rows[0].count("|")
    per_repeat = statistics.median(f / o for f, o in zip(message, ours))  # 3.0, not the 4.0 of the medians
    assert _cells(rows[2]) == [
        "cross-device-100",
        "100 x 60, 100/round",
        "200",
        "2",
        f"{statistics.median(message):.3f}",
        f"{statistics.median(numpy):.3f}",
        f"{statistics.median(ours):.3f}",
        f"**{per_repeat:.2f}×**",
        f"**{statistics.median(f / o for f, o in zip(numpy, ours)):.2f}×**",
    ]
    skipped = _cells(rows[3])
    assert skipped[4:] == ["skipped", "skipped", "2.500", "–", "–"]


def test_table_has_columns_only_for_the_apis_asked_for():
    table = format_table([Measurement(CASES["cross-silo"], 1, [2.0], {"numpyclient": [8.0]})], 32, ["numpyclient"])
    header, _, row = table.splitlines()
    assert "message" not in header and _cells(row)[4:] == ["8.000", "2.000", "**4.00×**"]


def test_plan_alternates_the_sides_and_leaves_flower_out_when_missing():
    runs = plan_runs(["cross-silo", "cross-device-100"], [1, 2], repeats=2, flower_apis=["message"])
    assert len(runs) == 2 * 2 * 2 * 2
    assert runs[:2] == [("cross-silo", 1, "lightning_fed"), ("cross-silo", 1, "flower-message")]
    assert runs[8:10] == [("cross-silo", 1, "flower-message"), ("cross-silo", 1, "lightning_fed")]
    assert all(runs.count(run) == 2 for run in runs)
    alone = plan_runs(["cross-silo"], [1, 2], repeats=3, flower_apis=[])
    assert alone == [("cross-silo", 1, "lightning_fed"), ("cross-silo", 2, "lightning_fed")] * 3


def test_plan_rotates_three_sides_so_each_takes_every_place_once_in_three_repeats():
    runs = plan_runs(["cross-device-100"], [1], repeats=3, flower_apis=["message", "numpyclient"])
    orders = [[side for _, _, side in runs[r * 3 : r * 3 + 3]] for r in range(3)]
    for place in range(3):
        assert sorted(order[place] for order in orders) == ["flower-message", "flower-numpyclient", "lightning_fed"]


def test_every_flower_api_has_a_script_beside_the_driver():
    here = Path(__file__).resolve().parents[2] / "benchmarks"
    assert sorted(FLOWER_APIS) == ["message", "numpyclient"]
    for script, _ in FLOWER_APIS.values():
        assert (here / script).is_file()


def test_numpyclient_weights_round_trip_in_state_dict_order():
    """The NumPyClient side's arrays map back onto LeNet-5 key by key (what its final-model check relies on)."""
    from benchmarks.flower_numpy_app import get_weights, set_weights

    source, target = make_model(1), make_model(2)
    set_weights(target, get_weights(source))
    for (name, theirs), (other, ours) in zip(source.state_dict().items(), target.state_dict().items()):
        assert name == other and torch.equal(theirs, ours)


def test_dry_run_plans_both_flower_apis_by_default(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    # Flower is never imported here: the probe is replaced, and a dry run starts nothing.
    monkeypatch.setattr("benchmarks.vs_flower.flower_version", lambda python: "flwr 9.9, ray 8.8")
    main(["--dry-run", "--cases", "cross-device-100", "--workers", "1", "--repeats", "1"])
    printed = capsys.readouterr().out
    assert "flwr 9.9, ray 8.8 (message, numpyclient)" in printed
    assert "3 runs: cross-device-100/1/lightning_fed, cross-device-100/1/flower-message, " in printed
    main(
        ["--dry-run", "--cases", "cross-device-100", "--workers", "1", "--repeats", "1", "--flower-apis", "numpyclient"]
    )
    assert "2 runs: cross-device-100/1/lightning_fed, cross-device-100/1/flower-numpyclient" in capsys.readouterr().out


def _shadow(tmp_path: Path, flwr_source: str, ray_source: str) -> Path:
    (tmp_path / "flwr.py").write_text(textwrap.dedent(flwr_source))
    (tmp_path / "ray.py").write_text(textwrap.dedent(ray_source))
    return tmp_path


def test_flower_version_reads_the_interpreters_flower(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYTHONPATH", str(_shadow(tmp_path, "__version__ = '9.9'", "__version__ = '8.8'")))
    assert flower_version(sys.executable) == "flwr 9.9, ray 8.8"


def test_flower_side_is_skipped_with_a_clear_message_when_flwr_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    missing = "raise ImportError('No module named flwr')"
    monkeypatch.setenv("PYTHONPATH", str(_shadow(tmp_path, missing, "")))
    assert flower_version(sys.executable) is None
    main(["--dry-run", "--cases", "cross-silo", "--repeats", "2", "--flower-python", sys.executable])
    printed = capsys.readouterr().out
    assert "Flower is not installed" in printed and "the Flower side is skipped" in printed
    assert "--flower-python" in printed and "flwr[simulation]" in printed
    assert "Flower skipped" in printed
    assert "/flower" not in printed and "4 runs: cross-silo/1/lightning_fed" in printed


def test_bad_settings_name_the_option(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main(["--dry-run", "--rounds", "1"])
    assert "`--rounds` must be an integer >= 2; got 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--dry-run", "--workers", "1", "0"])
    assert "`--workers` must be an integer >= 1; got 0" in capsys.readouterr().err
