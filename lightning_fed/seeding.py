"""Seeds derived from a run seed and a purpose, so that every random draw is reproducible on its own.

Deriving one seed per (purpose, round, client) instead of consuming a shared generator makes a client's data order
and dropout masks independent of which other clients ran before it, of the process that trains it, and of whether
the run was resumed from a checkpoint.
"""

from __future__ import annotations

import hashlib


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
