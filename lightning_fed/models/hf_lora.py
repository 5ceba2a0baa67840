"""A Hugging Face ``transformers`` model with PEFT LoRA adapters, as a LightningModule that trains on HF's dict batches.

LoRA (Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models", 2021, arXiv:2106.09685) freezes a pretrained
weight W₀ and trains a low-rank update, so that a target layer computes

    h = W₀ x + (α / r) · B A x,    A ∈ R^{r × d_in}, B ∈ R^{d_out × r}, B = 0 at the start,

with rank r and scale α. Only A and B (and any ``modules_to_save``, e.g. a new classification head) train; the
federated clients of FlowerTune, NVFlare's ``llm_hf`` and OpenFedLLM fine-tune exactly this.

``transformers`` and ``peft`` are imported when the module is built: they are the ``llm`` extra
(``pip install 'lightning-fed[llm]'``), never needed by the rest of lightning_fed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import lightning.pytorch as L
import torch
from torch import Tensor, nn
from typing_extensions import override

from lightning_fed.checks import InvalidArgumentError, check_choice, check_int, check_real
from lightning_fed.utilities.extras import require_extra

TASKS = ("causal_lm", "sequence_classification")
_OPTIMIZERS = ("sgd", "adam", "adamw")
IGNORE_INDEX = -100
"""The label that HF's losses skip (padding, prompt tokens): ``torch.nn.CrossEntropyLoss``'s ``ignore_index``."""


def _check_names(name: str, value: Any, allowed: str) -> tuple[str, ...]:
    """``value`` is a non-empty sequence of non-empty strings (not a string itself); returns it as a tuple."""
    if isinstance(value, str) or not isinstance(value, Sequence) or not value:
        raise InvalidArgumentError(name, value, allowed)
    if not all(isinstance(item, str) and item for item in value):
        raise InvalidArgumentError(name, value, allowed)
    return tuple(value)


def _validate(
    task: str,
    config: Mapping[str, Any] | None,
    num_labels: int | None,
    lora: tuple[int, float, float],
    optimizer: str,
    lr: float,
    weight_decay: float,
) -> None:
    """Raises :class:`~lightning_fed.checks.InvalidArgumentError` naming the first bad argument."""
    check_choice("task", task, TASKS)
    if config is not None and (not isinstance(config, Mapping) or not all(isinstance(key, str) for key in config)):
        raise InvalidArgumentError("config", config, "a mapping of the model config's settings, e.g. {hidden_size: 32}")
    if task == "sequence_classification":
        if num_labels is None:
            raise InvalidArgumentError(
                "num_labels", num_labels, "the number of classes (>= 2) for sequence_classification"
            )
        check_int("num_labels", num_labels, minimum=2)
    elif num_labels is not None:
        raise InvalidArgumentError("num_labels", num_labels, "null with task='causal_lm' (it predicts tokens)")
    rank, alpha, dropout = lora
    check_int("lora_r", rank, minimum=1)
    check_real("lora_alpha", alpha, minimum=0.0, exclusive_minimum=True)
    check_real("lora_dropout", dropout, minimum=0.0, maximum=1.0, exclusive_maximum=True)
    check_choice("optimizer", optimizer, _OPTIMIZERS)
    check_real("lr", lr, minimum=0.0, exclusive_minimum=True)
    check_real("weight_decay", weight_decay, minimum=0.0)


class HFLoRAModule(L.LightningModule):
    """A ``transformers`` model with PEFT LoRA adapters on ``target_modules``, trained on dict batches.

    The model is built from a config at random initialisation (``model_type`` and ``config``: e.g. ``"llama"`` and
    ``{hidden_size: 32, num_hidden_layers: 2, ...}``), or loaded with ``from_pretrained`` (``pretrained``: a local
    directory written by ``save_pretrained``, or a hub name where the hub can be reached). PEFT then freezes it and
    adds LoRA adapters (``peft.get_peft_model``): only the adapters (and ``modules_to_save``) train, and the
    optimizer holds only them.

    Batches are dicts in Hugging Face's shape (``datasets`` items, ``DataCollator`` outputs):

    * ``input_ids``: ``[B, T]`` token ids; ``attention_mask``: ``[B, T]``, 1 for real tokens (optional: all ones);
    * ``labels``: for ``task="causal_lm"``, ``[B, T]`` next-token targets, shifted inside the model as HF does,
      with ``-100`` where no loss is taken; absent, they are ``input_ids`` with the padding (``attention_mask`` 0)
      set to ``-100``. For ``task="sequence_classification"``, ``[B]`` class ids (a ``label`` key, as ``datasets``
      names the column, is read when ``labels`` is absent).

    Other keys (a partitioner's label column, text) are ignored. The loss is the model's own (HF's cross-entropy).
    Logged: ``train_loss``; ``val_loss`` and ``val_acc``; ``test_loss`` and ``test_acc``, where the accuracy is the
    fraction of correct classes, or of correctly predicted tokens among those with a label (averaged over all of a
    pass's tokens, not per batch).

    Args:
        task: ``"causal_lm"`` (``AutoModelForCausalLM``) or ``"sequence_classification"``
            (``AutoModelForSequenceClassification``, whose new head ``score`` PEFT trains as well).
        model_type: The architecture of a randomly initialised model (``transformers.AutoConfig.for_model``), e.g.
            ``"llama"``, ``"qwen2"``, ``"gpt2"``; unused with ``pretrained``.
        config: The model config's settings (e.g. ``hidden_size``, ``num_hidden_layers``, ``vocab_size``,
            ``pad_token_id``); with ``pretrained``, overrides of the saved config. A key the config does not know is
            refused (``transformers`` would silently keep it).
        pretrained: ``from_pretrained``'s ``pretrained_model_name_or_path``; ``None`` builds the model at random
            initialisation.
        num_labels: Classes for ``sequence_classification``; ``None`` for ``causal_lm``.
        lora_r: LoRA rank r.
        lora_alpha: LoRA scale α (the update is scaled by α / r).
        lora_dropout: Dropout on the adapters' input.
        target_modules: Names of the layers that get adapters (e.g. ``["q_proj", "v_proj"]`` for LLaMA-shaped models).
        modules_to_save: Layers that train in full beside the adapters (e.g. ``["lm_head"]``); ``None`` for none
            (PEFT adds the classification head for ``sequence_classification`` itself).
        optimizer: ``"sgd"``, ``"adam"`` or ``"adamw"``, over the trainable parameters only.
        lr: Learning rate.
        weight_decay: L2 penalty (decoupled for AdamW).

    Raises:
        lightning_fed.utilities.extras.MissingExtraError: If ``transformers`` or ``peft`` is not installed (the
            ``llm`` extra).

    Example:
        >>> module = HFLoRAModule(config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        ...     "num_attention_heads": 4, "vocab_size": 64})
    """

    def __init__(
        self,
        task: Literal["causal_lm", "sequence_classification"] = "causal_lm",
        model_type: str = "llama",
        config: dict[str, Any] | None = None,
        pretrained: str | None = None,
        num_labels: int | None = None,
        lora_r: int = 8,
        lora_alpha: float = 16.0,
        lora_dropout: float = 0.0,
        target_modules: Sequence[str] = ("q_proj", "v_proj"),
        modules_to_save: Sequence[str] | None = None,
        optimizer: Literal["sgd", "adam", "adamw"] = "adamw",
        lr: float = 1e-3,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__()
        _validate(task, config, num_labels, (lora_r, lora_alpha, lora_dropout), optimizer, lr, weight_decay)
        targets = _check_names("target_modules", target_modules, 'a list of layer names, e.g. ["q_proj", "v_proj"]')
        saved = None
        if modules_to_save is not None:
            saved = _check_names("modules_to_save", modules_to_save, 'null or a list of layer names, e.g. ["lm_head"]')
        self.save_hyperparameters()
        self.task = task
        transformers, peft = require_extra(type(self).__name__, "llm", "transformers", "peft")
        base = _base_model(transformers, task, model_type, dict(config or {}), pretrained, num_labels)
        lora = peft.LoraConfig(
            r=lora_r,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            target_modules=list(targets),
            modules_to_save=None if saved is None else list(saved),
            task_type=peft.TaskType.CAUSAL_LM if task == "causal_lm" else peft.TaskType.SEQ_CLS,
        )
        try:
            self.model: nn.Module = peft.get_peft_model(base, lora)
        except ValueError as error:  # PEFT names the missing target; say which setting to change
            raise InvalidArgumentError("target_modules", list(targets), f"layers of the model ({error})") from error
        # transformers builds and loads models in eval mode, and Lightning keeps the modes it finds at the start of
        # training: without this, dropout (``lora_dropout``, the model's own) would be off while training.
        self.model.train()

    @override
    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None) -> Any:
        """The model's output (``loss`` when given ``labels``, ``logits``)."""
        return self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)

    def model_inputs(self, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """``input_ids``, ``attention_mask`` and ``labels`` of a dict batch (see the class docstring)."""
        if not isinstance(batch, Mapping) or "input_ids" not in batch:
            keys = list(batch) if isinstance(batch, Mapping) else type(batch).__name__
            raise ValueError(
                f"{type(self).__name__} trains on dict batches with `input_ids` (and `attention_mask`, `labels`);"
                f" got {keys}: serve HF-style items (`HFDatasetFederated`, `TokenPatternsFederated`), or"
                " `batch_format: dict` with `batch_keys: [input_ids, labels]`."
            )
        input_ids = batch["input_ids"]
        attention_mask = batch.get("attention_mask")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        labels = batch.get("labels")
        if labels is None and self.task == "sequence_classification":
            labels = batch.get("label")
        if labels is None:
            if self.task == "sequence_classification":
                raise ValueError("A sequence_classification batch needs `labels` (or `label`): the class ids [B].")
            labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
        expected = 1 if self.task == "sequence_classification" else 2
        if labels.ndim != expected:
            shape = "[B] (a class per sequence)" if expected == 1 else "[B, T] (a target per token)"
            raise ValueError(
                f"task={self.task!r} takes `labels` of shape {shape}; the batch's are {list(labels.shape)}: serve"
                " labels for this task (e.g. the datamodule's `task`), or set the module's `task`."
            )
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

    def _loss_and_accuracy(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor, int]:
        """The batch's loss, its accuracy and the number of predictions the accuracy counts."""
        inputs = self.model_inputs(batch)
        output = self(**inputs)
        logits, labels = output.logits, inputs["labels"]
        if self.task == "causal_lm":
            # HF's causal-LM loss predicts token t + 1 from the tokens up to t; the accuracy counts the same pairs.
            logits, labels = logits[:, :-1], labels[:, 1:]
        counted = labels != IGNORE_INDEX
        count = int(counted.sum())
        correct = (logits.argmax(-1) == labels) & counted
        accuracy = correct.sum() / max(count, 1)
        return output.loss, accuracy, count

    @override
    def training_step(self, batch: Mapping[str, Tensor], batch_idx: int) -> Tensor:
        """Returns the model's loss of the batch and logs it as ``train_loss``."""
        inputs = self.model_inputs(batch)
        loss = self(**inputs).loss
        self.log("train_loss", loss, batch_size=inputs["input_ids"].shape[0])
        return loss

    def _evaluate(self, batch: Mapping[str, Tensor], stage: str) -> None:
        loss, accuracy, count = self._loss_and_accuracy(batch)
        self.log(f"{stage}_loss", loss, batch_size=batch["input_ids"].shape[0])
        # Weighted by the predictions it counts, so that the epoch's value is the accuracy over all of them.
        self.log(f"{stage}_acc", accuracy, batch_size=max(count, 1))

    @override
    def validation_step(self, batch: Mapping[str, Tensor], batch_idx: int) -> None:
        """Logs ``val_loss`` and ``val_acc``."""
        self._evaluate(batch, "val")

    @override
    def test_step(self, batch: Mapping[str, Tensor], batch_idx: int) -> None:
        """Logs ``test_loss`` and ``test_acc``."""
        self._evaluate(batch, "test")

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        """The optimizer named by ``optimizer`` over the trainable parameters (the adapters, ``modules_to_save``)."""
        hp = self.hparams
        trainable = [parameter for parameter in self.parameters() if parameter.requires_grad]
        lr, weight_decay = hp["lr"], hp["weight_decay"]
        if hp["optimizer"] == "sgd":
            return torch.optim.SGD(trainable, lr=lr, weight_decay=weight_decay)
        optimizer_cls = torch.optim.Adam if hp["optimizer"] == "adam" else torch.optim.AdamW
        return optimizer_cls(trainable, lr=lr, weight_decay=weight_decay)


def _base_model(
    transformers: Any,
    task: str,
    model_type: str,
    settings: dict[str, Any],
    pretrained: str | None,
    num_labels: int | None,
) -> nn.Module:
    """The ``transformers`` model before LoRA: random init from a config, or ``from_pretrained``."""
    auto = transformers.AutoModelForCausalLM if task == "causal_lm" else transformers.AutoModelForSequenceClassification
    overrides = settings if num_labels is None else {**settings, "num_labels": num_labels}
    if pretrained is not None:
        default = transformers.AutoConfig.from_pretrained(pretrained)
        model_config = transformers.AutoConfig.from_pretrained(pretrained, **overrides)
    else:
        try:
            default = transformers.AutoConfig.for_model(model_type)
        except ValueError as error:
            raise InvalidArgumentError(
                "model_type", model_type, "a transformers architecture name, e.g. 'llama', 'qwen2', 'gpt2'"
            ) from error
        model_config = transformers.AutoConfig.for_model(model_type, **overrides)
    _check_config_keys(settings, default, model_config)
    if task == "sequence_classification" and model_config.pad_token_id is None:
        # LLaMA-shaped classifiers read the last token before the padding: without a padding id they refuse batches.
        raise InvalidArgumentError(
            "config", settings, "a mapping with `pad_token_id` (the id that pads sequences) for sequence_classification"
        )
    if pretrained is not None:
        return auto.from_pretrained(pretrained, config=model_config)
    return auto.from_config(model_config)


def _check_config_keys(settings: Mapping[str, Any], default: Any, built: Any) -> None:
    """Every key of ``settings`` is a setting of the model's config.

    transformers keeps a key it does not know as an attribute of its own, so a misspelt ``hiden_size`` would be
    silently ignored: a key that the built config holds under its own name but the default config does not is one.
    Settings that transformers consumes (``attn_implementation``) or renames stay allowed.
    """
    known, held = set(default.to_dict()), set(built.to_dict())
    for key in settings:
        if key in held and key not in known:
            raise InvalidArgumentError(
                "config",
                dict(settings),
                f"a mapping of {type(default).__name__}'s settings (`{key}` is not one; e.g. hidden_size,"
                " num_hidden_layers, vocab_size)",
            )


__all__ = ["IGNORE_INDEX", "TASKS", "HFLoRAModule"]
