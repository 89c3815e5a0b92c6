"""Extender latency at scale, in-process: filter + prioritize + bind per pod.

Builds N nodes x 8 GPUs (15 GiB each) in the in-memory API, schedules P pods of mixed sizes
through the real FastAPI app over ASGI, and prints the per-pod latency next to a reference
measured in the same run (a GET /healthz round trip through the same ASGI stack), because this
machine is noisy and only ratios compare across runs.

    .venv/bin/python benchmarks/extender_latency.py [--nodes 1000] [--pods 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

import httpx
from rich.progress import Progress

from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import Mode
from gpushare.extender.app import create_app
from gpushare.extender.driver import ExtenderDriver
from gpushare.extender.service import Extender
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod


async def in_memory_extender(nodes: int) -> tuple[MemoryKube, list[str], Extender]:
    """N nodes of eight 15 GiB GPUs (cgpu) in the in-memory API, and an extender that has
    listed them."""
    kube = MemoryKube()
    names = [f"node-{i:05d}" for i in range(nodes)]
    for name in names:
        kube.put_node(gpu_node(name, gpus_units=[15] * 8, mode=Mode.CGPU))
    settings = Settings()
    cache = ClusterCache(kube, settings=settings)
    await cache.sync()
    return kube, names, Extender(api=kube, cache=cache, scheduler=Scheduler(settings))


async def main(nodes: int, pods: int) -> None:
    kube, names, extender = await in_memory_extender(nodes)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(extender)), base_url="http://x"
    )
    driver = ExtenderDriver(client)
    rng = random.Random(7)
    reference = []
    for _ in range(200):
        start = time.perf_counter()
        await client.get("/healthz")
        reference.append(time.perf_counter() - start)
    latencies = []
    bound = 0
    with Progress() as progress:
        task = progress.add_task("scheduling", total=pods)
        for i in range(pods):
            pod = kube.create_pod(gpu_pod(f"p{i}", mem=rng.choice([1, 2, 3, 4, 6, 8, 12])))
            start = time.perf_counter()
            outcome = await driver.schedule(pod, names)
            latencies.append(time.perf_counter() - start)
            bound += outcome.bound
            # apply the watch events synchronously, as the cache would
            extender.cache.state.ledger.observe(await kube.get_pod("default", f"p{i}"))
            progress.advance(task)
    await client.aclose()
    ref = statistics.median(reference)
    med = statistics.median(latencies)
    print(f"nodes={nodes} gpus={nodes * 8} pods={pods} bound={bound}")
    print(f"reference GET /healthz median: {ref * 1e3:.3f} ms")
    print(
        f"filter+prioritize+bind median: {med * 1e3:.2f} ms "
        f"(p95 {sorted(latencies)[int(0.95 * len(latencies))] * 1e3:.2f} ms), "
        f"{med / ref:.0f}x the reference, {1 / med:.0f} pods/s"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=2000)
    args = parser.parse_args()
    asyncio.run(main(args.nodes, args.pods))
