"""ShakespeareFederated reads LEAF's JSON offline: LEAF's character ids, one client per role, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.tiny_data import write_leaf, write_shakespeare

from lightning_fed.datamodules import Sent140Federated, ShakespeareFederated
from lightning_fed.datamodules.shakespeare import LEAF_LETTERS, UNKNOWN_CHARACTER, encode_characters


def _served(loader) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*loader)
    return torch.cat(xs), torch.cat(ys)


def test_leaf_alphabet_has_80_characters_in_leafs_order() -> None:
    assert len(LEAF_LETTERS) == 80 == UNKNOWN_CHARACTER and ShakespeareFederated.num_classes == 81
    ids = encode_characters(["\n Az}", "é|a~b"], 5)
    assert ids.dtype == np.uint8
    assert ids.tolist() == [[0, 1, 25, 78, 79], [80, 80, 53, 80, 54]]  # LEAF's find(); 80 for anything else


def test_windows_and_next_characters_per_role(tmp_path) -> None:
    write_leaf(tmp_path / "train", {"ROMEO": (["To be", "or no"], ["t", "!"]), "JULIET": (["hello"], ["\n"])})
    write_leaf(tmp_path / "test", {"ROMEO": (["abcde"], ["f"]), "JULIET": (["xyz}?"], ["é"])})
    dm = ShakespeareFederated(str(tmp_path), seq_length=5, batch_size=4)
    assert dm.num_clients == 2
    dm.setup()
    # Clients in role-name order: JULIET, ROMEO.
    x, y = _served(dm.client_dataloader(1, seed=0))
    assert x.dtype == torch.uint8 and x.shape == (2, 5)
    rows = sorted(zip(x.tolist(), y.tolist()))
    expected = sorted(
        (encode_characters([w], 5)[0].tolist(), LEAF_LETTERS.find(c)) for w, c in [("To be", "t"), ("or no", "!")]
    )
    assert rows == expected
    x, y = _served(dm.client_test_dataloader(0))
    assert x.tolist() == encode_characters(["xyz}?"], 5).tolist() and y.tolist() == [UNKNOWN_CHARACTER]
    assert _served(dm.test_dataloader())[0].shape == (2, 5)


def test_generated_roles_load_with_the_default_split(tmp_path) -> None:
    dm = ShakespeareFederated(str(write_shakespeare(tmp_path, seq_length=12)), seq_length=12, num_clients=2)
    dm.setup()
    assert dm.num_clients == 2 and dm.client_num_samples(0) == 12


def test_wrong_window_length_is_named(tmp_path) -> None:
    write_leaf(tmp_path / "train", {"A": (["abc"], ["d"])})
    with pytest.raises(ValueError, match="seq_length"):
        ShakespeareFederated(str(tmp_path), seq_length=80)
    write_leaf(tmp_path / "two" / "train", {"A": (["abc"], ["de"])})
    with pytest.raises(ValueError, match="one character"):
        ShakespeareFederated(str(tmp_path / "two"), seq_length=3)


def test_missing_data_says_how_to_generate_it_now_or_at_setup(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match=r"data/shakespeare run `\./preprocess\.sh"):
        ShakespeareFederated(str(tmp_path / "missing"))
    # With num_clients the count is known: a preset parses without the data, and setup reports it missing.
    for cls in (ShakespeareFederated, Sent140Federated):
        dm = cls(str(tmp_path / "missing"), num_clients=5)
        assert dm.num_clients == 5
        with pytest.raises(FileNotFoundError, match="preprocess.sh"):
            dm.setup()


def test_deferred_read_selects_the_same_users_as_an_eager_one(tmp_path) -> None:
    root = write_shakespeare(tmp_path / "data", seq_length=8, num_users=5, per_user=4)
    eager = ShakespeareFederated(str(root), seq_length=8, num_clients=3, seed=2)
    lazy = ShakespeareFederated(str(tmp_path / "later"), seq_length=8, num_clients=3, seed=2)
    (tmp_path / "data").rename(tmp_path / "later")
    eager_users = list(eager._users)
    lazy.setup()
    assert lazy._users == eager_users
    too_many = ShakespeareFederated(str(tmp_path / "empty"), seq_length=8, num_clients=9)
    (tmp_path / "later").rename(tmp_path / "empty")
    with pytest.raises(ValueError, match="num_clients"):
        too_many.setup()
