"""Objects of one kind as last listed or watched: list, then watch, relist on expiry.

DRA mode's allocator follows gpushare's ResourceSlices, every ResourceClaim and the nodes
labelled for DRA mode this way (``extender.draallocator``), and the extender's ``/metrics`` and
``/inspect`` read the same objects. Each change bumps ``revision``, so a reader that built
something from the objects (the DRA ledger) knows whether it still holds, and sets ``changed``,
so the loop that reads them wakes. Each list and watch reports to the process's
``WatchHealth`` (``kube.watchhealth``): a refused one shows in ``/readyz`` and the
``*_watch_refused`` series, as the extender's own watches do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from gpushare.core.model.kubejson import KubeObject, name_of, namespace_of
from gpushare.kube.backoff import Backoff
from gpushare.kube.port import Gone, KubeDict, KubeError, WatchEvent
from gpushare.kube.watchhealth import WatchHealth

log = logging.getLogger(__name__)


class Listing(Protocol):
    """A list call: the objects and the list's ``resourceVersion``."""

    def __call__(self) -> Awaitable[tuple[list[KubeDict], str]]: ...


def key_of(obj: KubeObject) -> str:
    """``namespace/name`` (``/name`` for cluster-scoped objects)."""
    return f"{namespace_of(obj)}/{name_of(obj)}"


@dataclass
class Mirror:
    """Objects of one kind as last listed or watched, by ``namespace/name``."""

    resource: str
    """The resource as the API names it (``resourceclaims``), for logs and ``WatchHealth``."""
    listing: Listing
    watching: Callable[[str], AsyncIterator[WatchEvent]]
    changed: asyncio.Event
    objects: dict[str, KubeDict] = field(default_factory=dict)
    synced: bool = False
    backoff: Backoff = field(default_factory=Backoff)
    revision: int = 0
    """Counts every change to ``objects``, so a reader knows whether what it read still holds."""
    health: WatchHealth | None = None

    async def run(self) -> None:
        """List, then watch, forever; relist on expiry, after a growing wait on errors."""
        health = self.health if self.health is not None else WatchHealth(role="its ClusterRole")
        while True:
            try:
                with health.step(self.resource, "list"):
                    items, version = await self.listing()
                health.succeeded(self.resource, "list")
                self.objects = {key_of(o): o for o in items}
                self.synced = True
                self.revision += 1
                self.changed.set()
                with health.step(self.resource, "watch"):
                    async for event in self.watching(version):
                        self.backoff.reset()
                        health.succeeded(self.resource, "watch")
                        if event.type == "DELETED":
                            self.objects.pop(key_of(event.object), None)
                        elif event.type in ("ADDED", "MODIFIED"):
                            self.objects[key_of(event.object)] = event.object
                        else:
                            continue
                        self.revision += 1
                        self.changed.set()
            except Gone:
                log.info("%s watch expired; relisting", self.resource)
            except KubeError as err:
                wait = self.backoff.failed()
                log.warning("%s: %s; relisting in %.1fs", self.resource, err, wait)
                await asyncio.sleep(wait)

    def put(self, obj: KubeDict) -> None:
        """Keep what a write returned, until the watch brings it (or a newer one)."""
        self.objects[key_of(obj)] = obj
        self.revision += 1
