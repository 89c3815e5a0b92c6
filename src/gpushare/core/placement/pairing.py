"""Which shares should meet on one GPU: packing patterns for the one-GPU fractional shapes.

Fragmentation (``core.placement.fragmentation``) asks whether the next pod still fits; it does
not ask whether a GPU ends up full. On the openb default trace two 470 milli-GPU pods on one
GPU leave 60 that almost nothing can use, and a 320 beside a 470 leaves 210, while a 320 beside
a 650 leaves 30. FGD's measure likes every one of those pairings, because each makes the GPU's
free share too small for most shapes and so "uses" it: which pairing a policy makes depends on
which GPU happens to be open when a pod arrives, and the GPUs end with more left over than the
shares need.

How the shares *should* pair is a cutting-stock problem (Gilmore and Gomory): choose how many
GPUs to fill with each pattern (a multiset of shares that fits one GPU) so that every share's
expected count is covered with the fewest GPUs. ``solve`` solves its linear program over the
learned workload's shares by column generation: a small simplex over the patterns found so far
gives each share a worth in GPUs (the program's dual), and an unbounded knapsack over those
worths finds the next pattern worth adding, until none is worth more than one GPU. At the
optimum the worths come out as simple fractions: on the openb default trace an 810 is worth a
whole GPU, a 470 a half, a 320 a third.

A placement is *on pattern* (``Pairing.fits``) when it loses none of the GPU's worth: the share's
own worth plus the most the free share left after it can still take in is as much as the free
share could take in before. A 320 on an empty GPU, beside a 650 or beside another 320 is on
pattern; a 320 beside a 470 is not (a half and a third leave a sixth that nothing fills). The
policy gives on-pattern placements a small bonus (``core.placement.defragmenting``), so among
nearly equal placements the one that keeps a GPU on its way to a full pattern wins. The test
reads only the GPU's free share and the worths, so nothing has to remember which pattern a GPU
was meant for; and every pattern of every optimal mix under those worths fills its GPU with
exactly one GPU's worth (complementary slackness), so each step towards any of them passes the
test, whichever optimal mix the simplex lands on.

Measured in the milli-GPU simulator (unallocated % at 100 % arrived on the openb default trace,
seeds 0-3, against 4.33, 4.12, 4.24, 4.29 unguided, the shares taken from the whole trace for
the comparison): the on-pattern test as here 4.12, 4.04, 4.08; the transitions of one optimal
solution's patterns 4.12, 4.03, 4.07 (scipy's) or 4.18, 4.10, 4.06 (this simplex's, a different
optimum); best-fit-decreasing patterns 4.14, 4.10, 4.16. Everything is in the caller's unit:
milli-GPU, or memory units of one card.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import reduce

EPSILON = 1e-9
"""Tolerance of the simplex and of a pattern's worth above one GPU."""

SHARES = 24
"""Shares the program reads at most, the heaviest; the rest get no guidance. The time grows
about with the cube of the shares: 20 random shares take 0.06 s, 48 take 0.7 s and every GiB
share of an 80 GiB card (79) takes 8 s, which a workload of odd requests must not make the
extender spend; the openb traces have 20 one-GPU shares in all, fewer in their learned top."""

ROUNDS = 60
"""Patterns the column generation adds at most (the openb shares need about 20)."""

CELLS = 4096
"""The knapsack's capacity in steps at most; finer units are rounded (shares up, the GPU
down), which only hides patterns that fill a GPU to the last few units."""


TOLERANCE = 1e-6
"""A placement is on pattern when it loses less than this of one GPU's worth."""


@dataclass(frozen=True, slots=True)
class Program:
    """The cutting-stock program's optimum over the learned shares."""

    shares: tuple[int, ...]
    """The shares, ascending (0 < share < one GPU)."""
    values: tuple[float, ...]
    """Each share's worth in GPUs at the optimum (the program's dual: a share that must pair
    with one other of its kind to fill a GPU is worth about a half)."""
    patterns: tuple[tuple[tuple[int, ...], float], ...]
    """The patterns found (shares, ascending) and how many GPUs the optimum fills with each."""


@dataclass(frozen=True, slots=True)
class Pairing:
    """Whether a share placed on a GPU keeps that GPU able to end as full as a pattern."""

    capacity: int
    """One GPU in the caller's unit."""
    step: int
    """The knapsack's unit (``CELLS``)."""
    value: Mapping[int, float]
    """Each learned share's worth in GPUs (``Program.values``)."""
    best: tuple[float, ...]
    """The most worth a free share of ``k`` steps can still take in, for every k."""

    def fits(self, share: int, free: int) -> bool:
        """Whether placing ``share`` on a GPU with ``free`` left loses none of the GPU's worth.

        The free share could take in ``best[free]``; after the placement the share's own worth
        and ``best[free - share]``. An empty GPU takes in at most one GPU's worth, so a share
        opens one on pattern exactly when some optimal pattern holds it.
        """
        worth = self.value.get(share)
        if worth is None or share > free:
            return False
        room = min(free, self.capacity) // self.step
        need = -(-share // self.step)
        if need > room:
            return False
        return self.best[room] - worth - self.best[room - need] <= TOLERANCE


NO_PAIRING = Pairing(1, 1, {}, (0.0, 0.0))
"""No fractional shares learned: no placement is on pattern."""


def pairing(weights: Mapping[int, float], capacity: int) -> Pairing:
    """Which placements stay on pattern, for shares expected with these weights on one GPU."""
    program = solve(weights, capacity)
    if not program.shares:
        return NO_PAIRING
    step = _step(program.shares, capacity)
    cells = capacity // step
    sizes = [-(-s // step) for s in program.shares]
    best = [0.0] * (cells + 1)
    for room in range(1, cells + 1):
        best[room] = best[room - 1]
        for size, worth in zip(sizes, program.values, strict=True):
            if size <= room and best[room - size] + worth > best[room]:
                best[room] = best[room - size] + worth
    return Pairing(
        capacity, step, dict(zip(program.shares, program.values, strict=True)), tuple(best)
    )


def solve(weights: Mapping[int, float], capacity: int) -> Program:
    """The cutting-stock program for shares with these weights, by column generation.

    Minimises the GPUs used so that each share in ``weights`` (0 < share < capacity, weight > 0;
    the ``SHARES`` heaviest) is covered by its weight, starting from one pattern per share (as
    many of it as fit).
    """
    usable = sorted(
        (s for s, w in weights.items() if 0 < s < capacity and w > 0),
        key=lambda s: (-weights[s], s),
    )
    shares = tuple(sorted(usable[:SHARES]))
    if not shares:
        return Program((), (), ())
    demand = [float(weights[s]) for s in shares]
    columns = [
        [capacity // s if j == i else 0 for j in range(len(shares))] for i, s in enumerate(shares)
    ]
    step = _step(shares, capacity)
    values, amounts = _solve(columns, demand)
    for _ in range(ROUNDS):
        column, worth = _knapsack(shares, values, capacity, step)
        if worth <= 1.0 + EPSILON or column in columns:
            break
        columns.append(column)
        values, amounts = _solve(columns, demand)
    found = tuple(
        (tuple(s for s, count in zip(shares, column, strict=True) for _ in range(count)), amount)
        for column, amount in zip(columns, amounts, strict=True)
    )
    return Program(shares, tuple(values), found)


def _step(shares: Sequence[int], capacity: int) -> int:
    """The knapsack's unit: the shares' common divisor, coarser when that needs too many cells."""
    divisor = reduce(math.gcd, shares, capacity)
    return max(divisor, math.ceil(capacity / CELLS))


def _knapsack(
    shares: Sequence[int], values: Sequence[float], capacity: int, step: int
) -> tuple[list[int], float]:
    """The pattern of the most value (any number of each share) and that value."""
    cells = capacity // step
    sizes = [math.ceil(s / step) for s in shares]
    best = [0.0] * (cells + 1)
    last = [-1] * (cells + 1)
    for room in range(1, cells + 1):
        best[room], last[room] = best[room - 1], -2  # -2: one cell left empty
        for i, size in enumerate(sizes):
            if size <= room and values[i] > EPSILON:
                value = best[room - size] + values[i]
                if value > best[room] + EPSILON:
                    best[room], last[room] = value, i
    column = [0] * len(shares)
    room = cells
    while room > 0 and last[room] != -1:
        if last[room] == -2:
            room -= 1
            continue
        column[last[room]] += 1
        room -= sizes[last[room]]
    return column, best[cells]


def _solve(
    columns: Sequence[Sequence[int]], demand: Sequence[float]
) -> tuple[list[float], list[float]]:
    """The program over ``columns`` through its dual, by the simplex from the slack basis.

    Dual: maximise ``demand . y`` with ``column . y <= 1`` for every column and ``y >= 0``; its
    origin is feasible, so no first phase is needed. Returns the shares' values ``y`` and each
    column's amount in the primal optimum (the dual's slack prices). Bland's rule: no cycling.
    """
    rows, width = len(columns), len(demand)
    table = [
        [float(v) for v in column] + [1.0 if k == r else 0.0 for k in range(rows)] + [1.0]
        for r, column in enumerate(columns)
    ]
    cost = [-d for d in demand] + [0.0] * rows + [0.0]
    basis = [width + r for r in range(rows)]
    while True:
        entering = next((j for j in range(width + rows) if cost[j] < -EPSILON), -1)
        if entering < 0:
            break
        leaving, ratio = -1, math.inf
        for r in range(rows):
            coefficient = table[r][entering]
            if coefficient > EPSILON:
                bound = table[r][-1] / coefficient
                if bound < ratio - EPSILON or (
                    bound <= ratio + EPSILON and basis[r] < basis[leaving]
                ):
                    leaving, ratio = r, bound
        if leaving < 0:
            raise ArithmeticError("the pairing program is unbounded: a share of size 0 slipped in")
        pivot = table[leaving]
        scale = pivot[entering]
        pivot[:] = [v / scale for v in pivot]
        for r in range(rows):
            if r != leaving and abs(table[r][entering]) > EPSILON:
                factor = table[r][entering]
                table[r] = [v - factor * p for v, p in zip(table[r], pivot, strict=True)]
        factor = cost[entering]
        cost = [v - factor * p for v, p in zip(cost, pivot, strict=True)]
        basis[leaving] = entering
    values = [0.0] * width
    for r, variable in enumerate(basis):
        if variable < width:
            values[variable] = table[r][-1]
    amounts = [max(0.0, cost[width + r]) for r in range(rows)]
    return values, amounts
