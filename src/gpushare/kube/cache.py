"""The extender's view of the cluster: a list-then-watch cache of nodes and pods.

It lists both kinds, rebuilds the ledger from pod annotations (so a restart loses nothing), and
then follows both watches from the lists' resourceVersions. A ``Gone`` (410) or any other watch
failure leads to a fresh list, with a short back-off on errors. Bind-time assumptions survive a
relist while their pods still exist, because those pods may not show their annotations yet; an
assumption whose pod vanished or finished while the watch was down is dropped.

``synced`` stays False until the first full list, and ``/readyz`` reports it.

Every pod listed or watched is also handed to the ``workload`` feed, which counts each pod with
a GPU request once (by UID): the fragmentation-aware policies learn the workload from it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpushare.core.changes import NodeTable
from gpushare.core.defragmenting import WorkloadFeed
from gpushare.core.inventory import NodeInventory, read_node
from gpushare.core.kubejson import name_of, uid_of
from gpushare.core.ledger import Ledger, is_terminal
from gpushare.core.scheduling import Settings
from gpushare.kube.port import Gone, KubeAPI, KubeDict, KubeError, WatchEvent

log = logging.getLogger(__name__)


class ClusterCache:
    """Node inventories and the ledger, kept current from the API."""

    def __init__(
        self,
        api: KubeAPI,
        *,
        settings: Settings,
        on_change: Callable[[], None] | None = None,
        retry_seconds: float = 1.0,
        workload: WorkloadFeed | None = None,
    ) -> None:
        self._api = api
        self._settings = settings
        self._on_change = on_change
        self._retry_seconds = retry_seconds
        self.workload = workload
        self.nodes = NodeTable()
        self.ledger = Ledger(names=settings.names, unit=settings.unit)
        self.synced = False
        self.relists = 0

    def _read(self, node: KubeDict) -> NodeInventory:
        return read_node(node, cluster_unit=self._settings.unit, names=self._settings.names)

    async def sync(self) -> tuple[str, str]:
        """List nodes and pods and rebuild from them; return both resourceVersions."""
        nodes, node_rv = await self._api.list_nodes()
        pods, pod_rv = await self._api.list_pods()
        ledger = Ledger(names=self._settings.names, unit=self._settings.unit)
        alive = {uid_of(p) for p in pods if not is_terminal(p)}
        for assumed in self.ledger.assumptions():
            if assumed.uid in alive:  # a pod deleted while we were not watching frees it
                ledger.assume(assumed)
        for pod in pods:
            ledger.observe(pod)
        if self.workload is not None:
            self.workload.retain({uid_of(p) for p in pods})
            for pod in pods:
                self.workload.observe(pod)
        self.nodes = NodeTable((name_of(n), self._read(n)) for n in nodes)
        self.ledger = ledger
        self.synced = True
        self.relists += 1
        self._changed()
        log.info("cache synced nodes=%d pods=%d relists=%d", len(nodes), len(pods), self.relists)
        return node_rv, pod_rv

    def apply_node(self, event: WatchEvent) -> None:
        """Take in one node event."""
        name = name_of(event.object)
        if event.type == "DELETED":
            self.nodes.pop(name, None)
        elif event.type in ("ADDED", "MODIFIED"):
            self.nodes[name] = self._read(event.object)
        self._changed()

    def apply_pod(self, event: WatchEvent) -> None:
        """Take in one pod event."""
        if event.type == "DELETED":
            self.ledger.forget(uid_of(event.object))
            if self.workload is not None:
                self.workload.forget(uid_of(event.object))
        elif event.type in ("ADDED", "MODIFIED"):
            self.ledger.observe(event.object)
            if self.workload is not None:
                self.workload.observe(event.object)
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    async def _follow(self, node_rv: str, pod_rv: str) -> None:
        async def nodes() -> None:
            async for event in self._api.watch_nodes(node_rv):
                self.apply_node(event)

        async def pods() -> None:
            async for event in self._api.watch_pods(pod_rv):
                self.apply_pod(event)

        async with asyncio.TaskGroup() as group:
            group.create_task(nodes())
            group.create_task(pods())

    async def run(self) -> None:
        """List, then watch, forever; relist on Gone, back off on other errors."""
        while True:
            try:
                node_rv, pod_rv = await self.sync()
                await self._follow(node_rv, pod_rv)
            except* Gone as group:
                log.info("watch expired (%s); relisting", group.exceptions[0])
            except* KubeError as group:
                log.warning(
                    "API error (%s); relisting in %.1fs", group.exceptions[0], self._retry_seconds
                )
                await asyncio.sleep(self._retry_seconds)
