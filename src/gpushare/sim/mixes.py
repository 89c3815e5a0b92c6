"""Multi-GPU-heavy workload mixes built from a trace, reproducibly by seed.

The openb default trace puts about 7 % of its GPU demand in pods that take 2, 4 or 8 whole
GPUs. Clusters that train more carry far more, and the FGD paper's published variants raised
that share to 20-50 %. ``multigpu_mix`` rebuilds such a mix from any trace: every pod of the
trace is kept, and its whole-GPU multi-GPU pods are drawn again with replacement (a
``random.Random(seed)``) until they carry ``share`` of the mix's GPU demand, counted in
milli-GPU. The other pods keep their number and their proportions, so the one-GPU and
fractional part of the mix is the trace's own.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from gpushare.sim.openb import MILLI_PER_GPU, TracePod

SHARES = (0.2, 0.3, 0.4, 0.5)
"""The multi-GPU shares of GPU demand ``benchmarks/policy_table.py --mixes`` builds."""


def is_multigpu(pod: TracePod) -> bool:
    """A pod that takes two or more whole GPUs."""
    return pod.num_gpu >= 2 and pod.gpu_milli == MILLI_PER_GPU


def multigpu_share(pods: Sequence[TracePod]) -> float:
    """The share of GPU demand (milli-GPU) that whole-GPU multi-GPU pods carry."""
    total = sum(p.gpu_request_milli for p in pods)
    multi = sum(p.gpu_request_milli for p in pods if is_multigpu(p))
    return multi / total if total else 0.0


def multigpu_mix(pods: Sequence[TracePod], share: float, *, seed: int = 0) -> list[TracePod]:
    """The trace with its multi-GPU pods resampled to carry ``share`` of the GPU demand.

    Multi-GPU pods are drawn from the trace's own until their demand first reaches ``share``
    of the whole; clones get the name of their model with ``-m<k>`` appended. The result is
    in the trace's order, the drawn pods after it (the protocol shuffles per run seed anyway).
    """
    if not 0.0 < share < 1.0:
        raise ValueError(f"share={share!r} must lie strictly between 0 and 1 (0.3 = 30 %)")
    multi = [p for p in pods if is_multigpu(p)]
    rest = [p for p in pods if not is_multigpu(p)]
    if not multi:
        raise ValueError("the trace has no pod with 2 or more whole GPUs to resample")
    rest_demand = sum(p.gpu_request_milli for p in rest)
    target = share / (1.0 - share) * rest_demand
    rng = random.Random(seed)
    drawn: list[TracePod] = []
    demand = 0
    while demand < target:
        model = multi[rng.randrange(len(multi))]
        drawn.append(replace(model, name=f"{model.name}-m{len(drawn)}"))
        demand += model.gpu_request_milli
    return rest + drawn
