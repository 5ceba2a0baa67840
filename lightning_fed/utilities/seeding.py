"""Seeds derived from a run seed and a purpose, so that every random draw is reproducible on its own.

Deriving one seed per (purpose, round, client) instead of consuming a shared generator makes a client's data order
and dropout masks independent of which other clients ran before it, of the process that trains it, and of whether
the run was resumed from a checkpoint.
"""

from __future__ import annotations

import hashlib

import torch


def derive_seed(seed: int, *keys: int | str) -> int:
    """Returns a 63-bit seed that depends only on ``seed`` and ``keys``.

    Args:
        seed: The run seed.
        keys: What the seed is for, e.g. ``("data", round_idx, client_id)``.

    Example:
        >>> derive_seed(0, "data", 3, 7) == derive_seed(0, "data", 3, 7)
        True
    """
    text = "/".join(str(part) for part in (seed, *keys)).encode()
    digest = hashlib.blake2b(text, digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def seed_torch(seed: int) -> None:
    """Seeds torch's CPU generator, and CUDA's when it is in use, for one client's training.

    ``torch.manual_seed`` also queues seeding for every lazily initialised accelerator backend, recording a stack
    trace each time; per client that cost up to a quarter of a small round.
    """
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.manual_seed(seed)
