"""The FGD paper's arrival stream: shuffle by seed, then inflate with clones to 1.3x capacity.

For seed s the pod rows are shuffled; then clones drawn uniformly with replacement from the
original rows are appended until the next clone would push the cumulative GPU request above
``tune`` x the cluster's GPU capacity. Pods then arrive one at a time in that order.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from gpushare.sim.openb import MILLI_PER_GPU, TraceNode, TracePod


def capacity_milli(nodes: Sequence[TraceNode]) -> int:
    """GPU capacity of the cluster in milli-GPU."""
    return sum(n.gpus for n in nodes) * MILLI_PER_GPU


def arrival_stream(
    pods: Sequence[TracePod], nodes: Sequence[TraceNode], *, seed: int, tune: float = 1.3
) -> list[TracePod]:
    """The shuffled and inflated stream for one seed."""
    rng = random.Random(seed)
    stream = list(pods)
    rng.shuffle(stream)
    limit = tune * capacity_milli(nodes)
    total = sum(p.gpu_request_milli for p in stream)
    while True:
        clone = pods[rng.randrange(len(pods))]
        if total + clone.gpu_request_milli > limit:
            break
        stream.append(clone)
        total += clone.gpu_request_milli
    return stream
