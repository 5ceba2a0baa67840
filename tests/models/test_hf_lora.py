"""HFLoRAModule: a transformers model with PEFT LoRA, trained federatedly from Python on HF dict batches (the token
task and a ``datasets.Dataset``), only its adapters changing; the one line a user without the `llm` extra gets."""

from __future__ import annotations

import sys
import warnings

import lightning.pytorch as L
import pytest
import torch
from helpers.boring import fast_trainer

from lightning_fed.checks import InvalidArgumentError
from lightning_fed.datamodules import DirichletPartitioner, IidPartitioner, TokenPatternsFederated
from lightning_fed.models import HFLoRAModule
from lightning_fed.utilities.extras import MissingExtraError

LLM_EXTRA = "needs the `llm` extra (pip install 'lightning-fed[llm]')"

# hidden 32, 2 layers, vocab 64, sequences of 16: a few seconds per test on 2 cores.
TINY = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=16,
    pad_token_id=0,
)


@pytest.fixture(autouse=True)
def _llm_libraries(request) -> None:
    if "without_the_extra" not in request.node.name:  # those simulate its absence, whether it is installed or not
        pytest.importorskip("transformers", reason=LLM_EXTRA)
        pytest.importorskip("peft", reason=LLM_EXTRA)


def _module(task: str = "causal_lm", **kwargs) -> HFLoRAModule:
    L.seed_everything(0)
    if task == "sequence_classification":
        kwargs.setdefault("num_labels", 4)
    kwargs.setdefault("config", dict(TINY))
    kwargs.setdefault("lr", 0.01)
    return HFLoRAModule(task=task, **kwargs)


def _mean_loss(module: HFLoRAModule, loader) -> float:
    module.eval()
    with torch.no_grad():
        losses = [module(**module.model_inputs(batch)).loss for batch in loader]
    return float(torch.stack(losses).mean())


def _frozen_and_trained(module: HFLoRAModule) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    state = {name: parameter.detach().clone() for name, parameter in module.named_parameters()}
    trainable = {name for name, parameter in module.named_parameters() if parameter.requires_grad}
    return (
        {name: value for name, value in state.items() if name not in trainable},
        {name: value for name, value in state.items() if name in trainable},
    )


@pytest.mark.parametrize(
    ("task", "extra"),
    [("causal_lm", {"modules_to_save": ["lm_head"], "lr": 0.03}), ("sequence_classification", {})],
)
def test_trains_federatedly_from_python_and_only_the_adapters_change(task, extra, tmp_path) -> None:
    module = _module(task, **extra)
    data = TokenPatternsFederated(
        DirichletPartitioner(4, alpha=1.0, seed=0), task=task, num_samples=480, num_test_samples=96, batch_size=32
    )
    data.setup()
    before = _mean_loss(module, data.test_dataloader())
    frozen, trained = _frozen_and_trained(module)
    fast_trainer(tmp_path, num_rounds=3, clients_per_round=4, local_epochs=1, client_eval="none").fit(
        module, datamodule=data
    )
    after = _mean_loss(module, data.test_dataloader())
    # Causal LM starts near log(64) = 4.2, the classifier near log(4) = 1.4; both fall by more than half (here to 0.49
    # and 0.27).
    assert after < 0.5 * before, (before, after)
    frozen_after, trained_after = _frozen_and_trained(module)
    assert frozen_after.keys() == frozen.keys()
    assert all(torch.equal(frozen[name], frozen_after[name]) for name in frozen), "the frozen base changed"
    assert any("lora_B" in name and not torch.equal(trained[name], trained_after[name]) for name in trained)
    # LoRA on q_proj/v_proj plus the head PEFT trains in full; nothing else.
    head = "lm_head" if task == "causal_lm" else "score"
    assert trained and all("lora_" in name or head in name for name in trained), sorted(trained)


def test_trains_on_a_datasets_dataset_split_by_a_partitioner(tmp_path) -> None:
    datasets = pytest.importorskip("datasets", reason=LLM_EXTRA)
    from lightning_fed.datamodules import HFDatasetFederated

    source = TokenPatternsFederated(IidPartitioner(1), num_samples=400, num_test_samples=80)
    train, test = source._load_datasets()

    def rows(split) -> datasets.Dataset:
        # Tokenised text as a user's `datasets.map` leaves it: padded ids, the mask, and the class column `label`.
        return datasets.Dataset.from_dict(
            {
                "input_ids": split.input_ids.tolist(),
                "attention_mask": split.attention_mask.tolist(),
                "label": split.targets.tolist(),
                "text": [f"sequence {index}" for index in range(len(split))],
            }
        )

    data = HFDatasetFederated(
        rows(train),
        rows(test),
        DirichletPartitioner(3, alpha=0.5, seed=0),
        columns=["input_ids", "attention_mask", "label"],
        batch_size=32,
    )
    data.setup()
    module = _module("sequence_classification")
    before = _mean_loss(module, data.test_dataloader())
    fast_trainer(tmp_path, num_rounds=3, clients_per_round=3, local_epochs=1, client_eval="none").fit(
        module, datamodule=data
    )
    after = _mean_loss(module, data.test_dataloader())
    assert after < 0.5 * before


def test_client_parallelism_vectorises_it_with_eager_attention(tmp_path) -> None:
    # transformers' SDPA mask code branches on the mask's values, which vmap cannot follow; eager attention does not.
    data = TokenPatternsFederated(IidPartitioner(4), num_samples=160, num_test_samples=32, batch_size=16)
    trained = []
    for parallelism in (1, 2):
        module = _module("sequence_classification", config={**TINY, "attn_implementation": "eager"})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = fast_trainer(
                tmp_path / str(parallelism),
                num_rounds=1,
                clients_per_round=4,
                local_epochs=1,
                client_parallelism=parallelism,
                client_eval="none",
            )
            trainer.fit(module, datamodule=data)
        assert not [w for w in caught if "falls back" in str(w.message)], [str(w.message) for w in caught]
        trained.append({name: p.detach().clone() for name, p in module.named_parameters() if p.requires_grad})
    for name, value in trained[0].items():
        torch.testing.assert_close(trained[1][name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_a_run_resumed_from_its_first_round_ends_bit_identical(tmp_path) -> None:
    data = TokenPatternsFederated(DirichletPartitioner(2, alpha=1.0, seed=0), num_samples=128, batch_size=16)
    settings = dict(num_rounds=2, clients_per_round=2, seed=0, enable_checkpointing=True, client_eval="none")
    whole = _module("sequence_classification")
    trainer = fast_trainer(tmp_path / "whole", **settings)
    trainer.fit(whole, datamodule=data)
    first_round = trainer.fed_run_dir / "checkpoints" / "round0000.ckpt"
    resumed = _module("sequence_classification")
    with torch.no_grad():  # a different start, so that only the checkpoint can make them equal
        for parameter in resumed.parameters():
            parameter.add_(1.0)
    fast_trainer(tmp_path / "resumed", **settings).fit(resumed, datamodule=data, ckpt_path=str(first_round))
    for (name, value), (_, other) in zip(whole.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(value, other), name


def test_the_module_starts_in_training_mode() -> None:
    # transformers builds models in eval mode, and Lightning keeps the modes it finds: dropout would never apply.
    module = _module(lora_dropout=0.1)
    assert all(submodule.training for submodule in module.modules())


def test_the_optimizer_holds_only_the_trainable_parameters() -> None:
    module = _module()
    optimizer = module.configure_optimizers()
    held = {id(parameter) for group in optimizer.param_groups for parameter in group["params"]}
    trainable = {id(parameter) for parameter in module.parameters() if parameter.requires_grad}
    assert held == trainable
    # r 8 on q_proj and v_proj (32 x 32) of 2 layers: (8 * 32 + 32 * 8) * 2 * 2 = 2048 adapter weights.
    assert sum(parameter.numel() for parameter in module.parameters() if parameter.requires_grad) == 2048


def test_causal_lm_labels_default_to_the_ids_with_padding_ignored() -> None:
    module = _module()
    ids = torch.tensor([[5, 6, 7, 0]])
    inputs = module.model_inputs({"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 0]])})
    assert inputs["labels"].tolist() == [[5, 6, 7, -100]]
    assert module.model_inputs({"input_ids": ids})["attention_mask"].tolist() == [[1, 1, 1, 1]]


def test_sequence_classification_reads_the_label_column_when_there_are_no_labels() -> None:
    module = _module("sequence_classification")
    inputs = module.model_inputs({"input_ids": torch.tensor([[3, 4]]), "label": torch.tensor([2])})
    assert inputs["labels"].tolist() == [2]


def test_loads_a_saved_pretrained_model_from_a_local_directory(tmp_path) -> None:
    transformers = pytest.importorskip("transformers", reason=LLM_EXTRA)
    torch.manual_seed(1)
    saved = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model("llama", **TINY))
    saved.save_pretrained(tmp_path / "tiny")
    module = HFLoRAModule(pretrained=str(tmp_path / "tiny"))
    loaded = module.model.get_base_model().state_dict()
    for name, tensor in saved.state_dict().items():
        # PEFT keeps a wrapped layer's own weight under `base_layer`.
        wrapped = name.replace("q_proj.", "q_proj.base_layer.").replace("v_proj.", "v_proj.base_layer.")
        assert torch.equal(loaded[wrapped], tensor), name


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"config": {**TINY, "hiden_size": 32}}, "`config` must be a mapping of LlamaConfig's settings (`hiden_size`"),
        ({"config": {**TINY, "num_layers": 2}}, "`config` must be a mapping of LlamaConfig's settings (`num_layers`"),
        ({"task": "sequence_classification"}, "`num_labels` must be the number of classes"),
        ({"num_labels": 3}, "`num_labels` must be null with task='causal_lm'"),
        ({"target_modules": ["qkv"]}, "`target_modules` must be layers of the model"),
        ({"target_modules": "q_proj"}, "`target_modules` must be a list of layer names"),
        ({"lora_r": 0}, "`lora_r` must be"),
        ({"model_type": "lama"}, "`model_type` must be a transformers architecture name"),
        (
            {"task": "sequence_classification", "num_labels": 2, "config": {**TINY, "pad_token_id": None}},
            "`config` must be a mapping with `pad_token_id`",
        ),
    ],
)
def test_bad_settings_are_named_in_one_line(kwargs, named) -> None:
    settings = {"config": dict(TINY), **kwargs}
    with pytest.raises(InvalidArgumentError) as raised:
        HFLoRAModule(**settings)
    assert str(raised.value).startswith(named), str(raised.value)
    assert "\n" not in str(raised.value)


def test_labels_of_the_other_task_are_refused_naming_both_settings() -> None:
    ids = torch.tensor([[3, 4, 5]])
    with pytest.raises(ValueError, match=r"task='sequence_classification' takes `labels` of shape \[B\].*\[1, 3\]"):
        _module("sequence_classification").model_inputs({"input_ids": ids, "labels": ids})
    with pytest.raises(ValueError, match=r"task='causal_lm' takes `labels` of shape \[B, T\].*\[1\]"):
        _module().model_inputs({"input_ids": ids, "labels": torch.tensor([2])})


def test_a_batch_without_input_ids_is_refused_naming_the_keys() -> None:
    with pytest.raises(ValueError, match=r"dict batches with `input_ids`.*got \['image', 'label'\]"):
        _module().model_inputs({"image": torch.zeros(1), "label": torch.zeros(1)})


@pytest.mark.parametrize("missing", ["transformers", "peft"])
def test_without_the_extra_one_line_names_it(missing, monkeypatch) -> None:
    if missing == "peft":  # transformers is imported first: its absence would be named instead
        pytest.importorskip("transformers", reason=LLM_EXTRA)
    monkeypatch.setitem(sys.modules, missing, None)  # `import missing` now fails as if it were not installed
    with pytest.raises(MissingExtraError) as raised:
        HFLoRAModule(config=dict(TINY))
    message = str(raised.value)
    assert message == (
        f"HFLoRAModule needs `{missing}`, which is not installed: install the `llm` extra"
        " (`pip install 'lightning-fed[llm]'`)."
    )
    assert isinstance(raised.value, ModuleNotFoundError)
