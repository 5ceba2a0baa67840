"""Flower's SecAgg+ as a deployment's transport: the server sees the round's sums only as their total."""

from __future__ import annotations

import secrets

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.common import EvaluateIns, EvaluateRes, FitIns, FitRes, Parameters, Scalar, parameters_to_ndarrays
from flwr.server import ClientManager, LegacyContext, ServerConfig
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat.grid_client_proxy import GridClientProxy
from flwr.server.strategy import Strategy
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid

from lightning_fed.deploy.app import SECAGG_RUN_CONFIG
from lightning_fed.deploy.flower.grid_transport import GridTransport, SentTask
from lightning_fed.deploy.flower.settings import say
from lightning_fed.deploy.roster import NONCE_BYTES, Roster
from lightning_fed.deploy.transport import RoundReplies
from lightning_fed.messages import ClientReply, ClientTask


class SecureGridTransport(GridTransport):
    """A :class:`GridTransport` whose training rounds run under Flower's SecAgg+: the server sees the sites' sums
    only as their total.

    Each round runs Flower's ``SecAggPlusWorkflow`` once, driven from lightning_fed's own round loop (so sampling,
    seeding, checkpoints and resume stay lightning_fed's): four exchanges with the round's nodes (public keys, key
    shares, masked vectors, unmasking). The site answers the third with its reply, whose sums
    (:attr:`~lightning_fed.deploy.wire.ClientReply.secure_sums`) Flower's ``secaggplus_mod`` quantises and masks before
    they leave the site; the rest of the reply (metrics, rejection, step counts, integer buffers) travels in clear in
    the reply's metrics. Every client is given weight 1, so the workflow's weighted mean is the plain mean, which times
    the number of replies is the sum the server folds in. Evaluation tasks carry no sums and travel as in
    :class:`GridTransport`.

    A node that fails after sending its masked vector is recovered by SecAgg+ (its masks are rebuilt from the
    others' shares); one that fails before is dropped from the round. A round that SecAgg+ cannot complete (fewer
    live nodes than the reconstruction threshold) drops every client of the round.

    Args:
        grid: The ServerApp's grid.
        context: The ServerApp's context (the workflow keeps its round in the context's state).
        timeout: Seconds to wait for each of the round's exchanges (``None``: wait for every reply).
        roster: Which key may serve which client (:class:`GridTransport`); the clear part of each reply is signed
            and checked as there.
        clipping_range: :math:`c`: every entry of a site's sums must lie in :math:`[-c, c]`.
        quantization_range: :math:`2^b`, the integer levels of :math:`[-c, c]`.
        num_shares: Into how many shares a node's secrets are split: a count (> 2), or a fraction of the round's
            nodes (Flower's ``SecAggPlusWorkflow``).
        reconstruction_threshold: How many shares rebuild a secret: a count, or a fraction of ``num_shares``; the
            server learns nothing unless that many nodes collude, and a round survives dropouts while that many live.
    """

    def __init__(
        self,
        grid: Grid,
        context: Context,
        timeout: float | None = None,
        *,
        roster: Roster | None = None,
        clipping_range: float = SECAGG_RUN_CONFIG["secagg-clipping-range"],
        quantization_range: int = SECAGG_RUN_CONFIG["secagg-quantization-range"],
        num_shares: int | float = SECAGG_RUN_CONFIG["secagg-num-shares"],
        reconstruction_threshold: int | float = SECAGG_RUN_CONFIG["secagg-reconstruction-threshold"],
    ) -> None:
        super().__init__(grid, timeout, roster)
        self.context = context
        self.secure_range = clipping_range
        # Weight 1 per client (max_weight 1): the workflow's weighted mean is the plain mean.
        self.workflow = SecAggPlusWorkflow(
            num_shares,
            reconstruction_threshold,
            max_weight=1.0,
            clipping_range=clipping_range,
            quantization_range=quantization_range,
            timeout=timeout,
        )

    def exchange(self, tasks: list[ClientTask]) -> RoundReplies:
        """Runs one SecAgg+ round over the tasks' nodes; returns the clear replies and the sums' total."""
        if not tasks or any(task.evaluate for task in tasks):
            return super().exchange(tasks)
        round_idx = tasks[0].round_idx
        routed = self._route(tasks)
        if len(routed) < 2:
            if routed:
                say(
                    f"Round {round_idx}: only client {routed[0][0].client_id} has a SuperNode; secure aggregation"
                    " needs 2, so it is dropped too."
                )
            return RoundReplies({})
        sent = [SentTask(task, node_id, secrets.token_bytes(NONCE_BYTES)) for task, node_id in routed]
        strategy = _SecureRound(self.grid, self.context.run_id, sent)
        legacy = LegacyContext(self.context, ServerConfig(num_rounds=1), strategy)
        legacy.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: round_idx + 1})
        legacy.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
        self.workflow(self.grid, legacy)
        if strategy.results is None:
            say(f"Round {round_idx}: secure aggregation did not complete; every client of the round is dropped.")
            return RoundReplies({})
        replies: dict[int, ClientReply] = {}
        for proxy, result in strategy.results:
            reply = self.accept(proxy.node_id, dict(result.metrics), sent)
            if reply is None:
                # Its masked sums are inside the total, and what they were is unknown: the round cannot be used.
                say(f"Round {round_idx}: a reply could not be read; every client of the round is dropped.")
                return RoundReplies({})
            replies[reply.client_id] = reply
        count = len(strategy.results)
        means = parameters_to_ndarrays(strategy.results[0][1].parameters)
        total = [torch.as_tensor(mean, dtype=torch.float64) * count for mean in means]
        return RoundReplies(replies, total)


class _SecureRound(Strategy):
    """The legacy strategy that Flower's SecAgg+ workflow drives for one round: it hands out lightning_fed's tasks
    and keeps what the workflow gives back (each reply, its arrays replaced by the unmasked mean)."""

    def __init__(self, grid: Grid, run_id: int, sent: list[SentTask]) -> None:
        empty = Parameters(tensors=[], tensor_type="numpy.ndarray")
        self.instructions: list[tuple[ClientProxy, FitIns]] = [
            (GridClientProxy(item.node_id, grid, run_id), FitIns(empty, GridTransport.task_record(item)))
            for item in sent
        ]
        self.results: list[tuple[ClientProxy, FitRes]] | None = None

    def initialize_parameters(self, client_manager: ClientManager) -> Parameters | None:
        return None

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, FitIns]]:
        return self.instructions

    def aggregate_fit(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, FitRes]],
        failures: list[tuple[ClientProxy, FitRes] | BaseException],
    ) -> tuple[Parameters | None, dict[str, Scalar]]:
        self.results = list(results)
        return None, {}

    def configure_evaluate(
        self, server_round: int, parameters: Parameters, client_manager: ClientManager
    ) -> list[tuple[ClientProxy, EvaluateIns]]:
        return []

    def aggregate_evaluate(
        self,
        server_round: int,
        results: list[tuple[ClientProxy, EvaluateRes]],
        failures: list[tuple[ClientProxy, EvaluateRes] | BaseException],
    ) -> tuple[float | None, dict[str, Scalar]]:
        return None, {}

    def evaluate(self, server_round: int, parameters: Parameters) -> tuple[float, dict[str, Scalar]] | None:
        return None


__all__ = ["SecureGridTransport"]
