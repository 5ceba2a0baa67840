"""Many clients' LoRA adapters on one frozen base, side by side (``client_parallelism``), against one at a time.

The workload: a small LLaMA-shaped ``transformers`` model at random init (hidden 64, 2 layers, 4 heads, vocabulary
128, eager attention so that ``torch.func.vmap`` can batch it) with PEFT LoRA r 8 on ``q_proj``/``v_proj``
(:class:`~lightning_fed.models.HFLoRAModule`, sequence classification), on
:class:`~lightning_fed.datamodules.TokenPatternsFederated` split IID over ``--clients`` clients (16 and 64 by default)
of 32 sequences of 16 tokens each; every client (or ``--clients-per-round`` of them) trains every round for one
local epoch at batch 8 with SGD, FedAvg aggregates. A batched group stacks the clients' adapters only and shares
one unstacked copy of the frozen base (memory: base + G × adapters).

How time is measured: as ``benchmarks/batched.py`` does, ``on_round_start`` to ``on_round_end`` of rounds 2..R
(``--rounds``, default 3), medians; the ways run interleaved per repeat (sequential, then batched ``auto``) with a
fresh module each, for ``--repeats`` repeats; the ratio is the median of per-repeat ratios sequential / batched
(> 1: batched is faster). The final adapters of both ways are compared (float rounding only). Every fit records the
load around it (``benchmarks/load.py``).

Run from the repository root (needs the ``llm`` extra)::

    python benchmarks/batched_adapters.py                   # 16 and 64 clients, CPU, one torch thread
    python benchmarks/batched_adapters.py --device cuda     # on a GPU
    # FlowerTune's shape on a GPU: Qwen2.5-0.5B's shape, LoRA r 32, 10 clients, 2 a round
    python benchmarks/batched_adapters.py --device cuda --shape qwen2.5-0.5b --lora-r 32 --clients 10 \
        --clients-per-round 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.batched import RoundClock
from benchmarks.load import LoadRecorder, add_wait_quiet_argument, footnote, mark
from lightning_fed import FederatedTrainer
from lightning_fed.datamodules import IidPartitioner, TokenPatternsFederated
from lightning_fed.models import HFLoRAModule

PER_CLIENT, BATCH = 32, 8


#: The models' shapes (eager attention, so that ``torch.func.vmap`` can batch them): ``small`` for the CPU;
#: ``qwen2.5-0.5b`` Qwen2.5-0.5B's shape (0.49 B parameters, tied embeddings), FlowerTune's LLM leaderboard's base
#: model, for a GPU. The token patterns use the first 128 ids of either vocabulary.
SHAPES: dict[str, dict[str, Any]] = {
    "small": dict(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    ),
    "qwen2.5-0.5b": dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, tie_word_embeddings=True,
    ),
}  # fmt: skip


def _module(seed: int, shape: str = "small", lora_r: int = 8) -> HFLoRAModule:
    torch.manual_seed(seed)
    config = dict(SHAPES[shape], pad_token_id=0, attn_implementation="eager")
    return HFLoRAModule(
        task="sequence_classification", config=config, num_labels=4, lora_r=lora_r, optimizer="sgd", lr=0.05
    )


def _run(args: argparse.Namespace, clients: int, parallelism: int | str, root: str) -> tuple[float, Any, Any]:
    clock = RoundClock()
    module = _module(args.seed, args.shape, args.lora_r)
    data = TokenPatternsFederated(
        IidPartitioner(clients),
        num_samples=clients * PER_CLIENT,
        num_test_samples=64,
        vocab_size=128,
        batch_size=BATCH,
        client_test_fraction=0.0,
        client_test_size=1,
        seed=args.seed,
    )
    trainer = FederatedTrainer(
        num_rounds=args.rounds,
        clients_per_round=min(args.clients_per_round or clients, clients),
        local_epochs=1,
        client_parallelism=parallelism,
        eval_every_n_rounds=0,
        client_eval="none",
        seed=args.seed,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        accelerator=args.device,
        devices=1,
        default_root_dir=root,
        callbacks=[clock],
    )
    with LoadRecorder(1, args.wait_quiet) as load:
        trainer.fit(module, datamodule=data)
    wall = statistics.median(w for w, _ in clock.rounds[1:])
    adapters = {n: p.detach().float().cpu() for n, p in module.named_parameters() if p.requires_grad}
    size = trainer.fed_runner.batched.size if trainer.fed_runner is not None else None
    return wall, (adapters, size), load.record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--clients-per-round", type=int, default=None, help="default: every client every round")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the CPU (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    add_wait_quiet_argument(parser)
    args = parser.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(args.threads)
    records = []
    per_round = f"{args.clients_per_round} clients a round" if args.clients_per_round else "every client every round"
    print(
        f"{time.strftime('%Y-%m-%d')}, {args.device}, shape {args.shape}: LoRA r {args.lora_r} adapters on one base,"
        f" {PER_CLIENT} sequences a client, {per_round}"
    )
    print("| clients | sequential (s/round) | batched (s/round) | group | speed-up | max rel. diff. of adapters |")
    print("|---:|---:|---:|---:|---:|---:|")
    for clients in args.clients:
        sequential, batched, ratios, difference, group, these = [], [], [], 0.0, None, []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as root:
                one, (seq_adapters, _), load_a = _run(args, clients, 1, root)
                side, (bat_adapters, group), load_b = _run(args, clients, "auto", root)
            these += [load_a, load_b]
            sequential.append(one)
            batched.append(side)
            ratios.append(one / side)
            difference = max(
                difference,
                max(
                    float((bat_adapters[k] - v).abs().max() / v.abs().max().clamp_min(1e-12))
                    for k, v in seq_adapters.items()
                ),
            )
        one, side = statistics.median(sequential), statistics.median(batched)
        print(
            f"| {clients} | {one:.3f} | {side:.3f} | {min(group or 1, args.clients_per_round or clients, clients)} |"
            f" **{statistics.median(ratios):.2f}×**{mark(these)} | {difference:.1e} |"
        )
        records += these
    print(footnote(records))


if __name__ == "__main__":
    main()
