"""Count what hostile objects do to the extender: raised watch events and 5xx replies.

Every field and annotation gpushare reads (``harness/hostile.py``) is set to hostile values, a
seeded sample of them, and each object goes through the cache as a watch event and through
``/filter`` and ``/prioritize`` as a body; hostile names go to ``/bind``. It prints how many
watch events raised out of the cache (each one would end a real watch) and how many replies
were 5xx, with the places that raised. Run it against another checkout's source with
``PYTHONPATH=<that>/src`` for a before/after pair.

    python benchmarks/hostile_input.py [--objects 400] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import logging
import random
import sys
import traceback
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.extender.app import create_app
from gpushare.extender.service import Extender
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from gpushare.kube.port import WatchEvent
from harness.hostile import NODE_PATHS, POD_PATHS, mutated, mutations

NODE = "gpu-node"
BIND_NAMES = ("../../../nodes/gpu-node", "x?dryRun=All", "x/status", "", "a" * 300, "p")


def _where(err: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "gpushare" in f.filename]
    frame = frames[-1] if frames else traceback.extract_tb(err.__traceback__)[-1]
    return f"{type(err).__name__} at {frame.filename.split('src/')[-1]}:{frame.lineno}"


def _extender() -> tuple[ClusterCache, httpx.AsyncClient]:
    """An extender over an in-memory cluster of one 2 x 15 GiB node, reached through ASGI;
    an exception in the app is a 500, as uvicorn would answer."""
    kube = MemoryKube()
    kube.put_node(gpu_node(NODE, gpus_units=[15, 15]))
    settings_ = Settings()
    scheduler = Scheduler(settings_)
    cache = ClusterCache(kube, settings=settings_, workload=scheduler.workload)
    extender = Extender(api=kube, cache=cache, scheduler=scheduler)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(extender), raise_app_exceptions=False),
        base_url="http://x",
    )
    return cache, client


class Tally:
    def __init__(self) -> None:
        self.events = self.raised = self.requests = self.errors = 0
        self.places: collections.Counter[str] = collections.Counter()

    async def one(self, kind: str, obj: dict[str, Any]) -> None:
        cache, client = _extender()
        try:
            await cache.sync()
            self.events += 1
            try:
                if kind == "pod":
                    cache.apply_pod(WatchEvent("ADDED", obj))
                else:
                    cache.apply_node(WatchEvent("ADDED", obj))
            except Exception as err:
                self.raised += 1
                self.places[f"watch: {_where(err)}"] += 1
            try:
                text = json.dumps(obj, allow_nan=False)
            except ValueError:
                return
            if kind == "pod":
                body = f'{{"Pod": {text}, "NodeNames": ["{NODE}"]}}'
            else:
                body = (
                    f'{{"Pod": {json.dumps(gpu_pod("p", mem=1))}, "Nodes": {{"items": [{text}]}}}}'
                )
            for verb in ("filter", "prioritize"):
                self.requests += 1
                reply = await client.post(f"/{verb}", content=body.encode())
                if reply.status_code >= 500:
                    self.errors += 1
                    self.places[f"{verb}: HTTP {reply.status_code}"] += 1
        finally:
            await client.aclose()

    async def bind(self, name: str, namespace: str, node: str) -> None:
        _, client = _extender()
        body = {"PodName": name, "PodNamespace": namespace, "PodUID": "u", "Node": node}
        self.requests += 1
        try:
            reply = await client.post("/bind", json=body)
            accepted = reply.status_code == 200 and not reply.json().get("Error")
            if reply.status_code >= 500 or (accepted and name != "p"):
                self.errors += 1
                self.places[f"bind: {name!r} answered {reply.status_code}"] += 1
        finally:
            await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=400, help="hostile pods, and as many nodes")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    tally = Tally()
    run = settings(
        max_examples=args.objects,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    random.seed(args.seed)

    @run
    @given(mutations(POD_PATHS))
    def pods(changes: Any) -> None:
        asyncio.run(tally.one("pod", mutated(gpu_pod("hostile", mem=3), changes)))

    @run
    @given(mutations(NODE_PATHS))
    def nodes(changes: Any) -> None:
        asyncio.run(tally.one("node", mutated(gpu_node("hostile-node"), changes)))

    pods()
    print(f"pods done: {tally.events} events, {tally.requests} requests", file=sys.stderr)
    nodes()
    for name in BIND_NAMES:
        asyncio.run(tally.bind(name, "default", NODE))
    for namespace in ("default/pods/x", "a.b"):
        asyncio.run(tally.bind("p", namespace, NODE))
    result = {
        "watch_events": tally.events,
        "watch_events_raised": tally.raised,
        "requests": tally.requests,
        "requests_5xx_or_escaped": tally.errors,
    }
    print(json.dumps(result))
    for place, count in tally.places.most_common():
        print(f"{count:5d}  {place}")


if __name__ == "__main__":
    main()
