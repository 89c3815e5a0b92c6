"""A built-in cluster and workloads: one shaped like the openb trace, and stress workloads.

The default workload follows the trace's published statistics (BENCHMARKS.md): about 13 %
CPU-only pods, 38 % fractional pods whose sizes are dominated by 810, 470 and 320 milli-GPU, 48 %
one whole GPU and 1 % with 2-8 GPUs; requests total about 98 % of GPU capacity. Nodes mix 8-GPU
and 2-GPU machines with the trace's CPU per GPU. Deterministic for a given seed.

The stress workloads (``WORKLOADS``) keep that cluster and change one property of the pods at a
time, so that a policy tuned to openb's mix shows where it stops being robust:

- ``multigpu``: 35 % of pods ask for 2 to 8 whole GPUs (openb: 1 %), 2 and 4 GPUs most often,
  odd counts included. That is about three quarters of the GPU request volume: whole free GPUs,
  not free shares, become what runs out, and a policy must keep 8-GPU nodes whole for 8-GPU pods
  while 3- and 6-GPU pods leave odd remainders. The CPU-only share drops to 10 % and the rest
  is split between fractional (25 %) and one-GPU (30 %) pods, in openb's proportions.
- ``models``: half of the GPU pods accept only one or two GPU models (openb: under 10 %, and
  one model each). The models are drawn in proportion to the cluster's GPUs of each model, so
  every model is asked for about as much as it holds: the stress is where restricted pods land
  (a policy that fills the G2 nodes with unrestricted pods leaves G2-only pods nowhere), not
  models asked beyond their capacity, which no policy could fix.
- ``cpuheavy``: every pod asks 4 to 32 cores (openb-like: 2 to 16), about twice the CPU per GPU,
  so the pods arrived at 100 % of GPU capacity ask about 110 % of the cluster's CPU. The 8-GPU
  G2 nodes have 12 cores per GPU: CPU runs out there before their GPUs, while T4 nodes (52 cores
  per GPU) keep CPU to spare; a policy must see idle GPUs losing their CPU.
- ``mixed``: all three at once, with the multi-GPU and restricted shares reduced (20 % and
  30 %) so that no single property dominates.

A ``Mix`` holds the knobs; a bad knob is a ``MixError`` naming the field, the value, the rule
and what to do.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from gpushare.sim.openb import MILLI_PER_GPU, TraceNode, TracePod

NODE_KINDS = (
    # (model, count, milli-CPU, memory MiB, GPUs)
    ("G2", 40, 96_000, 786_432, 8),
    ("T4", 30, 104_000, 393_216, 2),
    ("G3", 6, 128_000, 786_432, 8),
    ("P100", 8, 64_000, 262_144, 2),
    ("V100M32", 6, 96_000, 393_216, 4),
)

FRACTIONAL_SIZES = (
    (810, 35),
    (470, 24),
    (320, 11),
    (230, 5),
    (500, 5),
    (370, 4),
    (600, 4),
    (160, 3),
    (220, 3),
    (700, 3),
    (110, 2),
    (900, 1),
)
"""milli-GPU sizes of fractional pods with their weights (% of fractional pods)."""

MEMORY_MIB = (8_192, 16_384, 32_768, 49_152, 65_536)
"""Memory requests, drawn uniformly."""


class MixError(ValueError):
    """A workload knob that cannot describe a workload, with the field, the rule and the fix."""


@dataclass(frozen=True)
class Mix:
    """What kinds of pods a synthetic workload holds, in shares of its pods.

    One-GPU whole pods take the share left after ``cpu_only``, ``fractional`` and
    ``multi_gpu``. The defaults are the openb-like workload.
    """

    cpu_only: float = 0.13
    """Share of pods without a GPU."""
    fractional: float = 0.38
    """Share of pods with part of one GPU (sizes from ``FRACTIONAL_SIZES``)."""
    multi_gpu: float = 0.01
    """Share of pods with several whole GPUs."""
    multi_sizes: tuple[int, ...] = (2, 4, 8)
    """GPU counts of multi-GPU pods, drawn uniformly (repeat a count to weight it)."""
    restricted: float = 0.10
    """Share of GPU pods that accept only some GPU models."""
    models_per_pod: tuple[int, ...] = (1,)
    """How many models a restricted pod accepts, drawn uniformly."""
    by_capacity: bool = False
    """Draw restricted models in proportion to the cluster's GPUs of each model (else
    uniformly among the models)."""
    cpu_milli: tuple[int, ...] = (2_000, 4_000, 6_000, 8_000, 12_000, 16_000)
    """Milli-CPU of a pod, drawn uniformly; a multi-GPU pod asks ``count // 2`` times that."""

    def __post_init__(self) -> None:
        for name in ("cpu_only", "fractional", "multi_gpu", "restricted"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise MixError(
                    f"{name}={value!r}: a share of pods must be between 0 and 1; "
                    f"give e.g. {getattr(Mix, name)!r}"
                )
        taken = self.cpu_only + self.fractional + self.multi_gpu
        if taken > 1.0 + 1e-9:
            raise MixError(
                f"cpu_only + fractional + multi_gpu = {taken:.3g}: the shares must total at most "
                "1 (one-GPU pods take the rest); lower one of them"
            )
        if not self.multi_sizes or any(not 2 <= n <= 64 for n in self.multi_sizes):
            raise MixError(
                f"multi_sizes={self.multi_sizes!r}: a multi-GPU pod asks for 2 to 64 GPUs and "
                "at least one count is needed; give e.g. (2, 4, 8)"
            )
        if not self.models_per_pod or any(n < 1 for n in self.models_per_pod):
            raise MixError(
                f"models_per_pod={self.models_per_pod!r}: a restricted pod accepts at least one "
                "model and at least one count is needed; give e.g. (1, 2)"
            )
        if not self.cpu_milli or any(c <= 0 for c in self.cpu_milli):
            raise MixError(
                f"cpu_milli={self.cpu_milli!r}: every pod asks for some CPU and at least one "
                "value is needed; give positive milli-CPU such as (2000, 8000)"
            )


DEFAULT = Mix()
"""The openb-like workload."""

STRESS_MULTI_SIZES = (2, 2, 2, 2, 3, 4, 4, 4, 6, 8, 8)
"""2 to 8 GPUs, powers of two most often (as jobs ask), odd counts less often."""
STRESS_CPU_MILLI = (4_000, 8_000, 12_000, 16_000, 24_000, 32_000)
"""About twice the default CPU per pod (mean 16 cores instead of 8)."""

WORKLOADS: dict[str, Mix] = {
    "default": DEFAULT,
    "multigpu": Mix(cpu_only=0.10, fractional=0.25, multi_gpu=0.35, multi_sizes=STRESS_MULTI_SIZES),
    "models": Mix(restricted=0.5, models_per_pod=(1, 2), by_capacity=True),
    "cpuheavy": Mix(cpu_milli=STRESS_CPU_MILLI),
    "mixed": Mix(
        cpu_only=0.10,
        fractional=0.30,
        multi_gpu=0.20,
        multi_sizes=STRESS_MULTI_SIZES,
        restricted=0.30,
        models_per_pod=(1, 2),
        by_capacity=True,
        cpu_milli=STRESS_CPU_MILLI,
    ),
}
"""Named workloads: the openb-like default and the stress workloads (module docstring)."""

STRESS = ("multigpu", "models", "cpuheavy", "mixed")
"""The stress workloads' names, in the order reports list them."""


def workload(name: str) -> Mix:
    """The named workload's mix."""
    mix = WORKLOADS.get(name)
    if mix is None:
        raise MixError(
            f"workload={name!r} is not known: the synthetic workloads are "
            f"{', '.join(WORKLOADS)}; pick one of them or build a Mix"
        )
    return mix


def nodes() -> list[TraceNode]:
    """The built-in cluster: 90 nodes, 468 GPUs."""
    out = []
    for model, count, cpu, mem, gpus in NODE_KINDS:
        for i in range(count):
            out.append(TraceNode(f"{model.lower()}-{i:03d}", cpu, mem, gpus, model))
    return out


def pods(
    cluster: list[TraceNode], *, seed: int = 0, fill: float = 0.98, mix: Mix = DEFAULT
) -> list[TracePod]:
    """Pods of the mix whose GPU requests total ``fill`` of the cluster's GPU capacity."""
    if not 0.0 < fill < math.inf:
        raise MixError(
            f"fill={fill!r}: the pods' GPU request is a positive, finite share of the "
            "cluster's GPU capacity; give e.g. 0.98"
        )
    _check_cluster(cluster, mix)
    rng = random.Random(seed)
    capacity = sum(n.gpus for n in cluster) * MILLI_PER_GPU
    sizes = [s for s, _ in FRACTIONAL_SIZES]
    weights = [w for _, w in FRACTIONAL_SIZES]
    models = sorted({n.model for n in cluster})
    pool = _capacity_pool(cluster) if mix.by_capacity else models
    fractional_below = mix.cpu_only + mix.fractional
    whole_below = 1.0 - mix.multi_gpu
    out: list[TracePod] = []
    total = 0
    while True:
        kind = rng.random()
        cpu = rng.choice(mix.cpu_milli)
        mem = rng.choice(MEMORY_MIB)
        if kind < mix.cpu_only:
            num_gpu, milli = 0, 0
        elif kind < fractional_below:
            num_gpu, milli = 1, rng.choices(sizes, weights)[0]
        elif kind < whole_below:
            num_gpu, milli = 1, MILLI_PER_GPU
        else:
            num_gpu, milli = rng.choice(mix.multi_sizes), MILLI_PER_GPU
            cpu *= num_gpu // 2 or 1
        spec = _spec(rng, mix, pool) if num_gpu and rng.random() < mix.restricted else ()
        if total + num_gpu * milli > fill * capacity:
            break
        total += num_gpu * milli
        out.append(TracePod(f"syn-{len(out):05d}", cpu, mem, num_gpu, milli, spec))
    return out


def _spec(rng: random.Random, mix: Mix, pool: list[str]) -> tuple[str, ...]:
    """Distinct models drawn from the pool (one draw for one model, as the default always did)."""
    count = (
        mix.models_per_pod[0] if len(mix.models_per_pod) == 1 else rng.choice(mix.models_per_pod)
    )
    chosen: set[str] = set()
    while len(chosen) < count:
        chosen.add(rng.choice(pool))
    return tuple(sorted(chosen))


def _capacity_pool(cluster: list[TraceNode]) -> list[str]:
    """Each model once per GPU of it: a uniform draw from this is weighted by capacity."""
    return [n.model for n in sorted(cluster, key=lambda n: n.model) for _ in range(n.gpus)]


def _check_cluster(cluster: list[TraceNode], mix: Mix) -> None:
    """The cluster must have GPUs, and the models a restricted pod names (else no end).

    A multi-GPU pod wider than every node is allowed: it fails in the replay, as such a pod of
    a trace does.
    """
    gpu_nodes = [n for n in cluster if n.gpus]
    if not gpu_nodes:
        raise MixError("cluster: no node has a GPU; give nodes with GPUs (e.g. nodes())")
    distinct = len({n.model for n in gpu_nodes})
    if mix.restricted and max(mix.models_per_pod) > distinct:
        raise MixError(
            f"models_per_pod={mix.models_per_pod!r}: the cluster has {distinct} GPU model(s); "
            f"keep the counts at most {distinct}"
        )
