"""A synthetic token task that a small randomly initialised language model learns in seconds, served as Hugging
Face-style dict items, so that federated LoRA fine-tuning can be shown and tested without downloading anything."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor
from torch.utils.data import Dataset
from typing_extensions import override

from lightning_fed.checks import InvalidArgumentError, check_choice, check_int
from lightning_fed.datamodules.base import FederatedDataModule
from lightning_fed.datamodules.partitioners.base import Partitioner
from lightning_fed.utilities.seeding import derive_seed

PAD_TOKEN_ID = 0
"""The padding token of :func:`token_patterns`; no pattern ever emits it."""

IGNORE_INDEX = -100
"""The label HF's losses skip (``torch.nn.CrossEntropyLoss``'s ``ignore_index``)."""


def token_patterns(
    num_samples: int,
    num_classes: int,
    vocab_size: int,
    seq_len: int,
    min_length: int,
    seed: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor]:
    """Sequences that walk one of ``num_classes`` disjoint cycles through the tokens ``1 .. vocab_size - 1``.

    The tokens are shuffled (by ``seed``) and cut into ``num_classes`` groups of nearly equal size, each ordered into a
    cycle; together the cycles are one permutation σ of the vocabulary. A sequence of class c starts at a uniform
    token of group c and continues x_{t+1} = σ(x_t), for a uniform length in ``[min_length, seq_len]``,
    right-padded with :data:`PAD_TOKEN_ID` to ``seq_len``. Every token tells its class, and every next token is a
    function of the current one: a classifier can reach perfect accuracy and a causal LM's loss can fall from
    log(vocab_size) towards 0. A partitioner that skews the classes skews the clients' vocabularies.

    Args:
        num_samples: Sequences to draw.
        num_classes: Cycles (classes); each has at least 2 tokens.
        vocab_size: Tokens, the padding token 0 included.
        seq_len: Padded length.
        min_length: Shortest sequence before padding.
        seed: Seeds the cycles, which every split (train, test) shares.
        generator: Draws the classes, starts and lengths.

    Returns:
        int64 ``input_ids`` ``[N, seq_len]``, int64 ``attention_mask`` ``[N, seq_len]`` and int64 classes ``[N]``.
    """
    cycles_generator = torch.Generator().manual_seed(derive_seed(seed, "token_patterns", "cycles"))
    groups = (torch.randperm(vocab_size - 1, generator=cycles_generator) + 1).tensor_split(num_classes)
    successor = torch.zeros(vocab_size, dtype=torch.int64)
    for group in groups:
        successor[group] = group.roll(-1)
    classes = torch.randint(num_classes, (num_samples,), generator=generator)
    sizes = torch.tensor([group.numel() for group in groups])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)[:-1]])
    flat = torch.cat(groups)
    position = (torch.rand(num_samples, generator=generator) * sizes[classes]).long()
    tokens = [flat[offsets[classes] + position]]
    for _ in range(seq_len - 1):
        tokens.append(successor[tokens[-1]])
    input_ids = torch.stack(tokens, dim=1)
    lengths = torch.randint(min_length, seq_len + 1, (num_samples,), generator=generator)
    attention_mask = (torch.arange(seq_len).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)
    return input_ids.masked_fill(attention_mask == 0, PAD_TOKEN_ID), attention_mask, classes


class TokenSequenceDataset(Dataset[dict[str, Tensor]]):
    """Padded token sequences as HF-style dict items: ``input_ids``, ``attention_mask``, ``labels``.

    ``targets`` holds each sequence's class for the partitioners; ``labels`` is the class
    (``task="sequence_classification"``) or the next-token targets (``task="causal_lm"``: ``input_ids`` with
    :data:`IGNORE_INDEX` at the padding, shifted inside the model as HF does).

    Args:
        input_ids: ``[N, T]`` token ids.
        attention_mask: ``[N, T]``, 1 for real tokens, 0 for padding.
        targets: ``[N]`` int64 classes.
        task: What ``labels`` holds.
    """

    def __init__(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        targets: Tensor,
        task: Literal["causal_lm", "sequence_classification"],
    ) -> None:
        if input_ids.shape != attention_mask.shape or input_ids.ndim != 2 or targets.shape != input_ids.shape[:1]:
            raise ValueError(
                f"`input_ids` and `attention_mask` must be [N, T] and `targets` [N]; got {list(input_ids.shape)},"
                f" {list(attention_mask.shape)} and {list(targets.shape)}."
            )
        self.input_ids, self.attention_mask, self.targets = input_ids, attention_mask, targets
        if task == "sequence_classification":
            self.labels_column = targets
        else:
            self.labels_column = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)

    def __len__(self) -> int:
        return self.targets.shape[0]

    @override
    def __getitem__(self, index: int) -> dict[str, Tensor]:
        return {
            "input_ids": self.input_ids[index],
            "attention_mask": self.attention_mask[index],
            "labels": self.labels_column[index],
        }


class TokenPatternsFederated(FederatedDataModule):
    """The token-pattern task of :func:`token_patterns`, federated: a sequence's class (the cycle it walks) is the
    label the partitioners split by, so a Dirichlet partitioner gives each client a skewed mix of patterns.

    Items are HF-style dicts (``input_ids``, ``attention_mask``, ``labels``), which batch into the dicts that
    :class:`~lightning_fed.models.HFLoRAModule` trains on; ``task`` chooses what ``labels`` holds (see
    :class:`TokenSequenceDataset`). The test set is drawn apart with the same cycles.

    Args:
        partitioner: Splits the training set among clients.
        task: ``"sequence_classification"`` (``labels`` = the class) or ``"causal_lm"`` (next-token targets).
        num_samples: Training sequences.
        num_test_samples: Test sequences.
        num_classes: Cycles (classes).
        vocab_size: Tokens, the padding token 0 included, at least ``2 * num_classes + 1`` (the model's
            ``vocab_size`` must be at least this).
        seq_len: Padded sequence length.
        min_length: Shortest sequence before padding; ``None`` takes ``seq_len // 2`` (at least 2).
        batch_size, eval_batch_size, client_test_fraction, client_test_size, val_fraction, num_workers, seed,
            drop_last, pin_memory, persistent_workers: As in :class:`FederatedDataModule`; ``seed`` also seeds the
            generator.

    Example:
        >>> from lightning_fed.datamodules import IidPartitioner
        >>> data = TokenPatternsFederated(IidPartitioner(2), num_samples=40, num_test_samples=10, seq_len=8)
        >>> data.setup()
        >>> sorted(next(iter(data.client_dataloader(0, seed=0))))
        ['attention_mask', 'input_ids', 'labels']
    """

    def __init__(
        self,
        partitioner: Partitioner,
        task: Literal["causal_lm", "sequence_classification"] = "sequence_classification",
        num_samples: int = 2000,
        num_test_samples: int = 400,
        num_classes: int = 4,
        vocab_size: int = 64,
        seq_len: int = 16,
        min_length: int | None = None,
        batch_size: int = 32,
        eval_batch_size: int = 256,
        client_test_fraction: float = 0.2,
        client_test_size: int | None = None,
        val_fraction: float = 0.0,
        num_workers: int = 0,
        seed: int = 0,
        drop_last: bool = False,
        pin_memory: bool = False,
        persistent_workers: bool = False,
    ) -> None:
        self.task = check_choice("task", task, ("causal_lm", "sequence_classification"))
        check_int("num_samples", num_samples, minimum=1)
        check_int("num_test_samples", num_test_samples, minimum=1)
        check_int("num_classes", num_classes, minimum=2)
        check_int("vocab_size", vocab_size, minimum=2 * num_classes + 1)  # 2 tokens a cycle, and the padding
        check_int("seq_len", seq_len, minimum=2)
        if min_length is None:
            min_length = max(2, seq_len // 2)
        check_int("min_length", min_length, minimum=2)
        if min_length > seq_len:
            raise InvalidArgumentError("min_length", min_length, f"at most seq_len={seq_len}")
        self.num_classes = num_classes
        super().__init__(
            partitioner,
            batch_size,
            eval_batch_size,
            client_test_fraction,
            client_test_size,
            val_fraction,
            num_workers,
            seed,
            None,
            "test",
            drop_last=drop_last,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
        )
        self.num_samples, self.num_test_samples = num_samples, num_test_samples
        self.vocab_size, self.seq_len, self.min_length = vocab_size, seq_len, min_length
        self.num_patterns = num_classes  # `num_classes` as the generator reads it (the base class allows None)

    def _draw(self, split: str, num_samples: int) -> TokenSequenceDataset:
        generator = torch.Generator().manual_seed(derive_seed(self.seed, "token_patterns", split))
        input_ids, attention_mask, classes = token_patterns(
            num_samples, self.num_patterns, self.vocab_size, self.seq_len, self.min_length, self.seed, generator
        )
        return TokenSequenceDataset(input_ids, attention_mask, classes, self.task)

    @override
    def _load_datasets(self) -> tuple[TokenSequenceDataset, TokenSequenceDataset]:
        return self._draw("train", self.num_samples), self._draw("test", self.num_test_samples)


__all__ = ["IGNORE_INDEX", "PAD_TOKEN_ID", "TokenPatternsFederated", "TokenSequenceDataset", "token_patterns"]
