"""A built-in cluster and workload shaped like the openb trace, for runs without the trace files.

The proportions follow the trace's published statistics (BENCHMARKS.md): about 13 % CPU-only
pods, 38 % fractional pods whose sizes are dominated by 810, 470 and 320 milli-GPU, 48 % one
whole GPU and 1 % with 2-8 GPUs; requests total about 98 % of GPU capacity. Nodes mix 8-GPU and
2-GPU machines with the trace's CPU per GPU. Deterministic for a given seed.
"""

from __future__ import annotations

import random

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


def nodes() -> list[TraceNode]:
    """The built-in cluster: 90 nodes, 436 GPUs."""
    out = []
    for model, count, cpu, mem, gpus in NODE_KINDS:
        for i in range(count):
            out.append(TraceNode(f"{model.lower()}-{i:03d}", cpu, mem, gpus, model))
    return out


def pods(cluster: list[TraceNode], *, seed: int = 0, fill: float = 0.98) -> list[TracePod]:
    """Pods whose GPU requests total ``fill`` of the cluster's GPU capacity."""
    rng = random.Random(seed)
    capacity = sum(n.gpus for n in cluster) * MILLI_PER_GPU
    sizes = [s for s, _ in FRACTIONAL_SIZES]
    weights = [w for _, w in FRACTIONAL_SIZES]
    models = sorted({n.model for n in cluster})
    out: list[TracePod] = []
    total = 0
    while True:
        kind = rng.random()
        cpu = rng.choice((2_000, 4_000, 6_000, 8_000, 12_000, 16_000))
        mem = rng.choice((8_192, 16_384, 32_768, 49_152, 65_536))
        if kind < 0.13:
            num_gpu, milli = 0, 0
        elif kind < 0.51:
            num_gpu, milli = 1, rng.choices(sizes, weights)[0]
        elif kind < 0.99:
            num_gpu, milli = 1, MILLI_PER_GPU
        else:
            num_gpu, milli = rng.choice((2, 4, 8)), MILLI_PER_GPU
            cpu *= num_gpu // 2 or 1
        spec = (rng.choice(models),) if num_gpu and rng.random() < 0.1 else ()
        if total + num_gpu * milli > fill * capacity:
            break
        total += num_gpu * milli
        out.append(TracePod(f"syn-{len(out):05d}", cpu, mem, num_gpu, milli, spec))
    return out
