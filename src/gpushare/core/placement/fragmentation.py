"""GPU fragmentation measured against the workload expected next (the FGD paper's measure).

Free GPU share on a node is a *fragment* for a pod shape when that shape cannot use it: all of
the node's idle share if the shape cannot run there at all (CPU short, model excluded, not enough
GPUs with room, or a CPU-only shape), otherwise the idle share of the GPUs too small for the
shape's per-GPU need. A node's fragmentation is the expectation over the target workload.

That test asks whether *one* more pod of the shape fits. With ``copies`` the measure asks how
much idle share *as many pods of the shape as the node can hold* would use: a node with four
idle GPUs and CPU for two one-GPU pods strands two GPUs, which the one-pod test calls usable.
On the openb traces CPU binds on the 8-GPU nodes (12 cores per GPU), and counting copies is what
lets a policy see idle GPUs losing their CPU before the last one is gone.

Everything is in the caller's unit (milli-GPU for the paper's trace, memory units for gpushare),
so the simulator and the extender share one definition.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate


@dataclass(frozen=True, slots=True)
class Shape:
    """A pod shape of the target workload."""

    cpu: int
    """Milli-CPU (0 when the caller does not track CPU)."""
    per_gpu: int
    """Share needed on each GPU, in the node's unit; 0 for a CPU-only shape."""
    count: int
    """How many GPUs."""
    models: tuple[str, ...] = ()
    """GPU models the shape accepts; empty means any."""


Workload = tuple[tuple[Shape, float], ...]
"""Shapes with their probabilities (summing to 1)."""


@dataclass(frozen=True, slots=True)
class Restriction:
    """The pods seen that accept only some GPU models, pooled over their shapes."""

    models: tuple[str, ...]
    """The models they accept."""
    fraction: float
    """Their share of all the pods seen."""
    per_gpu: int
    """The largest share per GPU any of them asked for."""


def fragmentation(
    free: Sequence[int],
    cpu_free: int,
    model: str,
    workload: Workload,
    *,
    cpu_weight: float = 0.0,
    copies: bool = False,
) -> float:
    """Expected idle share on a node that the next pod could not use.

    With ``cpu_weight`` > 0, idle CPU that a shape cannot use because the node's GPUs cannot
    host it (wrong model, too little GPU share) counts too, at ``cpu_weight`` GPU units per
    milli-CPU: when CPU binds, CPU stranded beside full GPUs is lost capacity as well.
    With ``copies`` a shape that fits counts what its copies would leave (``unused_by_copies``).
    """
    idle = sum(free)
    total = 0.0
    roomiest = _Roomiest(free) if copies else None
    for shape, weight in workload:
        if shape.count == 0 or shape.per_gpu == 0:
            total += weight * idle
            continue
        if shape.models and model not in shape.models:
            total += weight * (idle + cpu_weight * cpu_free)
            continue
        if roomiest is not None:
            total += weight * roomiest.unused(cpu_free, shape)
            continue
        fitting = 0
        stranded = 0
        for share in free:
            if share >= shape.per_gpu:
                fitting += 1
            else:
                stranded += share
        if fitting < shape.count:
            total += weight * (idle + cpu_weight * cpu_free)
        elif cpu_free < shape.cpu:
            total += weight * idle
        else:
            total += weight * stranded
    return total


def unused_by_copies(free: Sequence[int], cpu_free: int, shape: Shape) -> float:
    """Idle share left unused after placing as many copies of a GPU shape as the node holds.

    A copy needs ``count`` GPUs with room for ``per_gpu`` and the shape's CPU. Copies go to the
    roomiest fitting GPUs, one GPU set each, and a GPU that hosts a copy counts as used whole,
    as in the one-pod test. GPUs bound the copies in whole numbers; CPU bounds them by
    ``cpu_free / cpu``, fractions included: CPU for 2.5 copies uses two GPU sets and half of
    the next, CPU for half a copy half of one. The fraction stands for the pods of lighter
    shapes that could still use that CPU, and it makes every milli-CPU spent count before
    the next whole copy is lost (on the openb default trace about 0.1 point better than
    whole copies, and about 0.07 better than counting all idle share below one copy's CPU).
    When the copies cover every fitting GPU this equals the one-pod value; with CPU for at
    least one copy it is never smaller.
    """
    return _Roomiest(free).unused(cpu_free, shape)


def copies(free: Sequence[int], cpu_free: int, model: str, shape: Shape) -> float:
    """How many pods of a shape the node can still host, counted as ``unused_by_copies`` counts
    them (GPU sets whole, CPU fractionally); 0 for a CPU-only shape or an excluded model."""
    if shape.count == 0 or shape.per_gpu == 0 or (shape.models and model not in shape.models):
        return 0.0
    ascending = sorted(free)
    return _room(len(ascending) - bisect_left(ascending, shape.per_gpu), cpu_free, shape)


def _room(fitting: int, cpu_free: int, shape: Shape) -> float:
    """Copies of a GPU shape over ``fitting`` GPUs with room: whole sets, CPU fractionally."""
    room: float = fitting // shape.count
    if shape.cpu > 0:
        room = min(room, cpu_free / shape.cpu)
    return max(0.0, room)


class _Roomiest:
    """A node's free shares, roomiest first, with prefix sums: each shape costs a bisection."""

    __slots__ = ("ascending", "idle", "prefix")

    def __init__(self, free: Sequence[int]) -> None:
        descending = sorted(free, reverse=True)
        self.idle = sum(descending)
        self.ascending = descending[::-1]
        self.prefix = [0, *accumulate(descending)]

    def unused(self, cpu_free: int, shape: Shape) -> float:
        # ``_room`` inline: this runs for every shape of every node state scored
        room: float = (
            len(self.ascending) - bisect_left(self.ascending, shape.per_gpu)
        ) // shape.count
        if shape.cpu > 0:
            room = min(room, cpu_free / shape.cpu)
        if room <= 0:
            return self.idle
        whole = int(room)
        used: float = self.prefix[whole * shape.count]
        if room > whole:
            end = min(len(self.prefix) - 1, (whole + 1) * shape.count)
            used += (room - whole) * (self.prefix[end] - self.prefix[whole * shape.count])
        return self.idle - used


def fgd_score(growth: float, scale: float, *, truncate: bool = True) -> float:
    """The paper's node score, 0..100: ``100 * sigmoid(-growth / scale)``.

    ``scale`` is one GPU in the caller's unit (1000 milli-GPU). The paper truncates to an
    integer, which turns small differences into ties.
    """
    value = 100.0 / (1.0 + math.exp(min(700.0, growth / scale)))
    return float(math.floor(value)) if truncate else value


class WorkloadEstimate:
    """The target workload learned online from the pods seen so far.

    The most frequent shapes are kept until they cover ``coverage`` of the pods seen, and
    their frequencies are renormalised. ``top`` is recomputed every ``refresh`` observations so
    that callers can cache per-node values between refreshes (``version`` says when). With
    ``settle`` > 0 the interval grows to ``settle`` x the pods seen: the estimate changes less
    as it grows, while every refresh makes every cached per-node score stale.
    """

    def __init__(self, *, coverage: float = 0.95, refresh: int = 100, settle: float = 0.0) -> None:
        if not 0.0 < coverage <= 1.0:
            raise ValueError(f"coverage={coverage} must be in (0, 1]")
        if refresh < 1:
            raise ValueError(f"refresh={refresh} must be at least 1")
        if not 0.0 <= settle <= 1.0:
            raise ValueError(f"settle={settle} must be in [0, 1]")
        self.coverage = coverage
        self.refresh = refresh
        self.settle = settle
        self.version = 0
        self._counts: dict[Shape, int] = {}
        self._seen = 0
        self._since = 0
        self._top: Workload = ()
        self._restricted: tuple[Restriction, ...] = ()
        self._rare: Workload = ()

    @classmethod
    def of(cls, shapes: Sequence[Shape], *, coverage: float = 0.95) -> WorkloadEstimate:
        """An estimate fixed from a known list of pod shapes (the paper's offline M)."""
        estimate = cls(coverage=coverage, refresh=max(1, len(shapes)))
        for shape in shapes:
            estimate._counts[shape] = estimate._counts.get(shape, 0) + 1
        estimate._seen = len(shapes)
        estimate._recompute()
        return estimate

    @property
    def seen(self) -> int:
        """How many pods were observed."""
        return self._seen

    def observe(self, shape: Shape) -> None:
        """Count one arriving pod; refresh the top shapes now and then."""
        self._counts[shape] = self._counts.get(shape, 0) + 1
        self._seen += 1
        self._since += 1
        interval = max(self.refresh, int(self.settle * self._seen))
        if self._since >= interval or not self._top:
            self._recompute()

    def top(self) -> Workload:
        """The current target workload."""
        return self._top

    def restricted(self) -> tuple[Restriction, ...]:
        """Every model set pods were restricted to, rare shapes included (``top`` drops
        them), refreshed with ``top``."""
        return self._restricted

    def rare(self) -> Workload:
        """The multi-GPU shapes seen that ``top`` leaves out, with their share of all the pods
        seen, refreshed with ``top``: too rare to weigh in fragmentation, yet each needs several
        GPUs of one node at once (``core.placement.scarcity`` prices their last homes)."""
        return self._rare

    def _recompute(self) -> None:
        self._since = 0
        pooled: dict[tuple[str, ...], tuple[int, int]] = {}
        for shape, count in self._counts.items():
            if shape.models and shape.per_gpu > 0:
                pods, per_gpu = pooled.get(shape.models, (0, 0))
                pooled[shape.models] = (pods + count, max(per_gpu, shape.per_gpu))
        self._restricted = tuple(
            Restriction(models, pods / self._seen, per_gpu)
            for models, (pods, per_gpu) in sorted(pooled.items())
        )
        ranked = sorted(self._counts.items(), key=lambda kv: (-kv[1], _order(kv[0])))
        chosen: list[tuple[Shape, int]] = []
        covered = 0
        for shape, count in ranked:
            if covered >= self.coverage * self._seen:
                break
            chosen.append((shape, count))
            covered += count
        total = sum(count for _, count in chosen)
        self._top = tuple((shape, count / total) for shape, count in chosen) if total else ()
        kept = {shape for shape, _ in chosen}
        self._rare = tuple(
            (shape, count / self._seen)
            for shape, count in ranked
            if shape not in kept and shape.count > 1 and shape.per_gpu > 0
        )
        self.version += 1


def _order(shape: Shape) -> tuple[int, int, int, tuple[str, ...]]:
    """A stable order among equally frequent shapes."""
    return (shape.cpu, shape.per_gpu, shape.count, shape.models)
