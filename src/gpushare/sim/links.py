"""Simulated nodes with a GPU topology, and how well connected the multi-GPU pods' GPUs were.

The traces say nothing about interconnects, so a run names a layout of
``core.model.topology.LAYOUTS`` and every node whose GPU count the layout fits takes it (the others,
a single GPU or an odd count for the pairwise layouts, publish none). The same layout is known
to runs that ignore it, so both count the same thing: of the pods over two or more GPUs placed
on a node with a topology, how many got a set whose worst pair is as close as any set of that
many GPUs on that node can be (``core.model.topology.best_worst_pair``), i.e. NVLink whenever the
node has an NVLink island that large.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gpushare.core.model.topology import Distance, best_worst_pair, layout, worst_pair
from gpushare.sim.openb import TraceNode


def node_layouts(nodes: Sequence[TraceNode], name: str) -> list[Distance]:
    """Each node's matrix under the layout ``name`` ('' or a misfit: ())."""
    if not name:
        return [() for _ in nodes]
    cache: dict[int, Distance] = {}
    out: list[Distance] = []
    for node in nodes:
        if node.gpus not in cache:
            distance, problem = layout(name, node.gpus) if node.gpus >= 2 else ((), "")
            cache[node.gpus] = () if problem else distance
        out.append(cache[node.gpus])
    return out


@dataclass
class Connected:
    """Multi-GPU pods placed on nodes with a topology, and those that got a best set."""

    pods: int = 0
    best: int = 0
    _ideal: dict[tuple[Distance, int], int] = field(default_factory=dict, repr=False)

    def record(self, chosen: Sequence[int], distance: Distance) -> None:
        """Count one placed pod over ``chosen`` GPUs of a node with ``distance``."""
        if len(chosen) < 2 or not distance:
            return
        key = (distance, len(chosen))
        ideal = self._ideal.get(key)
        if ideal is None:
            ideal = self._ideal[key] = best_worst_pair(distance, len(chosen))
        self.pods += 1
        self.best += worst_pair(chosen, distance) <= ideal

    @property
    def counts(self) -> tuple[int, int]:
        """(pods, best-connected pods), plain values for a result."""
        return self.pods, self.best
