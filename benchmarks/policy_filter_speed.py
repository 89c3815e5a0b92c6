"""One filter under a big ResourcePolicy, in-process: its time and the size of its reply.

Builds N GPU nodes (all in pool ``gpu``) in the in-memory API and a ResourcePolicy whose U
units each select a pool no node is in, so every node fits the pod and every unit must be
looked at: the worst case for the policy gate. Prints the time of one ``filter`` (the
``nodeCacheCapable`` path kube-scheduler uses, names in and out), best of a few, and the bytes
of its JSON reply, next to the same filter for a pod no policy orders, measured in the same run
(this machine is noisy: compare the ratio). ``--elsewhere P`` first binds P plain pods in 50
other namespaces: a policy counts only its own namespace's pods.

    .venv/bin/python benchmarks/policy_filter_speed.py [--nodes 5000] [--units 100 1000]
        [--elsewhere 40000]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.resourcepolicies.policybook import PolicyBook
from gpushare.extender.service import Extender
from gpushare.extender.wire import ExtenderArgs, filter_json
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from gpushare.kube.policies import PolicyWatch


def policy(units: int) -> dict[str, Any]:
    """A policy of ``units`` units, none of which holds a node."""
    return {
        "metadata": {"name": "big", "namespace": "crowded"},
        "spec": {
            "selector": {"app": "big"},
            "units": [
                {"resource": "ecs", "nodeSelector": {"pool": f"none-{i}"}} for i in range(units)
            ],
        },
    }


async def measure(
    nodes: int, units: int, repeat: int, elsewhere: int = 0
) -> tuple[float, int, float, int]:
    """Best filter time (s) and reply bytes under the policy, then for a pod without one."""
    kube = MemoryKube()
    names = [f"node-{i:05d}" for i in range(nodes)]
    for name in names:
        node = gpu_node(name, gpus_units=[16])
        node["metadata"].setdefault("labels", {})["pool"] = "gpu"
        kube.put_node(node)
    for i in range(elsewhere):
        meta = {"name": f"bound-{i}", "namespace": f"ns-{i % 50}"}
        spec = {"nodeName": names[i % nodes], "containers": [{"name": "main"}]}
        kube.create_pod({"metadata": meta, "spec": spec, "status": {"phase": "Running"}})
    settings = Settings()
    book = PolicyBook()
    cache = ClusterCache(kube, settings=settings, book=book)
    await cache.sync()
    kube.put_resource_policy(policy(units))
    await PolicyWatch(kube, book).sync()
    extender = Extender(api=kube, cache=cache, scheduler=Scheduler(settings))
    ordered = gpu_pod("ordered", mem=4, namespace="crowded")
    ordered["metadata"]["labels"] = {"app": "big"}
    other = gpu_pod("other", mem=4, namespace="elsewhere")
    figures = []
    for pod in (ordered, other):
        args = ExtenderArgs(Pod=pod, NodeNames=names)
        best, size = float("inf"), 0
        for _ in range(repeat):
            start = time.perf_counter()
            reply = filter_json(extender.filter(args))
            best = min(best, time.perf_counter() - start)
            size = len(reply)
        figures += [best, size]
    await extender.events.drain()
    return figures[0], int(figures[1]), figures[2], int(figures[3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--units", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--elsewhere", type=int, default=0)
    opts = parser.parse_args()
    head = ("nodes", "units", "filter s", "reply bytes", "no policy s", "bytes")
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, (6, 6, 9, 12, 12, 9), strict=True)))
    for units in opts.units:
        t, size, t0, size0 = asyncio.run(measure(opts.nodes, units, opts.repeat, opts.elsewhere))
        print(f"{opts.nodes:>6} {units:>6} {t:>9.4f} {size:>12,} {t0:>12.4f} {size0:>9,}")


if __name__ == "__main__":
    main()
