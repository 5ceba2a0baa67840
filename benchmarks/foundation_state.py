"""What federated state costs for a LoRA-adapted model: checkpoint size against the number of clients (FedAMP, APFL),
and the bytes a loopback deployment sends down and up per round (FedAvg).

The model is a LLaMA-shaped ``transformers`` model at random init (4.4 M parameters: vocabulary 28 000, hidden 128,
4 layers) with PEFT LoRA r 16 on ``q_proj`` and ``v_proj`` (33 k trainable parameters), inside the user's own
LightningModule (``benchmarks/foundation_memory.py``'s), on random token sequences. Federated state is what the
clients change (issue 38): the adapters; the frozen base is held once, in the module.

* Checkpoints: ``FederatedTrainer`` with FedAMP (every client's personalised model in the client store) and with APFL
  (every client's personal model v_i, its last local model w_i, which ``evaluate_with="local"`` mixes in, and its
  mixing weight), 2 rounds with every client training, the run's ``last.ckpt`` size against the bound "model + N × k
  × adapters + 10 %", k the adapter-sized entries each client keeps (FedAMP 1, APFL 2).
* Wire: ``serve`` over ``LoopbackTransport`` (server and sites in one process, every message through the wire
  encoding), 2 clients per round, 2 rounds; the encoded tasks' and replies' bytes per round, per client, against the
  adapters' bytes (goal: at most 1.1 × adapters × clients each way).

Run from the repository root (needs the ``llm`` extra)::

    python benchmarks/foundation_state.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.foundation_memory import lora_llama, token_dataset

SHAPE = dict(
    hidden_size=128,
    intermediate_size=344,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=4,
    vocab_size=28000,
)
SEQUENCE, BATCH, LOCAL_STEPS = 32, 2, 2


def _module() -> Any:
    return lora_llama(SHAPE, SEQUENCE, 16, lambda params: torch.optim.SGD(params, lr=0.01))


def _data(num_clients: int) -> Any:
    from lightning_fed.datamodules import DatasetFederated, IidPartitioner

    tokens = token_dataset(SHAPE["vocab_size"], SEQUENCE, num_clients * (BATCH * LOCAL_STEPS + 1))
    return DatasetFederated(
        tokens, None, None, IidPartitioner(num_clients), batch_size=BATCH, client_test_fraction=0.0, client_test_size=1
    )


def _settings(**extra: Any) -> dict[str, Any]:
    return dict(
        local_steps=LOCAL_STEPS,
        client_eval="none",
        eval_every_n_rounds=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        accelerator="cpu",
        devices=1,
        seed=0,
        **extra,
    )


def _sizes(module: Any) -> tuple[int, int]:
    """The model's bytes (each storage once: tied weights are one tensor) and its trainable adapters' bytes."""
    storages: dict[int, int] = {}
    for tensor in module.state_dict().values():
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    adapters = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    return sum(storages.values()), adapters


def checkpoint_sizes(workdir: Path) -> list[dict[str, Any]]:
    from lightning_fed import FederatedTrainer
    from lightning_fed.callbacks import APFL, FedAMP

    rows = []
    # Each algorithm with the adapter-sized entries it keeps per client: FedAMP's w_i; APFL's v_i and local w_i.
    for name, make, copies in (("FedAMP", lambda: FedAMP(), 1), ("APFL", lambda: APFL(alpha=0.25), 2)):
        for clients in (2, 4, 8, 16):
            module = _module()
            model, adapters = _sizes(module)
            root = workdir / f"{name}-{clients}"
            trainer = FederatedTrainer(
                num_rounds=2, clients_per_round=clients, callbacks=[make()], default_root_dir=str(root), **_settings()
            )
            trainer.fit(module, datamodule=_data(clients))
            size = max(p.stat().st_size for p in root.rglob("last.ckpt"))
            bound = (model + clients * copies * adapters) * 1.1
            rows.append(dict(algorithm=name, clients=clients, checkpoint=size, bound=bound, model=model))
    return rows


def wire_bytes(workdir: Path) -> dict[str, Any]:
    from lightning_fed import FederatedTrainer
    from lightning_fed.deploy import ClientSite, LoopbackTransport, SiteTrainer, serve

    clients, rounds = 2, 2

    def build() -> tuple[Any, Any, SiteTrainer]:
        trainer = SiteTrainer(
            default_root_dir=str(workdir / "site"), num_rounds=rounds, clients_per_round=clients, **_settings()
        )
        return _module(), _data(clients), trainer

    sites = {cid: ClientSite(build, workdir / "site-state") for cid in range(clients)}
    transport = LoopbackTransport(sites)
    module = _module()
    model, adapters = _sizes(module)
    server = FederatedTrainer(
        num_rounds=rounds, clients_per_round=clients, default_root_dir=str(workdir / "server"), **_settings()
    )
    serve(server, module, _data(clients), transport)
    for site in sites.values():
        site.close()
    per_round = clients * adapters
    return dict(
        model=model,
        adapters=adapters,
        rounds=rounds,
        clients=clients,
        down_per_round=transport.bytes_sent / rounds,
        up_per_round=transport.bytes_received / rounds,
        down_ratio=transport.bytes_sent / rounds / per_round,
        up_ratio=transport.bytes_received / rounds / per_round,
    )


def main() -> None:
    torch.set_num_threads(1)
    os.environ.setdefault("WANDB_MODE", "offline")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        rows = checkpoint_sizes(workdir)
        wire = wire_bytes(workdir)
    mib = 1 << 20
    day, model, adapters = time.strftime("%Y-%m-%d"), rows[0]["model"] / mib, wire["adapters"] / 1024
    print(f"{day}: model {model:.1f} MiB, adapters {adapters:.0f} KiB")
    print("checkpoint (last.ckpt) against model + N x k x adapters + 10 % (k: FedAMP 1, APFL 2):")
    for row in rows:
        print(
            f"  {row['algorithm']:6s} {row['clients']:3d} clients  {row['checkpoint'] / mib:7.2f} MiB"
            f"  (bound {row['bound'] / mib:7.2f} MiB)"
        )
    print(
        f"loopback deployment, {wire['clients']} clients per round: down {wire['down_per_round'] / 1024:.0f} KiB"
        f" ({wire['down_ratio']:.2f} x adapters x clients), up {wire['up_per_round'] / 1024:.0f} KiB"
        f" ({wire['up_ratio']:.2f} x)"
    )
    print(json.dumps({"checkpoints": rows, "wire": wire}))


if __name__ == "__main__":
    main()
