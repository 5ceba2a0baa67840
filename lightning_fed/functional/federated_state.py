"""The federated part of a module: the state its clients change, and the frozen base that never changes.

Federated state is what local training changes. By default that is every parameter with ``requires_grad`` and every
(persistent) buffer, such as BatchNorm's running statistics and ``num_batches_tracked``; for a model whose
parameters all train this is the whole ``state_dict``, so nothing changes for small models. A foundation model
fine-tuned with adapters (LoRA: :math:`W = W_0 + \\tfrac{\\alpha}{r} B A`, Hu et al., 2021, arXiv 2106.09685) trains
:math:`A` and :math:`B` only: its federated part is the adapters, and :math:`W_0` is the frozen base, held once, in
the module. Every sum, store, checkpoint's client state and message covers the federated part only.

Who decides, first match wins:

1. the trainer's ``federated_keys`` (glob patterns on ``state_dict`` keys, e.g. ``["*lora_*", "*.norm.*"]``);
2. the module's ``federated_state_dict()`` method (its keys are the federated part);
3. the module's ``federated_keys`` attribute (glob patterns, as the trainer's);
4. the default above.

Whatever decides, every trainable parameter must be federated: a parameter that trains but is not federated would
carry one client's training into the next client's start point.

The frozen base is fingerprinted by the bytes of its tensors (:func:`base_fingerprint`): a resumed run or a
deployed site whose base differs is refused, naming the first tensor that differs (:func:`first_base_difference`).
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from lightning_fed.functional.state_dict import StateDict

#: The trainer setting that overrides a module's own declaration (named in refusals).
SETTING = "FederatedTrainer(federated_keys=...)"


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _declared(module: nn.Module, patterns: Sequence[str] | None) -> tuple[set[str] | None, str]:
    """The keys a declaration names (``None``: no declaration) and who declared them, for messages."""
    keys = list(module.state_dict(keep_vars=True))
    declaration: object = patterns
    if patterns is not None:
        who = SETTING
    elif callable(getattr(module, "federated_state_dict", None)):
        declared = module.federated_state_dict()  # type: ignore[operator]
        unknown = [name for name in declared if name not in keys]
        if unknown:
            raise ValueError(
                f"{type(module).__name__}.federated_state_dict() returns {unknown[0]!r}, which is no key of the"
                " module's state_dict: return entries of `state_dict()` under their own names."
            )
        return set(declared), f"{type(module).__name__}.federated_state_dict()"
    elif getattr(module, "federated_keys", None) is not None:
        declaration, who = module.federated_keys, f"{type(module).__name__}.federated_keys"
    else:
        return None, "the default"
    if isinstance(declaration, str) or not isinstance(declaration, Iterable):
        raise ValueError(f"{who} must be a list of glob patterns, not {declaration!r}: write [{declaration!r}].")
    patterns = [str(pattern) for pattern in declaration]
    for pattern in patterns:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in keys):
            raise ValueError(
                f"{who}: the pattern {pattern!r} matches no key of the module's state_dict (e.g. {keys[:3]}); fix or"
                " remove it."
            )
    return {name for name in keys if _matches(name, patterns)}, who


def federated_keys(module: nn.Module, patterns: Sequence[str] | None = None) -> list[str]:
    """The ``state_dict`` keys of ``module``'s federated part, in ``state_dict`` order.

    Args:
        module: The model.
        patterns: The trainer's ``federated_keys`` (glob patterns on ``state_dict`` keys), which override the
            module's own declaration; ``None`` lets the module (or the default) decide.

    Raises:
        ValueError: A pattern matches nothing, a declaration leaves out a trainable parameter, or the federated part
            is empty; in one line that names who declared it.
    """
    live = module.state_dict(keep_vars=True)
    declared, who = _declared(module, patterns)
    trainable = [name for name, tensor in live.items() if isinstance(tensor, nn.Parameter) and tensor.requires_grad]
    if declared is None:
        keys = [
            name
            for name, tensor in live.items()
            if isinstance(tensor, Tensor) and (not isinstance(tensor, nn.Parameter) or tensor.requires_grad)
        ]
    else:
        left_out = [name for name in trainable if name not in declared]
        if left_out:
            raise ValueError(
                f"{who} leaves out the trainable parameter {left_out[0]!r} ({len(left_out)} in all): a parameter that"
                " trains must be federated, or each client would start from the last one's; include it, or freeze"
                " it with `requires_grad_(False)`."
            )
        keys = [name for name in live if name in declared and isinstance(live[name], Tensor)]
    if not keys:
        raise ValueError(
            f"{type(module).__name__} has no federated state ({who}): no parameter has requires_grad and no buffer is"
            " persistent; unfreeze what the clients should train."
        )
    return keys


def federated_state(module: nn.Module, patterns: Sequence[str] | None = None) -> StateDict:
    """The live tensors of ``module``'s federated part (``state_dict(keep_vars=True)`` entries): loading a state
    into them loads the module. See :func:`federated_keys` for ``patterns``."""
    live = module.state_dict(keep_vars=True)
    return {name: live[name] for name in federated_keys(module, patterns)}


def frozen_state(module: nn.Module, federated: Iterable[str]) -> StateDict:
    """The frozen base: every tensor of ``module``'s ``state_dict`` that is not in ``federated`` (detached)."""
    names = set(federated)
    return {
        name: tensor.detach()
        for name, tensor in module.state_dict(keep_vars=True).items()
        if name not in names and isinstance(tensor, Tensor)
    }


def tensor_digest(tensor: Tensor) -> str:
    """A short hash of a tensor's dtype, shape and bytes (``blake2b``, 8 bytes, hex)."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(f"{tensor.dtype};{tuple(tensor.shape)};".encode())
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return digest.hexdigest()


@dataclass(frozen=True)
class BaseFingerprint:
    """The frozen base's fingerprint: one digest of the whole base and a short hash per tensor, so that a party
    that holds only the fingerprint can name the first tensor of its own base that differs.

    Attributes:
        digest: A hash of every tensor's name and hash, in ``state_dict`` order.
        tensors: ``{name: hash}`` of each frozen tensor (dtype, shape and bytes), in ``state_dict`` order.
    """

    digest: str
    tensors: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """Plain values (``torch.load(weights_only=True)`` reads them back)."""
        return {"digest": self.digest, "tensors": dict(self.tensors)}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> BaseFingerprint:
        tensors = data.get("tensors", {})
        assert isinstance(tensors, Mapping)
        return cls(str(data["digest"]), {str(k): str(v) for k, v in tensors.items()})


def base_fingerprint(module: nn.Module, federated: Iterable[str]) -> BaseFingerprint:
    """The fingerprint of ``module``'s frozen base (everything but ``federated``); it reads every frozen byte once."""
    tensors = {name: tensor_digest(tensor) for name, tensor in frozen_state(module, federated).items()}
    digest = hashlib.blake2b(digest_size=16)
    for name, value in tensors.items():
        digest.update(f"{name}={value};".encode())
    return BaseFingerprint(digest.hexdigest(), tensors)


def first_base_difference(expected: BaseFingerprint, actual: BaseFingerprint) -> str | None:
    """Where ``actual``'s base first differs from ``expected``'s, in words (``None``: the same base)."""
    if expected.digest == actual.digest:
        return None
    for name, value in expected.tensors.items():
        if name not in actual.tensors:
            return f"{name!r} is missing"
        if actual.tensors[name] != value:
            return f"{name!r} differs"
    extra = next((name for name in actual.tensors if name not in expected.tensors), None)
    return f"{extra!r} is extra" if extra is not None else "the tensors' order differs"


__all__ = [
    "SETTING",
    "BaseFingerprint",
    "base_fingerprint",
    "federated_keys",
    "federated_state",
    "first_base_difference",
    "frozen_state",
    "tensor_digest",
]
