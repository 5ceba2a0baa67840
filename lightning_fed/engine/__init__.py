"""How a round runs: the engine's public face.

Other wings (the trainer and the run's bookkeeping, the algorithms, the deployment, the CLI) import the engine from
here and nowhere else; ``pyproject.toml``'s import-linter contract "engine-face" keeps it so. Everything else in this
package is internal and may move.

* The round and its two halves, meeting through :mod:`lightning_fed.messages`: :class:`RoundRunner`,
  :class:`ServerHalf` (open, :meth:`~ServerHalf.task`, :meth:`~ServerHalf.fold`, close), :class:`ClientHalf`
  (:meth:`~ClientHalf.run_task`), :class:`ClientSide` (where a round's clients train) and :class:`LocalClients`.
* The loops Lightning runs: :func:`install_round_loop` (one round per epoch), :func:`install_site_loop` (a site's
  client half answering tasks), and what each needs of its trainer (:class:`RoundHost`, :class:`SiteHost`).
* What crosses the seam: :func:`algorithm_objects` and their :func:`broadcast` / :func:`load_broadcast` /
  :func:`round_state`; the LR schedulers' :func:`scheduler_snapshot` / :func:`restore_schedulers`.
* Pieces the algorithms build on: :class:`LocalTrainer` (plain local training), the step helpers
  (:func:`call_step`, :func:`loss_of`, :func:`training_loss`, :func:`isolated_pass`, :func:`step_gradient`), the
  buffered ``self.log`` (:class:`LogBuffer`, :func:`buffered_logging`, :func:`batch_size_of`).
* Counting and reporting: :class:`StepCounter` and the run's step counts, :class:`UniformClientSampler`,
  rejection (:class:`ClientDivergedError`, :func:`reject_client`, :func:`warn_if_many_rejected`), evaluation's
  :func:`add_validation_and_bmta`, :func:`accuracy_key` and :func:`headline`.
"""

from lightning_fed.engine.algorithm_state import algorithm_objects, broadcast, load_broadcast, round_state
from lightning_fed.engine.client_half import Boundary, ClientHalf
from lightning_fed.engine.dispatch import HookDispatcher
from lightning_fed.engine.evaluation import accuracy_key, add_validation_and_bmta
from lightning_fed.engine.evaluator import headline
from lightning_fed.engine.local_training import LocalTrainer
from lightning_fed.engine.log_buffer import LogBuffer, batch_size_of, buffered_logging
from lightning_fed.engine.loop import RoundHost, SiteHost, install_round_loop, install_site_loop
from lightning_fed.engine.rejection import ClientDivergedError, reject_client, warn_if_many_rejected
from lightning_fed.engine.round import ClientSide, ClientSideFactory, LocalClients, RoundRunner
from lightning_fed.engine.sampling import UniformClientSampler
from lightning_fed.engine.schedulers import restore_schedulers, scheduler_snapshot
from lightning_fed.engine.server_half import ServerHalf
from lightning_fed.engine.step_counter import StepCounter, client_step_counts, run_steps
from lightning_fed.engine.training_step import call_step, isolated_pass, loss_of, step_gradient, training_loss

__all__ = [
    "Boundary",
    "ClientDivergedError",
    "ClientHalf",
    "ClientSide",
    "ClientSideFactory",
    "HookDispatcher",
    "LocalClients",
    "LocalTrainer",
    "LogBuffer",
    "RoundHost",
    "RoundRunner",
    "ServerHalf",
    "SiteHost",
    "StepCounter",
    "UniformClientSampler",
    "accuracy_key",
    "add_validation_and_bmta",
    "algorithm_objects",
    "batch_size_of",
    "broadcast",
    "buffered_logging",
    "call_step",
    "client_step_counts",
    "headline",
    "install_round_loop",
    "install_site_loop",
    "isolated_pass",
    "load_broadcast",
    "loss_of",
    "reject_client",
    "restore_schedulers",
    "round_state",
    "run_steps",
    "scheduler_snapshot",
    "step_gradient",
    "training_loss",
    "warn_if_many_rejected",
]
