"""GPU choice inside a node: best fit for ``binpack``, most free for ``spread``.

Best fit leaves the smallest hole on the chosen GPU, which keeps whole GPUs free for big
requests; most free evens the load for latency-sensitive work. Computing power left breaks ties
the same way, then the lower index, so the choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from gpushare.core.model.inventory import Placement


class Candidate(NamedTuple):
    """A GPU the pod fits on, with what would be left there after placing it."""

    gpu: int
    mem_left: int
    core_left: int


def _best_fit(c: Candidate) -> tuple[int, int, int]:
    return (c.mem_left, c.core_left, c.gpu)


def _most_free(c: Candidate) -> tuple[int, int, int]:
    return (-c.mem_left, -c.core_left, c.gpu)


def rank_gpus(
    candidates: Sequence[Candidate],
    placement: Placement,
    prefer: tuple[int, ...] = (),
) -> list[int]:
    """All candidates, best first: ``prefer`` first, then by the node's placement."""
    order = _most_free if placement is Placement.SPREAD else _best_fit

    def key(c: Candidate) -> tuple[int, tuple[int, int, int]]:
        return (0 if c.gpu in prefer else 1, order(c))

    return [c.gpu for c in sorted(candidates, key=key)]


def choose_gpus(
    candidates: Sequence[Candidate],
    count: int,
    placement: Placement,
    prefer: tuple[int, ...] = (),
) -> tuple[int, ...]:
    """Pick ``count`` GPUs among the candidates, by the node's placement, in index order.

    GPUs in ``prefer`` come first (the hand-off invariant asks for them), then placement decides.
    """
    return tuple(sorted(rank_gpus(candidates, placement, prefer)[:count]))
