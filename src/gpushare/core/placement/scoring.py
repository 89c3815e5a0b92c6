"""Node-level policies: how much the scheduler should like a node that fits.

A policy returns a float in [0, 1]; adapters scale it (the extender to 0..10). ``binpack``
fills the chosen GPUs and already-busy nodes first, so whole GPUs and whole nodes stay
free for large requests; ``spread`` does the opposite. More policies plug in through
``PolicyRegistry.register``; a ``ChoosingPolicy`` also picks the GPU inside the node and learns
as pods arrive (``core.placement.defragmenting`` adds ``fgd`` and ``gpushare`` that way).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from gpushare.core.booking.ledger import Ledger, NodeUsage
from gpushare.core.model.inventory import CORE_PER_GPU, Mode, NodeInventory
from gpushare.core.model.requests import PodRequest
from gpushare.core.placement.placing import Candidate


class NodePolicy(Protocol):
    """Scores a node that fits; must be pure and return a value in [0, 1]."""

    name: str

    def score(
        self,
        request: PodRequest,
        node: NodeInventory,
        usage: NodeUsage,
        gpus: tuple[int, ...],
    ) -> float:
        """How much this node is liked for the pod, placed on ``gpus``."""
        ...


@runtime_checkable
class ChoosingPolicy(NodePolicy, Protocol):
    """A policy with state that also picks the GPU inside a node.

    Its scores are relative, so adapters normalise them over the nodes asked about (the best
    gets the maximum), as kube-scheduler's NormalizeScore does.
    """

    @property
    def version(self) -> int:
        """Changes whenever scores or choices cached before may be stale."""
        ...

    @property
    def active(self) -> bool:
        """False while it has nothing to learn from and scores as a plain policy (absolute)."""
        ...

    def follow(self, table: Mapping[str, NodeInventory], ledger: Ledger) -> None:
        """Catch up with the whole cluster, for what it weighs cluster-wide."""
        ...

    def show(self, nodes: Iterable[NodeInventory], ledger: Ledger) -> None:
        """Without the cluster's table: the nodes a call was asked about."""
        ...

    def choose(
        self,
        request: PodRequest,
        node: NodeInventory,
        usage: NodeUsage,
        fitting: Sequence[Candidate],
    ) -> tuple[int, ...]:
        """GPUs for the pod among ``fitting``, or () to keep the filter's choice."""
        ...

    def reads(self, request: PodRequest) -> tuple[object, ...]:
        """What its scores and choices read from a request beyond the GPU shape.

        Decisions are remembered per request shape (``deciding.shape_key``); two pods of one
        GPU shape that differ here (a fragmentation-aware policy reads the CPU request and the
        GPU models allowed) must not share them.
        """
        ...


def gpu_fill_after(
    request: PodRequest, node: NodeInventory, usage: NodeUsage, gpus: tuple[int, ...]
) -> float:
    """Mean fullness of the chosen GPUs after placement (memory, and core on core_mem)."""
    if not gpus:
        return 0.0
    total = 0.0
    for index in gpus:
        gpu = node.gpu(index)
        size = gpu.mem_units if gpu else 0
        mem = (usage.on(index).mem_units + request.mem_per_gpu) / size if size else 1.0
        if node.mode is Mode.CORE_MEM:
            core = (usage.on(index).core_pct + request.core_per_gpu) / CORE_PER_GPU
            mem = (mem + core) / 2
        total += mem
    return min(1.0, total / len(gpus))


def node_fill_after(request: PodRequest, node: NodeInventory, usage: NodeUsage) -> float:
    """Fullness of the whole node's GPU memory after placement."""
    size = node.mem_units_total
    if size <= 0:
        return 1.0
    return min(1.0, (usage.mem_units + request.mem_units) / size)


class Binpack:
    """Prefer full GPUs, then busy nodes."""

    name = "binpack"

    def score(
        self, request: PodRequest, node: NodeInventory, usage: NodeUsage, gpus: tuple[int, ...]
    ) -> float:
        """Weighted fullness after placement: the GPUs matter most, the node breaks ties."""
        return 0.7 * gpu_fill_after(request, node, usage, gpus) + 0.3 * node_fill_after(
            request, node, usage
        )


class Spread:
    """Prefer empty nodes and empty GPUs."""

    name = "spread"

    def score(
        self, request: PodRequest, node: NodeInventory, usage: NodeUsage, gpus: tuple[int, ...]
    ) -> float:
        """Emptiness after placement."""
        return 1.0 - (
            0.5 * gpu_fill_after(request, node, usage, gpus)
            + 0.5 * node_fill_after(request, node, usage)
        )


class PolicyRegistry:
    """Policies selectable by name; a value passed to whoever needs it, never a global."""

    def __init__(self, *items: NodePolicy) -> None:
        self._items: dict[str, NodePolicy] = {p.name: p for p in items}

    def register(self, policy: NodePolicy) -> None:
        """Make a policy selectable by its name (replacing one of the same name)."""
        self._items[policy.name] = policy

    def names(self) -> list[str]:
        """Known policy names, sorted."""
        return sorted(self._items)

    def get(self, name: str) -> NodePolicy:
        """A policy by name, or a ValueError that lists the known ones."""
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(self.names())
            raise ValueError(f"policy={name!r} is not known; choose one of: {known}") from None


def default_policies() -> PolicyRegistry:
    """A registry holding ``binpack`` and ``spread``."""
    return PolicyRegistry(Binpack(), Spread())
