"""The FGD paper's arrival stream: shuffle by seed, then inflate with clones to 1.3x capacity.

For seed s the pod rows are shuffled; then clones drawn uniformly with replacement from the
original rows are appended until the next clone would push the cumulative GPU request above
``tune`` x the cluster's GPU capacity. Pods then arrive one at a time in that order.

The request and the capacity are counted in milli-GPU unless the caller gives its own measure
(the gpu-mem mode counts units of memory as written, ``sim.gpumem.stream``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from gpushare.sim.openb import MILLI_PER_GPU, TraceNode, TracePod


def capacity_milli(nodes: Sequence[TraceNode]) -> int:
    """GPU capacity of the cluster in milli-GPU."""
    return sum(n.gpus for n in nodes) * MILLI_PER_GPU


def arrival_stream(
    pods: Sequence[TracePod],
    nodes: Sequence[TraceNode],
    *,
    seed: int,
    tune: float = 1.3,
    weight: Callable[[TracePod], float] | None = None,
    capacity: float | None = None,
) -> list[TracePod]:
    """The shuffled and inflated stream for one seed (``weight`` and ``capacity``: the measure)."""
    measure = weight or (lambda pod: pod.gpu_request_milli)
    rng = random.Random(seed)
    stream = list(pods)
    rng.shuffle(stream)
    limit = tune * (capacity_milli(nodes) if capacity is None else capacity)
    total = sum(measure(p) for p in stream)
    while True:
        clone = pods[rng.randrange(len(pods))]
        if total + measure(clone) > limit:
            break
        stream.append(clone)
        total += measure(clone)
    return stream
