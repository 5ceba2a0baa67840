"""Collectives for running a round's clients on several processes, and the identity in one process.

Under a multi-process Lightning strategy (``strategy="ddp"``, any ``devices``/``num_nodes``, torchrun or SLURM),
every rank runs the same round: it samples the same clients, trains its share of them, and then these collectives
combine what the shares produced, so that every rank ends the round with the same global model, the same client
store and the same metrics. They act on torch.distributed's default process group, the one Lightning's strategy
initialises, exactly when that group exists and spans more than one process (the convention of Lightning's and
torchmetrics' own reductions); otherwise every function here is the identity and costs nothing.

Everything that takes part in a collective must be called by every rank, in the same order, with tensors of the
same shapes. The functions take whole lists so that each call is one collective.

Algorithms do not call these collectives themselves: an aggregator or a callback declares what it accumulates over
clients and how it combines (:class:`lightning_fed.parallel.reduction.CrossProcessState`), and
:func:`lightning_fed.parallel.reduction.reduce_across_ranks` calls them.
"""

from __future__ import annotations

import atexit
import heapq
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn


def is_distributed() -> bool:
    """Whether a process group with more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    """Number of processes sharing the round (1 without a process group)."""
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    """This process's global rank (0 without a process group)."""
    return dist.get_rank() if is_distributed() else 0


def _collective_device() -> torch.device:
    # NCCL reduces only CUDA tensors; gloo reduces CPU tensors.
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum_(tensors: Sequence[Tensor]) -> None:
    """Replaces each tensor with its sum over ranks, in place, with one collective.

    The tensors (on any devices) are packed into one float64 buffer on the backend's device, so float32 entries
    are summed in float64 and integer entries exactly (below 2**53). Every rank must pass tensors of the same
    shapes in the same order.
    """
    if not is_distributed() or not tensors:
        return
    device = _collective_device()
    buffer = torch.cat([t.detach().reshape(-1).to(device=device, dtype=torch.float64) for t in tensors])
    dist.all_reduce(buffer, op=dist.ReduceOp.SUM)
    offset = 0
    for tensor in tensors:
        size = tensor.numel()
        with torch.no_grad():
            tensor.copy_(buffer[offset : offset + size].view_as(tensor))
        offset += size


def all_gather_object(obj: Any) -> list[Any]:
    """``obj`` from every rank, in rank order (``[obj]`` in one process). Tensors inside should be on the CPU."""
    if not is_distributed():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def all_gather_rows(tensors: Sequence[Tensor]) -> list[Tensor]:
    """Each tensor's rows from every rank, concatenated in rank order (the tensors themselves in one process).

    The tensors of one rank share their first dimension (its row count, which may differ between ranks, zero
    included); every rank passes the same number of tensors, each with the same trailing shape and dtype as its
    counterparts. One small all-gather exchanges the row counts, then one all-gather per tensor moves the rows,
    padded to the largest count (gloo and NCCL gather equal shapes). The results come back on the devices of the
    inputs. With ``n`` rows over all ranks the gather briefly holds about twice ``n`` rows.
    """
    if not is_distributed():
        return list(tensors)
    device = _collective_device()
    size = dist.get_world_size()
    own = torch.tensor([tensors[0].shape[0] if tensors else 0], dtype=torch.int64, device=device)
    counts_parts = [torch.zeros_like(own) for _ in range(size)]
    dist.all_gather(counts_parts, own)
    counts = [int(part.item()) for part in counts_parts]
    most = max(counts)
    gathered: list[Tensor] = []
    for tensor in tensors:
        padded = torch.zeros((most, *tensor.shape[1:]), dtype=tensor.dtype, device=device)
        padded[: tensor.shape[0]] = tensor
        parts = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(parts, padded)
        del padded
        gathered.append(torch.cat([part[:count] for part, count in zip(parts, counts)]).to(tensor.device))
    return gathered


def latest(position: int, value: Any) -> Any:
    """The ``value`` of the rank with the highest ``position`` (``-1``: this rank has none).

    Entries that are copied rather than averaged (integer buffers) come from the round's last accepted client in one
    process; ``position`` is that client's index in the round, so the same client wins whatever the sharding.
    """
    candidates = all_gather_object((position, value))
    return max(candidates, key=lambda item: item[0])[1]


def shard_clients(client_ids: Sequence[int], num_samples: dict[int, int], num_shards: int) -> list[list[int]]:
    """Splits a round's clients among ``num_shards`` ranks, balancing the training samples.

    Greedy longest-processing-time: clients in decreasing size go to the least loaded rank (ties: fewer clients,
    then lower rank). It depends only on its arguments, so every rank computes the same split, and each shard keeps
    the round's client order. Each rank gets at least one client when there are at least ``num_shards`` of them.
    """
    if num_shards == 1:
        return [list(client_ids)]
    heap = [(0, 0, shard) for shard in range(num_shards)]
    owner: dict[int, int] = {}
    for client_id in sorted(client_ids, key=lambda cid: (-num_samples.get(cid, 0), cid)):
        load, count, shard = heapq.heappop(heap)
        owner[client_id] = shard
        heapq.heappush(heap, (load + num_samples.get(client_id, 0), count + 1, shard))
    return [[cid for cid in client_ids if owner[cid] == shard] for shard in range(num_shards)]


def check_world_size(num_ranks: int, clients_per_round: int) -> None:
    """Every rank must train at least one client each round.

    Raises:
        ValueError: If there are more ranks than clients per round.
    """
    if num_ranks > clients_per_round:
        raise ValueError(
            f"The run has {num_ranks} processes (`devices` x `num_nodes`) but only {clients_per_round} clients train"
            f" per round, and every process must train at least one: raise `clients_per_round` to >= {num_ranks}"
            " or lower `devices`/`num_nodes`."
        )


_exit_hook_registered = False


def destroy_process_group_at_exit() -> None:
    """Destroys the default process group when the interpreter exits, before it finalises (registered once).

    Lightning destroys it at exit for NCCL only. A gloo group left alive can abort a finished run: a gloo worker
    thread that drops its last collective's tensors after the interpreter started finalising must take the GIL to
    release their Python objects, Python ends that thread with ``pthread_exit``, and the unwinding through a C++
    destructor calls ``std::terminate`` ("terminate called without an active exception", SIGABRT, exit code 134).
    ``atexit`` runs while the interpreter is still whole: destroying the group there joins gloo's worker threads
    with their work released. Without a process group at exit the handler does nothing.
    """
    global _exit_hook_registered
    if not _exit_hook_registered:
        atexit.register(_destroy_default_group)
        _exit_hook_registered = True


def _destroy_default_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _not_distributed() -> bool:
    return False


@contextmanager
def rank_local_metrics(module: nn.Module) -> Iterator[None]:
    """Makes the module's torchmetrics metrics compute from this rank's state only.

    A torchmetrics metric gathers its state from every rank when it computes. In a federated round each rank
    evaluates different clients, so such a gather would mix clients (or hang when ranks evaluate different numbers
    of clients). Inside this block ``compute`` uses this rank's state alone; Lightning's own validation loop, outside
    it, keeps the usual cross-rank reduction.
    """
    if not is_distributed():
        yield
        return
    from torchmetrics import Metric

    metrics = [m for m in module.modules() if isinstance(m, Metric)]
    previous = [m.distributed_available_fn for m in metrics]
    for metric in metrics:
        metric.distributed_available_fn = _not_distributed
    try:
        yield
    finally:
        for metric, available in zip(metrics, previous):
            metric.distributed_available_fn = available


__all__ = [
    "all_gather_object",
    "all_gather_rows",
    "all_reduce_sum_",
    "check_world_size",
    "destroy_process_group_at_exit",
    "is_distributed",
    "latest",
    "rank",
    "rank_local_metrics",
    "shard_clients",
    "world_size",
]
