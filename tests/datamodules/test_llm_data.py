"""Token data for foundation models: the token-pattern task (its rule, its labels, its split by class) and client data
from a Hugging Face ``datasets.Dataset`` split by a partitioner on its label column."""

from __future__ import annotations

import pytest
import torch

from lightning_fed.checks import InvalidArgumentError
from lightning_fed.datamodules import DirichletPartitioner, IidPartitioner, ShardPartitioner, TokenPatternsFederated
from lightning_fed.datamodules.token_patterns import IGNORE_INDEX, PAD_TOKEN_ID

LLM_EXTRA = "needs the `llm` extra (pip install 'lightning-fed[llm]')"


def _data(**kwargs) -> TokenPatternsFederated:
    kwargs.setdefault("partitioner", IidPartitioner(2))
    data = TokenPatternsFederated(num_samples=200, num_test_samples=50, **kwargs)
    data.setup()
    return data


def test_every_sequence_walks_its_class_cycle() -> None:
    data = _data(num_classes=4, vocab_size=20, seq_len=12)
    train = data._split.train
    ids, mask, classes = train.input_ids, train.attention_mask, train.targets
    successor: dict[int, int] = {}
    class_of_token: dict[int, int] = {}
    for row, label in zip(ids.tolist(), classes.tolist()):
        real = [token for token in row if token != PAD_TOKEN_ID]
        for token, following in zip(real, real[1:]):
            assert successor.setdefault(token, following) == following, "a token has two successors"
        for token in real:
            assert class_of_token.setdefault(token, label) == label, "a token belongs to two classes"
    # The tokens 1..19 fall into 4 cycles of 4 or 5: following a token's successors comes back to it.
    assert sorted(successor) == list(range(1, 20))
    for start in successor:
        token, steps = successor[start], 1
        while token != start:
            token, steps = successor[token], steps + 1
        assert steps in (4, 5) and class_of_token[token] == class_of_token[start]
    # Right padding: a prefix of ones, at least min_length (seq_len // 2) long.
    lengths = mask.sum(1)
    assert torch.equal(mask, (torch.arange(12) < lengths.unsqueeze(1)).long())
    assert int(lengths.min()) >= 6 and int(lengths.max()) <= 12
    assert torch.equal(ids == PAD_TOKEN_ID, mask == 0)


def test_items_are_hf_dicts_whose_labels_follow_the_task() -> None:
    classify = _data(task="sequence_classification")
    batch = next(iter(classify.client_dataloader(0, seed=0)))
    assert sorted(batch) == ["attention_mask", "input_ids", "labels"]
    assert batch["labels"].shape == (32,) and batch["input_ids"].shape == (32, 16)
    train = classify._split.train
    assert torch.equal(train.labels_column, train.targets)

    causal = _data(task="causal_lm")
    train = causal._split.train
    assert torch.equal(train.labels_column, train.input_ids.masked_fill(train.attention_mask == 0, IGNORE_INDEX))
    assert torch.equal(train.targets, classify._split.train.targets), "the task changes the labels, not the data"


def test_the_same_seed_draws_the_same_data_and_test_shares_the_cycles() -> None:
    first, second, other = _data(seed=3), _data(seed=3), _data(seed=4)
    assert torch.equal(first._split.train.input_ids, second._split.train.input_ids)
    assert not torch.equal(first._split.train.input_ids, other._split.train.input_ids)
    successor = {}
    for split in (first._split.train, first._split.test):
        for row in split.input_ids.tolist():
            real = [token for token in row if token != PAD_TOKEN_ID]
            for token, following in zip(real, real[1:]):
                assert successor.setdefault(token, following) == following


def test_a_dirichlet_split_skews_the_classes_per_client() -> None:
    skewed = _data(partitioner=DirichletPartitioner(4, alpha=0.1, seed=0), num_classes=4)
    histogram = skewed.label_histogram()
    assert histogram.shape == (4, 4) and int(histogram.sum()) == 200 - int(skewed._split.client_tests.flat.numel())
    # The split follows the classes: most clients miss a class, and their mix is far from the population's.
    assert int((histogram == 0).any(1).sum()) >= 3, histogram
    iid = _data(partitioner=IidPartitioner(4), num_classes=4)
    assert float(skewed.client_emd().mean()) > 3 * float(iid.client_emd().mean())


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"vocab_size": 8, "num_classes": 4}, "`vocab_size` must be"),
        ({"min_length": 20}, "`min_length` must be at most seq_len=16"),
        ({"task": "translation"}, "`task` must be one of"),
    ],
)
def test_bad_settings_are_named(kwargs, named) -> None:
    with pytest.raises(InvalidArgumentError) as raised:
        TokenPatternsFederated(IidPartitioner(2), **kwargs)
    assert str(raised.value).startswith(named), str(raised.value)


# ---------------------------------------------------------------------------------------------------------------
# A `datasets.Dataset`


@pytest.fixture
def datasets():
    return pytest.importorskip("datasets", reason=LLM_EXTRA)


def _rows(datasets, size: int = 60):
    return datasets.Dataset.from_dict(
        {
            "input_ids": [[index % 7 + 1, index % 5 + 1, 0] for index in range(size)],
            "attention_mask": [[1, 1, 0]] * size,
            "label": [index % 3 for index in range(size)],
            "text": [f"row {index}" for index in range(size)],
        }
    )


def test_a_datasets_dataset_is_split_by_its_label_column(datasets) -> None:
    from lightning_fed.datamodules import HFDatasetFederated

    rows = _rows(datasets)
    data = HFDatasetFederated(rows, None, ShardPartitioner(3, shards_per_client=1, seed=0), batch_size=8)
    data.setup()
    served: list[int] = []
    for client in data.client_ids():
        labels = []
        for batch in data.client_dataloader(client, seed=0):
            assert sorted(batch) == ["attention_mask", "input_ids", "label", "text"]
            assert batch["input_ids"].dtype == torch.int64 and batch["input_ids"].shape[1] == 3
            assert isinstance(batch["text"], list) and isinstance(batch["text"][0], str)
            # Each served row is the dataset's row: its ids encode its index, its label is its column value.
            for text, ids, label in zip(batch["text"], batch["input_ids"].tolist(), batch["label"].tolist()):
                index = int(text.split()[1])
                assert ids == rows[index]["input_ids"] and label == rows[index]["label"]
                served.append(index)
            labels += batch["label"].tolist()
        # One shard per client of label-sorted data: each client holds one class.
        assert len(set(labels)) == 1
    assert torch.equal(data.label_histogram().sum(0), torch.tensor([16, 16, 16]))
    held_out = data._split.client_tests.flat.tolist()
    assert sorted(served + held_out) == list(range(60))


def test_columns_choose_what_a_batch_holds_and_no_label_column_means_no_labels(datasets) -> None:
    from lightning_fed.datamodules import HFDatasetFederated

    data = HFDatasetFederated(
        _rows(datasets), None, IidPartitioner(2), label_column=None, columns=["input_ids", "attention_mask"]
    )
    data.setup()
    assert not data.has_labels
    assert sorted(next(iter(data.client_dataloader(0, seed=0)))) == ["attention_mask", "input_ids"]
    with pytest.raises(InvalidArgumentError, match="partitioner"):
        HFDatasetFederated(_rows(datasets), None, DirichletPartitioner(2, alpha=1.0), label_column=None).setup()


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"label_column": "topic"}, "`label_column` must be null or one of the dataset's columns"),
        ({"label_column": "text"}, "`label_column` must be a column of integer class ids"),
        ({"columns": ["input_ids", "mask"]}, "`columns` must be column names of the dataset"),
    ],
)
def test_bad_columns_are_named(datasets, kwargs, named) -> None:
    from lightning_fed.datamodules import HFDatasetFederated

    with pytest.raises(InvalidArgumentError) as raised:
        HFDatasetFederated(_rows(datasets), None, IidPartitioner(2), **kwargs)
    assert str(raised.value).startswith(named), str(raised.value)


def test_a_dataset_dict_is_refused_with_the_split_to_pick(datasets) -> None:
    from lightning_fed.datamodules import HFDatasetFederated

    with pytest.raises(TypeError, match=r"pick a split, e.g. dataset\['train'\]"):
        HFDatasetFederated(datasets.DatasetDict({"train": _rows(datasets)}), None, IidPartitioner(2))


def test_without_the_extra_one_line_names_it(monkeypatch) -> None:
    import sys

    from lightning_fed.datamodules import HFDatasetFederated
    from lightning_fed.utilities.extras import MissingExtraError

    monkeypatch.setitem(sys.modules, "datasets", None)
    expected = r"^HFDatasetAdapter needs `datasets`.*pip install 'lightning-fed\[llm\]'"
    with pytest.raises(MissingExtraError, match=expected):
        HFDatasetFederated(object(), None, IidPartitioner(2))


def test_sequences_of_different_lengths_in_a_batch_are_refused_naming_the_fix(datasets) -> None:
    from lightning_fed.datamodules import HFDatasetFederated

    ragged = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3, 4, 5]] * 10, "label": [0, 1] * 10})
    data = HFDatasetFederated(ragged, None, IidPartitioner(2), batch_size=10)
    data.setup()
    with pytest.raises(
        ValueError, match=r"^Column `input_ids` holds sequences of different lengths.*padding='max_length'"
    ):
        next(iter(data.client_dataloader(0, seed=0)))


def test_a_dataset_saved_to_disk_is_loaded_from_its_directory(datasets, tmp_path) -> None:
    from lightning_fed.datamodules import HFDatasetFederated

    rows = _rows(datasets)
    rows.save_to_disk(str(tmp_path / "train"))
    data = HFDatasetFederated(str(tmp_path / "train"), None, DirichletPartitioner(2, alpha=1.0, seed=0))
    data.setup()
    assert torch.equal(data._split.labels, torch.tensor(rows["label"]))
    datasets.DatasetDict({"train": rows}).save_to_disk(str(tmp_path / "splits"))
    with pytest.raises(FileNotFoundError, match="holds a `DatasetDict`: name one split's directory"):
        HFDatasetFederated(str(tmp_path / "splits"), None, IidPartitioner(2))
    with pytest.raises(FileNotFoundError, match="No dataset saved with `Dataset.save_to_disk`"):
        HFDatasetFederated(str(tmp_path / "nothing"), None, IidPartitioner(2))
