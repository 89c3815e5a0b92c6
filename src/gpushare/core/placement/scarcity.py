"""Scarce shapes: the cluster's supply of each pod shape against the demand expected for it.

Fragmentation (``core.placement.fragmentation``) weighs each shape by how often it arrives, which
is right
for the next pod and wrong for a rare shape whose last homes are going. On the built-in
``models`` stress workload 8-GPU pods are about 1 % of the pods and 8 % of the GPU demand; a
light pod that opens an empty 8-GPU node grows fragmentation by 7 GPUs x 1 %, less than the CPU
it balances there, so a node-local measure lets light pods open every empty node and the 8-GPU
pods that come later fail. This module
looks at the whole cluster instead:

- *supply*: how many pods of each shape the cluster can still host, summed over the nodes
  (``hosts``: whole pods per node, GPU sets and CPU both, models respected);
- *demand*: the shape's share of the pods that would fill the idle GPU share, at the workload's
  mean GPU share per pod;
- *price*: the chance that demand reaches the supply, P(Poisson(demand) >= supply), the value
  of the last copy (as a newsvendor prices the last unit on the shelf). It is near 0 while a
  shape has many homes and near 1 when arrivals would use up the last ones.

A placement that takes copies of a priced shape costs ``WEIGHT x price x GPUs x share per
GPU`` per copy, added to the fragmentation growth (``core.placement.defragmenting``). Prices
are rounded
down to powers of two and below ``PRICE_FLOOR`` count as 0, and only shapes that need several
GPUs or some models get one (``priceable``), so scores cached for a node stay valid until a
rounded price changes: 13 times over openb default seed 0, beside 33 workload refreshes.

Why it wins where fragmentation alone lost: on the ``models`` stress workload (half the pods
restricted to GPU models) gpushare had 6.58 +- 1.28 % unallocated at 100 % arrived against
FGD's 5.65 +- 0.46, because light pods opened the empty 8-GPU nodes the rare 8-GPU pods needed;
with prices it has 4.89 +- 0.41 (10 seeds; the table at ``WEIGHT``).

The workload's top shapes cover 97 % of the pods, and a multi-GPU shape can be rarer than the
rest: on the openb gpushare40 trace the 8-GPU pods are 0.5 % of the pods and 5.5 % of the GPU
demand, split over three shapes (64, 88 and 120 cores), none of which was in the top until 76 %
arrived (seed 4). Unpriced, light pods opened every empty 8-GPU node by 72 % arrived, where FGD
kept some until 95 %, and under churn 8-GPU pods waited for nodes to drain. So the supply also
counts, and prices, every multi-GPU shape seen that the top leaves out, at its share of all the
pods seen (``WorkloadEstimate.rare``); fragmentation still weighs the top shapes only. With them
the first 8-GPU pod failed at 89 % arrived there.

Shapes nobody has asked for yet have no price of their own, and rare one-GPU shapes never enter
the workload's top shapes. That leaves the pods restricted to a rare GPU model unprotected: on
the ``multigpu`` stress workload each of its few pods restricted to the six 8-GPU G3 nodes has
a shape of its own, unrestricted 4- to 8-GPU pods open every G3 node (their CPU fits best
there), and a G3-only pod that comes late finds no room. So each model set that pods were
restricted to also gets a *reserve* shape: a whole node of those models, demanded by a
``RESERVE`` part of those pods (``reserves``). Its price stays 0 while the models have whole
nodes to spare and rises as their last ones go, which turns unrestricted pods to nodes of other
models.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from gpushare.core.placement.fragmentation import Restriction, Shape, WorkloadEstimate, copies

PRICE_FLOOR = 1.0 / 64
"""Prices below this count as 0; the rest round down to a power of two."""

WEIGHT = 2.0
"""Each priced copy costs this many times its expected loss (price x its GPU share). Measured
with every GPU shape priced, on the stress workloads (10 seeds) and openb (3 seeds),
unallocated % at 100 % arrived (``priceable`` changes none of the weight-2 row but cpuheavy,
11.77 +- 0.93):

| weight | models | multigpu | mixed | cpuheavy | openb default | gpushare100 |
|---|---|---|---|---|---|---|
| 1 | 4.97 +- 0.50 | 4.54 +- 1.02 | 6.51 +- 1.11 | 11.71 +- 0.83 | 4.22 | 12.97 |
| 2 | 4.89 +- 0.41 | 4.50 +- 1.03 | 6.50 +- 1.17 | 11.89 +- 0.82 | 4.23 | 12.97 |
| 4 | 4.77 +- 0.33 | 4.50 +- 1.03 | 6.40 +- 1.10 | 11.80 +- 0.57 | 4.23 | 13.01 |
| 8 | 4.74 +- 0.32 | 4.47 +- 1.03 | 6.58 +- 1.29 | 12.02 +- 0.64 | | |

At 1 the spread on ``models`` is larger than FGD's (0.46); 2 is the smallest weight below it
that leaves openb unchanged."""

RESERVE = 0.2
"""The part of the pods restricted to some models assumed to need a whole node of them.
Unallocated % at 100 % arrived, gpushare, 10 seeds (openb: 3 seeds, the same at every value;
FGD has 5.74 +- 0.96 on multigpu, 5.65 +- 0.46 on models, 25.41 on cpuheavy, 11.27 on mixed):

| reserve | multigpu | models | cpuheavy | mixed |
|---|---|---|---|---|
| 0 | 4.50 +- 1.03 | 4.89 +- 0.41 | 11.77 +- 0.93 | 6.50 +- 1.17 |
| 0.1 | 4.15 +- 0.96 | 4.60 +- 0.11 | 12.18 +- 0.92 | 6.36 +- 1.23 |
| 0.2 | 4.10 +- 0.96 | 4.59 +- 0.12 | 12.09 +- 0.88 | 6.03 +- 1.25 |
| 0.3 | 4.09 +- 0.95 | 4.69 +- 0.10 | 12.33 +- 1.11 | 6.00 +- 1.01 |
| 0.5 | 4.02 +- 0.94 | 4.84 +- 0.22 | 12.33 +- 0.91 | 5.87 +- 1.24 |
| 1 | 4.16 +- 0.91 | 4.74 +- 0.21 | 12.83 +- 1.02 | 6.79 +- 1.38 |
| 2 | 4.07 +- 0.91 | 4.90 +- 0.19 | 16.87 +- 2.27 | 8.03 +- 1.04 |

Over 20 seeds of multigpu, 0.2 gives 4.20 +- 0.95 against FGD's 5.68 +- 0.96 (0: 4.58 +-
1.10). Larger values cost cpuheavy, where CPU, not whole nodes, runs out. Giving the reserve
shape the pods' least or mean CPU changed no digit of this table, so it asks for none."""

NORMAL_FROM = 50.0
"""From this demand on, the Poisson tail is taken from its normal approximation."""

State = tuple[tuple[int, ...], int, str]
"""A node as the supply sees it: free shares (sorted), free milli-CPU, GPU model."""


def shortage(demand: float, supply: float) -> float:
    """P(Poisson(demand) >= supply): the chance arrivals reach the supply's last copy.

    A fractional supply counts its whole copies (the fraction is CPU for part of a pod). No
    demand is no shortage, also where nothing is left (nothing would be taken there anyway).
    """
    if demand <= 0.0:
        return 0.0
    whole = math.floor(supply + 1e-9)
    if whole <= 0:
        return 1.0
    spread = math.sqrt(demand)
    if whole > demand + 8.0 * spread + 10.0:
        return 0.0
    if demand >= NORMAL_FROM:  # exp(-demand) underflows long before the sum is short
        return 0.5 * math.erfc((whole - 0.5 - demand) / (spread * math.sqrt(2.0)))
    term = math.exp(-demand)
    below = term
    for j in range(1, whole):
        term *= demand / j
        below += term
    return max(0.0, 1.0 - below)


def priceable(shape: Shape) -> bool:
    """Whether a shape gets a price: one with GPUs that needs several at once or only some
    models. A one-GPU shape that takes any model can use any GPU with room, so running short of
    it is running short of GPU share, which no node choice changes; pricing it as well reorders
    nodes only by how much share they hold, which fragmentation already weighs. On the openb
    default trace (seed 0) leaving those shapes out cuts the price changes from 65 to 13 with
    the same unallocated % on every stress workload and trace measured (``WEIGHT``)."""
    return shape.per_gpu > 0 and (shape.count > 1 or bool(shape.models))


def reserves(
    restricted: Sequence[Restriction], gpus: dict[str, int]
) -> tuple[tuple[Shape, float], ...]:
    """The reserve shape of each model set pods were restricted to, with its probability: a
    whole node of those models (``gpus``: the most GPUs a node of each model has) at the
    largest share per GPU those pods asked, for ``RESERVE`` of them. Model sets without a node
    get none."""
    shapes: list[tuple[Shape, float]] = []
    for restriction in restricted:
        count = max((gpus.get(model, 0) for model in restriction.models), default=0)
        if count > 0 and RESERVE > 0.0:
            shape = Shape(0, restriction.per_gpu, count, restriction.models)
            shapes.append((shape, RESERVE * restriction.fraction))
    return tuple(shapes)


def hosts(free: Sequence[int], cpu_free: int, model: str, shape: Shape) -> int:
    """Whole pods of a shape the node can still host: the supply counts pods, not parts.

    ``fragmentation.copies`` lets CPU bound copies fractionally, which is right for idle share
    that lighter pods may still use, and wrong for a supply: summed over nodes, an empty 96-core
    node counted 0.8 of a 120-core 8-GPU pod it can never host. On the openb default trace
    with multi-GPU pods at 50 % of the GPU demand (``sim.mixes``) the 549 G2 nodes so counted
    439 copies of that shape, which only the 39 G3 nodes (128 cores) can host; it was never
    priced, and light pods opened the G3 nodes its pods needed.
    """
    return math.floor(copies(free, cpu_free, model, shape) + 1e-9)


def rounded(price: float) -> float:
    """The price as cached decisions see it: 0 below ``PRICE_FLOOR``, else a power of two."""
    if price < PRICE_FLOOR:
        return 0.0
    return 2.0 ** math.floor(math.log2(min(1.0, price)))


@dataclass(frozen=True, slots=True)
class Prices:
    """The shapes with a price now, and a version that changes whenever they do."""

    shapes: tuple[tuple[Shape, float], ...] = ()
    version: int = 0

    def held(self, free: Sequence[int], cpu_free: int, model: str) -> float:
        """What the priced copies a node can still host are worth, in share units: ``WEIGHT``
        x price x GPUs x share per GPU per copy. A placement costs what it takes off this."""
        total = 0.0
        for shape, price in self.shapes:
            total += price * shape.count * shape.per_gpu * hosts(free, cpu_free, model, shape)
        return WEIGHT * total


class Supply:
    """Copies of every shape of the target workload across the cluster, kept per node.

    Callers tell it each node's state when it changes (``update``; None when the node is
    gone). Per-node copies are remembered per state until the workload changes, so a cluster
    of look-alike nodes costs a few computations per refresh.
    """

    def __init__(self, workload: WorkloadEstimate, *, memo_limit: int = 200_000) -> None:
        self.workload = workload
        self.memo_limit = memo_limit
        self._states: dict[Hashable, State] = {}
        self._memo: dict[State, tuple[float, ...]] = {}
        self._workload_version = -1
        self._totals: list[float] = []
        self._idle = 0
        self._dirty = True
        self._prices = Prices()
        self._shapes: tuple[tuple[Shape, float], ...] = ()
        """The workload's top shapes, its rare multi-GPU shapes, then the reserve shapes
        (``reserves``), as counted."""
        self._gpus: dict[str, int] = {}
        """The most GPUs a node of each model has, as the reserve shapes were sized."""

    def __len__(self) -> int:
        """Nodes counted."""
        return len(self._states)

    def counts(self) -> tuple[tuple[Shape, float], ...]:
        """Copies of each workload shape, then of each rare multi-GPU shape, then of each
        reserve shape, the counted nodes can still host."""
        if self._workload_version != self.workload.version:
            self._recount()
        return tuple(
            (shape, round(total, 6))
            for (shape, _), total in zip(self._shapes, self._totals, strict=True)
        )

    def update(self, name: Hashable, state: State | None) -> None:
        """Node ``name`` is now in ``state`` (None: no longer in the cluster)."""
        old = self._states.pop(name, None)
        if state is not None:
            self._states[name] = state
        if old == state:
            return
        self._dirty = True
        if state is not None and len(state[0]) > self._gpus.get(state[2], 0):
            self._workload_version = -1  # a model or a larger node: resize the reserves
        if self._workload_version != self.workload.version:
            return  # everything is recounted at the next ``prices``
        if old is not None:
            self._add(old, -1)
        if state is not None:
            self._add(state, +1)

    def clear(self) -> None:
        """Forget every node (the caller starts over)."""
        self._states.clear()
        self._workload_version = -1
        self._dirty = True

    def prices(self) -> Prices:
        """The current prices (recomputed only after a change)."""
        if self._workload_version != self.workload.version:
            self._recount()
        if not self._dirty:
            return self._prices
        self._dirty = False
        mean = sum(p * s.count * s.per_gpu for s, p in self.workload.top())
        future = self._idle / mean if mean > 0 else 0.0
        priced: list[tuple[Shape, float]] = []
        for (shape, p), supply in zip(self._shapes, self._totals, strict=True):
            if not priceable(shape):
                continue
            price = rounded(shortage(p * future, round(supply, 6)))  # sums of +-floats drift
            if price > 0.0:
                priced.append((shape, price))
        shapes = tuple(priced)
        if shapes != self._prices.shapes:
            self._prices = Prices(shapes, self._prices.version + 1)
        return self._prices

    def _recount(self) -> None:
        self._workload_version = self.workload.version
        self._memo.clear()
        gpus: dict[str, int] = {}
        for free, _, model in self._states.values():
            gpus[model] = max(gpus.get(model, 0), len(free))
        self._gpus = gpus
        self._shapes = (
            *self.workload.top(),
            *self.workload.rare(),
            *reserves(self.workload.restricted(), gpus),
        )
        self._totals = [0.0] * len(self._shapes)
        self._idle = 0
        for state in self._states.values():
            self._add(state, +1)

    def _add(self, state: State, sign: int) -> None:
        vector = self._memo.get(state)
        if vector is None:
            if len(self._memo) >= self.memo_limit:
                self._memo.clear()
            free, cpu, model = state
            vector = tuple(hosts(free, cpu, model, shape) for shape, _ in self._shapes)
            self._memo[state] = vector
        totals = self._totals
        for i, value in enumerate(vector):
            totals[i] += sign * value
        self._idle += sign * sum(free for free in state[0] if free > 0)
