"""The most any batched layout of clients can gain on this machine: the clients' bare arithmetic, alone and stacked.

``benchmarks/batched.py`` times lightning_fed's batched clients against its sequential path. This script asks what
the best implementation could reach on the same CPU: it times the local steps of a round with no framework at all,
in plain PyTorch, two ways:

* **alone**: each client trains on its own model, one after the other (``nn.Module`` forward, cross-entropy,
  ``backward``, ``torch.optim.SGD``): the arithmetic and the per-operation dispatch of one client step;
* **stacked**: G clients' parameters stacked along a new first dimension and stepped together, one operation per
  layer for the whole group, in a layout chosen per layer kind:
  * linear layers: ``torch.baddbmm`` (one batched matrix product per layer), the layout vmap gives;
  * convolutions, the two layouts issue 44 names: ``grouped`` folds the clients into the channels and convolves
    with the block-diagonal weight (``conv2d(groups=G)``); ``im2col`` unfolds the images and multiplies them by
    the clients' weights with one batched matrix product;
  * activations, pooling and flattening on the clients folded into the batch.

Both run the same clients, steps and batch sizes: ``--clients-timed`` clients with their own initial weights, each
for one local epoch over the training share of ``--samples-per-client`` examples at batch ``--batch-size``, as
``benchmarks/batched.py``'s clients train (60 examples of which 48 train, at 16: three steps of 16), plain SGD
(lr 0.05). Before timing, every stacked layout's
losses and gradients at G = 2 are checked against the clients' own (``torch.testing.assert_close``), so what is
timed is the same arithmetic.

The report, per model: milliseconds per client step, alone and stacked for each G, the median over ``--repeats``;
the **arithmetic ceiling**, alone / the best stacked (what grouping saves on the steps themselves); and, with
``--framework`` (default on), lightning_fed's sequential round of ``benchmarks/batched.py`` (``--clients`` clients,
the same data and steps) timed in the same run, against the **ideal batched round**: that round's client steps at
the best stacked cost and nothing else: no data loading, no state copies, no aggregation, no logging. The ideal
round's speed-up bounds any batched path from above; the report also gives the time left per round for all of a
batched path's other work if it is to reach ``--goal`` (issue 44's 1.5×), beside the bare cost of one piece of
that work both paths do for every client: FedAvg's float64 weighted sum of the client's model.

Run from the repository root, on a quiet machine (``--wait-quiet SECONDS`` waits for one)::

    python benchmarks/batched_ceiling.py                                   # 2NN and LeNet-5, G = 1 .. 64
    python benchmarks/batched_ceiling.py --models 2nn --groups 2 4 8 16 21 32 50 --clients 100 1000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.batched import make_backbone, run
from benchmarks.load import LoadRecorder, add_wait_quiet_argument, footnote

LR = 0.05
#: The layouts timed per model: linear layers are always batched matrix products; convolutions as named.
LAYOUTS = {"2nn": ["bmm"], "lenet5": ["grouped", "im2col"], "cnn": ["grouped", "im2col"]}


def layers_of(model: nn.Module) -> list[nn.Module]:
    """The model's leaf modules in registration order, which is the order their ``forward`` applies them in for
    the models here (checked: :func:`check_layout` compares the stacked forward with the model's own)."""
    return [m for m in model.modules() if not list(m.children())]


def training_examples(samples_per_client: int, batch_size: int) -> int:
    """What a client of ``benchmarks/batched.py`` trains on: its examples less the share it holds out for testing
    (``DatasetFederated``'s ``client_test_fraction``; 48 of 60)."""
    from benchmarks.batched import make_datamodule

    datamodule = make_datamodule(1, samples_per_client, batch_size, seed=0)
    datamodule.setup("fit")
    return datamodule.client_num_samples(0)


def step_sizes(samples: int, batch_size: int) -> list[int]:
    """One local epoch's batch sizes (the last one smaller)."""
    return [min(batch_size, samples - start) for start in range(0, samples, batch_size)]


class Stacked:
    """G clients' parameters stacked on a new dimension 0, stepped as one, with ``conv_layout`` for convolutions.

    Args:
        models: The clients' own models (same architecture); their parameters are copied, not shared.
        conv_layout: ``"grouped"`` (channels folded, block-diagonal weight) or ``"im2col"`` (unfold + bmm).
    """

    def __init__(self, models: Sequence[nn.Module], conv_layout: str = "grouped") -> None:
        self.layers = layers_of(models[0])
        self.conv_layout = conv_layout
        self.params: list[Tensor] = []
        self.slots: list[dict[str, Tensor]] = []
        every = [layers_of(m) for m in models]
        for index, layer in enumerate(self.layers):
            slot = {}
            for name, _ in layer.named_parameters(recurse=False):
                stacked = torch.stack([getattr(layers[index], name).detach() for layers in every]).clone()
                slot[name] = stacked.requires_grad_(True)
                self.params.append(slot[name])
            self.slots.append(slot)
        self.groups = len(models)

    def forward(self, x: Tensor) -> Tensor:
        """``x``: ``[G, B, ...]`` -> logits ``[G, B, classes]``."""
        g, b = x.shape[:2]
        for layer, slot in zip(self.layers, self.slots):
            if isinstance(layer, nn.Linear):
                x = x.reshape(g, b, -1)
                x = torch.baddbmm(slot["bias"].unsqueeze(1), x, slot["weight"].transpose(1, 2))
            elif isinstance(layer, nn.Conv2d):
                x = self._conv(layer, slot, x)
            elif isinstance(layer, nn.Flatten):
                x = x.reshape(g, b, -1)
            else:  # activations, pooling, dropout: the clients folded into the batch
                folded = layer(x.reshape(g * b, *x.shape[2:]))
                x = folded.reshape(g, b, *folded.shape[1:])
        return x

    def _conv(self, layer: nn.Conv2d, slot: dict[str, Tensor], x: Tensor) -> Tensor:
        g, b, c, h, w = x.shape
        weight, bias = slot["weight"], slot.get("bias")
        out_channels, kernel = weight.shape[1], layer.kernel_size
        if self.conv_layout == "grouped":
            folded = x.transpose(0, 1).reshape(b, g * c, h, w)
            y = F.conv2d(
                folded,
                weight.reshape(g * out_channels, c, *kernel),
                None if bias is None else bias.reshape(-1),
                stride=layer.stride,
                padding=layer.padding,
                groups=g,
            )
            return y.reshape(b, g, out_channels, *y.shape[2:]).transpose(0, 1)
        columns = F.unfold(x.reshape(g * b, c, h, w), kernel, padding=layer.padding, stride=layer.stride)
        positions = columns.shape[-1]
        columns = columns.reshape(g, b, c * kernel[0] * kernel[1], positions).transpose(2, 3)
        columns = columns.reshape(g, b * positions, -1)
        y = torch.bmm(columns, weight.reshape(g, out_channels, -1).transpose(1, 2))  # [G, B·L, O]
        if bias is not None:
            y = y + bias.unsqueeze(1)
        side_h = (h + 2 * layer.padding[0] - kernel[0]) // layer.stride[0] + 1
        side_w = (w + 2 * layer.padding[1] - kernel[1]) // layer.stride[1] + 1
        return y.reshape(g, b, side_h, side_w, out_channels).permute(0, 1, 4, 2, 3)

    def losses(self, x: Tensor, y: Tensor) -> Tensor:
        """Each client's mean cross-entropy, ``[G]``."""
        logits = self.forward(x)
        g, b = y.shape
        return F.cross_entropy(logits.reshape(g * b, -1), y.reshape(-1), reduction="none").reshape(g, b).mean(1)

    def step(self, x: Tensor, y: Tensor) -> None:
        """One SGD step of every client: the gradient of the summed losses is each client's own."""
        grads = torch.autograd.grad(self.losses(x, y).sum(), self.params)
        with torch.no_grad():
            torch._foreach_add_(self.params, grads, alpha=-LR)


def alone_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor) -> None:
    """One plain PyTorch step of one client on its own model."""
    optimizer.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    optimizer.step()


def check_layout(name: str, layout: str, data: tuple[Tensor, Tensor]) -> None:
    """The stacked layout's per-client losses and gradients equal the clients' own (G = 2), or this raises."""
    torch.manual_seed(1)
    models = [make_backbone(name) for _ in range(2)]
    stacked = Stacked(models, layout)
    x, y = data[0][:2, :8], data[1][:2, :8]
    losses = stacked.losses(x, y)
    grads = torch.autograd.grad(losses.sum(), stacked.params)
    for i, model in enumerate(models):
        loss = F.cross_entropy(model(x[i]), y[i])
        own = torch.autograd.grad(loss, [p for layer in layers_of(model) for p in layer.parameters(recurse=False)])
        torch.testing.assert_close(losses[i], loss, rtol=1e-5, atol=1e-6, msg=f"{name}/{layout}: client {i} loss")
        for got, expected in zip(grads, own):
            torch.testing.assert_close(got[i], expected, rtol=1e-4, atol=1e-6, msg=f"{name}/{layout}: gradient")


def time_alone(name: str, clients: int, sizes: list[int], data: tuple[Tensor, Tensor]) -> float:
    """Seconds per client step, ``clients`` clients one after another, each for the steps of ``sizes``."""
    torch.manual_seed(0)
    models = [make_backbone(name) for _ in range(clients)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=LR) for m in models]
    started = time.perf_counter()
    for model, optimizer, x, y in zip(models, optimizers, data[0], data[1]):
        position = 0
        for size in sizes:
            alone_step(model, optimizer, x[position : position + size], y[position : position + size])
            position += size
    return (time.perf_counter() - started) / (clients * len(sizes))


def time_stacked(
    name: str, layout: str, group: int, clients: int, sizes: list[int], data: tuple[Tensor, Tensor]
) -> float:
    """Seconds per client step, ``clients`` clients in stacked groups of ``group`` (the last group smaller)."""
    torch.manual_seed(0)
    groups = [list(range(s, min(s + group, clients))) for s in range(0, clients, group)]
    stacks = [Stacked([make_backbone(name) for _ in members], layout) for members in groups]
    started = time.perf_counter()
    for members, stacked in zip(groups, stacks):
        x, y = data[0][members[0] : members[-1] + 1], data[1][members[0] : members[-1] + 1]
        position = 0
        for size in sizes:
            stacked.step(x[:, position : position + size], y[:, position : position + size])
            position += size
    return (time.perf_counter() - started) / (clients * len(sizes))


def time_aggregation(name: str, clients: int) -> float:
    """Seconds per client of FedAvg's float64 weighted sum, the bare way :class:`~lightning_fed.aggregators.FedAvg`
    folds an update (float32 entries added into float64 sums with the client's weight): work that a batched round
    does for every client as the sequential one does."""
    torch.manual_seed(0)
    states = [{n: p.detach() for n, p in make_backbone(name).named_parameters()} for _ in range(clients)]
    sums = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in states[0].items()}
    started = time.perf_counter()
    for state in states:
        for n, tensor in state.items():
            sums[n].add_(tensor, alpha=1.0 / clients)
    return (time.perf_counter() - started) / clients


def framework_sequential_round(args: argparse.Namespace, name: str, clients: int) -> float:
    """lightning_fed's sequential round of ``benchmarks/batched.py`` (median of rounds 2..R), seconds."""
    settings = argparse.Namespace(
        seed=0, samples_per_client=args.samples_per_client, batch_size=args.batch_size, rounds=args.rounds,
        device="cpu", processes=1, precision="32-true", threads=1, wait_quiet=0,
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as root:
        (wall, _), _, _ = run(settings, name, clients, 1, root)
    return wall


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["2nn", "lenet5"], choices=sorted(LAYOUTS))
    parser.add_argument("--groups", type=int, nargs="+", default=[2, 4, 8, 16, 21, 32, 64])
    parser.add_argument("--clients-timed", type=int, default=64, help="clients per timing (stacked: in groups)")
    parser.add_argument("--samples-per-client", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, nargs="*", default=[100, 1000], help="framework rounds to bound")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per framework fit (>= 2; round 1 untimed)")
    parser.add_argument("--goal", type=float, default=1.5, help="the batched speed-up to budget for")
    parser.add_argument("--no-framework", dest="framework", action="store_false")
    add_wait_quiet_argument(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    examples = training_examples(args.samples_per_client, args.batch_size)
    sizes = step_sizes(examples, args.batch_size)
    generator = torch.Generator().manual_seed(0)
    data = (
        torch.randn(args.clients_timed, examples, 1, 28, 28, generator=generator),
        torch.randint(0, 10, (args.clients_timed, examples), generator=generator),
    )
    print(f"one torch thread; {args.clients_timed} clients × steps of {sizes}; medians of {args.repeats} repeats\n")
    with LoadRecorder(1, args.wait_quiet) as load:
        for name in args.models:
            timings: dict[str, list[float]] = {"alone": []}
            for layout in LAYOUTS[name]:
                check_layout(name, layout, data)
                for group in args.groups:
                    timings[f"{layout}, G = {group}"] = []
            for _ in range(args.repeats):  # interleaved, so that a slow moment touches every way alike
                timings["alone"].append(time_alone(name, args.clients_timed, sizes, data))
                for layout in LAYOUTS[name]:
                    for group in args.groups:
                        timings[f"{layout}, G = {group}"].append(
                            time_stacked(name, layout, group, args.clients_timed, sizes, data)
                        )
            aggregation = statistics.median(time_aggregation(name, args.clients_timed) for _ in range(args.repeats))
            medians = {way: statistics.median(values) for way, values in timings.items()}
            alone = medians["alone"]
            print(f"| {name} | ms per client step | vs alone |\n|---|---:|---:|")
            for way, seconds in medians.items():
                print(f"| {way} | {1e3 * seconds:.3f} | {alone / seconds:.2f}× |")
            best_way = min((w for w in medians if w != "alone"), key=medians.__getitem__)
            best = medians[best_way]
            print(f"\n{name}: arithmetic ceiling {alone / best:.2f}× ({best_way}: {1e3 * best:.3f} ms a client step)")
            print(f"{name}: FedAvg's float64 sum, bare: {1e3 * aggregation:.3f} ms a client")
            if not args.framework:
                continue
            for clients in args.clients:
                steps = clients * len(sizes)
                sequential = framework_sequential_round(args, name, clients)
                ideal = steps * best
                budget = sequential / args.goal - ideal
                print(
                    f"{name}, {clients} clients: lightning_fed sequential {sequential:.3f} s/round; ideal batched round"
                    f" {ideal:.3f} s ({steps} client steps at {1e3 * best:.3f} ms, nothing else): at most"
                    f" {sequential / ideal:.2f}×; {args.goal}× leaves {budget * 1e3:.1f} ms a round"
                    f" ({max(budget, 0.0) / clients * 1e3:.3f} ms a client) for data, state, aggregation and logging;"
                    f" FedAvg's sum alone takes {1e3 * aggregation:.3f} ms a client"
                )
            print()
    print(footnote([load.record]))


if __name__ == "__main__":
    main()
