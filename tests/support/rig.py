"""An in-process extender over the in-memory API, reached through ASGI (no sockets)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.extender.app import create_app
from gpushare.extender.driver import ExtenderDriver
from gpushare.extender.service import Extender
from gpushare.kube.backoff import Backoff
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.port import KubeDict

T = TypeVar("T")


@dataclass
class Rig:
    kube: MemoryKube
    cache: ClusterCache
    extender: Extender
    client: httpx.AsyncClient
    driver: ExtenderDriver

    async def settle(self) -> None:
        for _ in range(50):
            await asyncio.sleep(0)

    async def post(self, verb: str, body: dict[str, Any]) -> Any:
        response = await self.client.post(f"/{verb}", json=body)
        assert response.status_code == 200, response.text
        return response.json()


@contextlib.asynccontextmanager
async def rig_for(kube: MemoryKube, settings: Settings | None = None) -> AsyncIterator[Rig]:
    settings = settings or Settings()
    scheduler = Scheduler(settings)
    backoff = Backoff(base_s=0.01, cap_s=0.01)
    cache = ClusterCache(kube, settings=settings, backoff=backoff, workload=scheduler.workload)
    extender = Extender(
        api=kube, cache=cache, scheduler=scheduler, clock_ns=lambda: 1700000000000000000
    )
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(extender)), base_url="http://extender"
    )
    task = asyncio.create_task(cache.run(extender.take))
    rig = Rig(kube, cache, extender, client, ExtenderDriver(client))
    await rig.settle()
    try:
        yield rig
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await client.aclose()


def run_with_rig(
    kube: MemoryKube, body: Callable[[Rig], Awaitable[T]], settings: Settings | None = None
) -> T:
    async def main() -> T:
        async with rig_for(kube, settings) as rig:
            return await body(rig)

    return asyncio.run(main())


def binding(pod: KubeDict, node: str) -> dict[str, str]:
    """Bind's body for a stored pod and a node."""
    meta = pod["metadata"]
    return {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": node,
    }


class ConflictOnce(MemoryKube):
    """Changes the pod between the extender's read and its binding, once."""

    def __init__(self) -> None:
        super().__init__()
        self.conflicts = 0

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str, **kwargs: Any) -> None:
        if self.conflicts == 0 and kwargs.get("resource_version"):
            self.conflicts += 1
            self.update_pod(namespace, name, message="touched by someone else")
        await super().bind_pod(namespace, name, uid, node, **kwargs)
