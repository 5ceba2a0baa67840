"""Peak memory of one federated round of a LoRA-adapted LLaMA-shaped model against a plain loop doing the same steps.

The workload is what a user fine-tuning a foundation model has: a ``transformers`` ``LlamaForCausalLM`` at random
init (no weights can be downloaded here; the memory does not depend on their values) wrapped by PEFT LoRA (rank 8,
α 16, on ``q_proj`` and ``v_proj``), inside a plain LightningModule that trains on dict batches in HF's shape
(``input_ids``, ``attention_mask``, ``labels``), with AdamW on the adapters. Two ways, each in a fresh Python
process so that nothing one allocated is still held when the other starts:

* ``plain``: a hand-written loop, 8 optimizer steps (the same module, its ``training_step``, AdamW);
* ``lightning_fed``: ``FederatedTrainer``, FedAvg, one round of 2 clients × 4 local steps (8 steps in all), no
  logger, no checkpoint, no evaluation.

Each child reports ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` at the end (the whole process's high-water mark:
libraries, model, data and training) and the model's parameter counts; with ``--device cuda``, the GPU's peak instead
(``torch.cuda.max_memory_allocated``: the model, the adapters' optimizer state, activations and every copy the
engine makes on the device). The table gives both peaks and their ratio. ``--shape 135m`` is SmolLM-135M's shape
(hidden 576, 30 layers, 9 heads, 3 KV heads, vocabulary 49 152: 135 M parameters, 0.2 % trainable with LoRA r 8 on
q/v); ``--shape qwen2.5-0.5b`` Qwen2.5-0.5B's (hidden 896, 24 layers, 14 heads, 2 KV heads, vocabulary 151 936: 0.49 B
parameters), the GPU case; ``--shape tiny`` a 2-layer model for a quick check.

Run from the repository root (needs the ``llm`` extra: ``pip install -e ".[llm]"``)::

    python benchmarks/foundation_memory.py --shape 135m
    python benchmarks/foundation_memory.py --shape qwen2.5-0.5b --device cuda     # on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SHAPES: dict[str, dict[str, int]] = {
    "135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
    ),
    # Qwen2.5-0.5B's shape (tied embeddings): FlowerTune's LLM leaderboard's base model; 0.49 B parameters.
    "qwen2.5-0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    ),
}
SEQUENCE, BATCH, STEPS_PER_CLIENT, CLIENTS = 64, 2, 4, 2


def lora_llama(shape: dict[str, int], sequence: int, rank: int, optimizer: Callable[[list[Any]], Any]) -> Any:
    """A user's LightningModule: a ``transformers`` ``LlamaForCausalLM`` of ``shape`` at random init (seed 0) with
    PEFT LoRA of ``rank`` (α = 2 × rank) on ``q_proj``/``v_proj``, trained on HF-shaped dict batches with
    ``optimizer(trainable parameters)``."""
    import torch
    from lightning.pytorch import LightningModule
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    class LoRALlama(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            config = LlamaConfig(**shape, max_position_embeddings=sequence, tie_word_embeddings=True)
            lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
            self.model = get_peft_model(LlamaForCausalLM(config), lora)

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
            loss = self.model(**batch).loss
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return optimizer([p for p in self.parameters() if p.requires_grad])

    return LoRALlama()


def token_dataset(vocab_size: int, sequence: int, count: int) -> Any:
    """``count`` random token sequences as HF dict items (``input_ids``, ``attention_mask``, ``labels``), the same
    for an index every time."""
    import torch

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return count

        def __getitem__(self, index: int) -> dict[str, Any]:
            ids = torch.randint(0, vocab_size, (sequence,), generator=torch.Generator().manual_seed(index))
            return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}

    return Tokens()


def _module(shape: str) -> Any:
    import torch

    return lora_llama(SHAPES[shape], SEQUENCE, 8, lambda params: torch.optim.AdamW(params, lr=1e-3))


def _tokens(shape: str, count: int) -> Any:
    return token_dataset(SHAPES[shape]["vocab_size"], SEQUENCE, count)


def _child(way: str, shape: str, device: str) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    module = _module(shape)
    total = sum(p.numel() for p in module.parameters())
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    started = time.perf_counter()
    if way == "plain":
        loader = torch.utils.data.DataLoader(_tokens(shape, BATCH * STEPS_PER_CLIENT * CLIENTS), batch_size=BATCH)
        module.to(device)
        optimizer = module.configure_optimizers()
        module.train()
        for batch_idx, batch in enumerate(loader):
            batch = {key: value.to(device) for key, value in batch.items()}
            loss = module.model(**batch).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            del loss, batch_idx
    else:
        from lightning_fed import FederatedTrainer
        from lightning_fed.datamodules import DatasetFederated, IidPartitioner

        data = DatasetFederated(
            _tokens(shape, BATCH * STEPS_PER_CLIENT * CLIENTS * 2),
            None,
            None,
            IidPartitioner(CLIENTS),
            batch_size=BATCH,
            client_test_fraction=0.0,
            client_test_size=1,
        )
        trainer = FederatedTrainer(
            num_rounds=1,
            clients_per_round=CLIENTS,
            local_steps=STEPS_PER_CLIENT,
            client_eval="none",
            eval_every_n_rounds=0,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            accelerator="gpu" if device == "cuda" else "cpu",
            devices=1,
            default_root_dir=str(Path.cwd() / "fed-run"),
        )
        trainer.fit(module, datamodule=data)
    on_gpu = device == "cuda"
    return {
        "way": way,
        "peak_mib": torch.cuda.max_memory_allocated() / 2**20
        if on_gpu
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "parameters": total,
        "trainable": trainable,
        "seconds": time.perf_counter() - started,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="135m")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: the GPU's peak memory")
    parser.add_argument("--child", choices=["plain", "lightning_fed"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.shape, args.device)))
        return
    env = dict(os.environ, PYTHONPATH=str(ROOT), WANDB_MODE="offline")
    results = {}
    for way in ("plain", "lightning_fed"):
        with tempfile.TemporaryDirectory() as workdir:  # the run directory of the federated way
            out = subprocess.run(
                [sys.executable, __file__, "--shape", args.shape, "--device", args.device, "--child", way],
                check=True,
                capture_output=True,
                text=True,
                env=env,
                cwd=workdir,
            )
        results[way] = json.loads(out.stdout.strip().splitlines()[-1])
    plain, fed = results["plain"], results["lightning_fed"]
    print(f"{time.strftime('%Y-%m-%d')}, shape {args.shape}: {plain['parameters'] / 1e6:.1f} M parameters,")
    print(f"  {plain['trainable'] / 1e3:.0f} k trainable; one round of {CLIENTS} clients x {STEPS_PER_CLIENT} steps")
    peak = "peak GPU memory" if args.device == "cuda" else "peak RSS"
    print(f"  plain loop     {peak} {plain['peak_mib']:8.0f} MiB")
    print(f"  lightning_fed  {peak} {fed['peak_mib']:8.0f} MiB   {fed['peak_mib'] / plain['peak_mib']:.2f}x")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
