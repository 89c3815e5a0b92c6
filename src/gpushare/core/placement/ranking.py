"""Raw scores in [0, 1] as the extender's 0..10 priorities.

kube-scheduler multiplies an extender's priorities by the extender's weight and adds them to its
own plugins' scores, then picks at random among equal totals. Two things follow, both pure
functions over one call's nodes: relative policies are stretched over the nodes asked about
(``normalized``), and exactly one node keeps the top (``single_top``), so equal candidates
resolve the same way for every pod.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from typing import cast

MAX_SCORE = 10
"""The kube-scheduler extender's maximum priority."""


def absolute(score: float) -> int:
    """A score in [0, 1] as 0..10, for policies whose scores mean the same on every call."""
    return round(score * MAX_SCORE)


def normalized(scores: Sequence[float | None]) -> list[int]:
    """Relative scores as 0..10: the best fitting node 10, the worst 0, None (no fit) 0.

    Floored, so only the best get 10; otherwise sigmoid values of nearby growths would all
    round to the same integer.
    """
    distinct = set(scores)
    distinct.discard(None)
    if not distinct:
        return [0] * len(scores)
    fitting = cast("set[float]", distinct)
    low, high = min(fitting), max(fitting)
    span = high - low
    # thousands of nodes share few values: each distinct value is scaled once
    scaled = {
        value: MAX_SCORE
        if span <= 0 or value >= high
        else min(MAX_SCORE - 1, int((value - low) / span * MAX_SCORE))
        for value in fitting
    }
    return list(map(scaled.get, scores, repeat(0)))  # type: ignore[arg-type]


def single_top(
    names: Sequence[str], tens: list[int], raw: Callable[[str], float | None]
) -> list[int]:
    """The 0..10 scores with one node alone at the top: the best raw score, then the first name.

    kube-scheduler adds these (times weight) to its plugins' scores and picks at random among
    equal totals, and its LeastAllocated plugin likes empty nodes. Nodes sharing the top
    score would so scatter pods over empty nodes, and pods scheduled before the previous
    bind reached the extender would each land somewhere else. With one node on top, equal
    candidates resolve the same way every time (the FGD artifact keeps the first name too).
    The others at the top drop one point; when the top is 0 the chosen node gets 1 instead.
    """
    if not tens:
        return tens
    top = max(tens)
    if tens.count(top) < 2:
        return tens
    tied = [
        (score, n)
        for n, v in zip(names, tens, strict=True)
        if v == top
        if (score := raw(n)) is not None
    ]
    if not tied:
        return tens
    best = max(score for score, _ in tied)
    winner = min(n for score, n in tied if score >= best)
    if top == 0:
        return [1 if n == winner else v for n, v in zip(names, tens, strict=True)]
    return [v - 1 if v == top and n != winner else v for n, v in zip(names, tens, strict=True)]
