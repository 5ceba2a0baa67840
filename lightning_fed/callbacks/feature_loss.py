"""Loss terms on the activations of a named layer, captured with a forward hook (e.g. rFedAvg's feature MMD)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from lightning.pytorch import LightningModule
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle
from typing_extensions import override

from lightning_fed.checks import check_instance
from lightning_fed.context import ClientContext, ClientUpdate, RoundContext
from lightning_fed.functional.state_dict import StateDict
from lightning_fed.hooks import FedCallback

if TYPE_CHECKING:
    from lightning_fed.hooks import FederatedTrainerView


@runtime_checkable
class FeatureMixin(Protocol):
    """A module that exposes its features itself, the alternative to hooking a named layer."""

    def features(self, x: Tensor) -> Tensor:
        """The representation the loss term is computed on (e.g. the penultimate activations)."""
        ...


class FeatureLossTerm(FedCallback, ABC):
    """Base for terms added to the local loss that need the activations of one layer of the user's module.

    While a client trains, a forward hook on ``pl_module.get_submodule(feature_layer)`` keeps the layer's latest
    output, so the module stays unmodified. After ``training_step``, :meth:`client_loss` hands that output to
    :meth:`loss_term`, whose value is added to the loss before backward (so its gradient flows through the layer)
    and logged as ``"<log_name>"`` (the round mean appears as ``train/<log_name>``). If the layer runs more than
    once in a step, the last call wins.

    The hook exists only while a client trains: it is removed in ``on_client_end`` and, because that hook is
    skipped for rejected clients and when training raises, also at the next ``on_client_start``, in
    ``on_aggregate``, ``on_exception`` and ``teardown``. It captures only with autograd on and the layer in train
    mode, so evaluation never overwrites the features.

    The class is abstract: a subclass must implement :meth:`loss_term` (instantiating one that does not raises
    ``TypeError`` naming it).

    With ``feature_layer=None`` the module must implement :class:`FeatureMixin`; the features are then
    ``pl_module.features(batch[0])``, which costs an extra forward pass per step. Subclasses that override a hook
    call ``super()`` so the hook is still registered and removed.

    Args:
        feature_layer: Dotted name of the layer to hook, as in ``named_modules()`` (e.g. ``"fc1"``, ``"net.2"``), or a
            unique suffix of one (``"features_act"`` finds ``backbone.features_act``), or ``None`` to use the
            module's ``features(x)``.
        log_name: Key the term's value is logged under.
    """

    def __init__(self, feature_layer: str | None, log_name: str) -> None:
        self.feature_layer = check_instance("feature_layer", feature_layer, (str, type(None)), "a layer name or None")
        self.log_name = check_instance("log_name", log_name, str, "a string")
        self._handle: RemovableHandle | None = None
        self._features: Tensor | None = None

    @abstractmethod
    def loss_term(self, features: Tensor, client_ctx: ClientContext, batch: Any) -> Tensor:
        """The scalar added to the loss, differentiable in ``features`` (the hooked layer's output)."""

    def _capture(self, layer: nn.Module, inputs: Any, output: Tensor) -> None:
        if layer.training and torch.is_grad_enabled():
            self._features = output

    def _release(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        # Dropping the tensor also frees the autograd graph it holds.
        self._features = None

    def _layer(self, pl_module: LightningModule) -> nn.Module:
        assert self.feature_layer is not None
        names = [name for name, _ in pl_module.named_modules() if name]
        if self.feature_layer not in names:
            # Lets a backbone's layer name ("features_act") find it inside a wrapper (ClassifierModule's `backbone.`).
            matches = [name for name in names if name.endswith("." + self.feature_layer)]
            if len(matches) == 1:
                return pl_module.get_submodule(matches[0])
        try:
            return pl_module.get_submodule(self.feature_layer)
        except AttributeError:
            shown = ", ".join(repr(n) for n in names[:12]) + (", ..." if len(names) > 12 else "")
            raise ValueError(
                f"`feature_layer={self.feature_layer!r}` is not a submodule of {type(pl_module).__name__}."
                f" Available names (from `named_modules()`): {shown or 'none'}."
            ) from None

    @override
    def on_client_start(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext
    ) -> None:
        self._release()
        if self.feature_layer is None:
            if not isinstance(pl_module, FeatureMixin):
                raise TypeError(
                    f"{type(self).__name__} has `feature_layer=None`, so {type(pl_module).__name__} must define"
                    " `features(x)` (see `FeatureMixin`); otherwise name the layer to hook."
                )
            return
        self._handle = self._layer(pl_module).register_forward_hook(self._capture)

    @override
    def client_loss(
        self,
        trainer: FederatedTrainerView,
        pl_module: LightningModule,
        client_ctx: ClientContext,
        batch: Any,
        batch_idx: int,
    ) -> Tensor | None:
        if self.feature_layer is None:
            features: Tensor | None = pl_module.features(batch[0])  # type: ignore[operator]
        else:
            # Consume the capture so a step whose forward skipped the layer never reuses the previous step's one.
            features, self._features = self._features, None
        if features is None:
            return None
        term = self.loss_term(features, client_ctx, batch)
        pl_module.log(self.log_name, term.detach())
        return term

    @override
    def on_client_end(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, client_ctx: ClientContext, update: ClientUpdate
    ) -> None:
        self._release()

    @override
    def on_aggregate(
        self, trainer: FederatedTrainerView, pl_module: LightningModule, round_ctx: RoundContext, new_params: StateDict
    ) -> None:
        self._release()

    @override
    def on_exception(self, trainer: Any, pl_module: LightningModule, exception: BaseException) -> None:
        self._release()

    @override
    def teardown(self, trainer: Any, pl_module: LightningModule, stage: str) -> None:
        self._release()
