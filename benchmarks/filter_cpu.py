"""The extender's own CPU per GPU pod, in process: filter, bind and the watch events around them.

The staged benchmark on the real control plane (``throughput.py``) measures what kube-scheduler
gets, but its runs vary by a third from one to the next on this machine. This one drives the
same code without HTTP or another process, so a change to the decisions or the cache shows in
CPU time (``time.thread_time``), not in the noise of the cluster around it. Per step, as the
staged run's GPU stage does: one GPU pod of 1-12 GiB (``harness.staged.SIZES``) is filtered over
every node name and bound, the watch shows it added, bound and running; one plain pod (``100m``
CPU) is bound to a random node by "default-scheduler" and shown bound and running.

    python benchmarks/filter_cpu.py [--nodes 1000] [--pods 1500]
    PYTHONPATH=<another tree's src> python benchmarks/filter_cpu.py   # the same for that build

It prints the CPU of filter and of bind (median and mean per pod), of taking the watch events in
(per pod), and the nodes the GPU pods went to, which must not change when only speed does.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import random
import statistics
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from extender_latency import in_memory_extender

from gpushare.extender.wire import filter_json, read_args, read_binding_args
from gpushare.kube.objects import gpu_pod
from gpushare.kube.port import WatchEvent
from harness.staged import SIZES


def _running(pod: dict[str, Any], version: int) -> dict[str, Any]:
    """The pod as kubelet's first status update shows it."""
    shown = copy.deepcopy(pod)
    shown["metadata"]["resourceVersion"] = str(version)
    shown["status"] = {"phase": "Running", "containerStatuses": [{"name": "main", "ready": True}]}
    return shown


async def main(nodes: int, pods: int, seed: int) -> None:
    kube, names, extender = await in_memory_extender(nodes)
    gc.collect()
    gc.freeze()  # as the extender does once its cache has listed
    cache = extender.cache
    rng = random.Random(seed)
    filtering: list[float] = []
    binding: list[float] = []
    watching: list[float] = []
    touched: list[str] = []
    version = 10**6
    for i in range(pods):
        spec = gpu_pod(f"p{i:05d}", mem=rng.choice(SIZES))
        spec["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "100m"}
        pod = kube.create_pod(spec)
        body = msgspec.json.encode({"Pod": pod, "NodeNames": names})
        start = time.thread_time()
        extender.take(cache.apply_pod(WatchEvent(type="ADDED", object=copy.deepcopy(pod))))
        watched = time.thread_time() - start
        start = time.thread_time()
        answer = filter_json(extender.filter(read_args(body)))
        filtering.append(time.thread_time() - start)
        [node] = msgspec.json.decode(answer)["NodeNames"]
        meta = pod["metadata"]
        body = msgspec.json.encode(
            {
                "PodName": meta["name"],
                "PodNamespace": "default",
                "PodUID": meta["uid"],
                "Node": node,
            }
        )
        start = time.thread_time()
        result = await extender.bind(read_binding_args(body))
        binding.append(time.thread_time() - start)
        if result.Error:
            raise SystemExit(f"bind failed: {result.Error}")
        touched.append(node)
        bound = await kube.get_pod("default", meta["name"])
        plain = {
            "metadata": {
                "name": f"c{i:05d}",
                "namespace": "plain",
                "uid": f"plain-{i}",
                "resourceVersion": str(version),
            },
            "spec": {
                "nodeName": rng.choice(names),
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "100m"}}}],
            },
            "status": {"phase": "Pending"},
        }
        version += 4
        start = time.thread_time()
        for shown in (bound, _running(bound, version + 1), plain, _running(plain, version + 2)):
            extender.take(cache.apply_pod(WatchEvent(type="MODIFIED", object=shown)))
        watching.append(watched + time.thread_time() - start)
    ms = 1e3
    print(f"nodes={nodes} gpu pods={pods} plain pods={pods} seed={seed}")
    print(
        f"filter CPU per pod: median {statistics.median(filtering) * ms:.3f} ms, "
        f"mean {statistics.mean(filtering) * ms:.3f} ms"
    )
    print(
        f"bind CPU per pod: median {statistics.median(binding) * ms:.3f} ms, "
        f"mean {statistics.mean(binding) * ms:.3f} ms"
    )
    print(f"watch CPU per pod (6 events): mean {statistics.mean(watching) * ms:.3f} ms")
    digest = zlib.crc32(" ".join(touched).encode())
    print(f"nodes touched: {len(set(touched))}, placements digest {digest:08x}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.nodes, args.pods, args.seed))
