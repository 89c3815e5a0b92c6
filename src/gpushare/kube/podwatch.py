"""The pods bound to one node, kept current from a field-selected list and watch.

The device plugin needs its node's pods to judge allocations and to mark pods served. Listing
them every second made each node one LIST a second at kube-apiserver, about 1,000 a second at
1,000 GPU nodes. This keeps them instead from one list and then one watch, both selected by
``spec.nodeName``, so a quiet node costs kube-apiserver no request at all while the watch stays
open:

- the watch starts from the list's resourceVersion and asks for bookmarks, whose
  resourceVersion it resumes from; kube-apiserver ends a watch after its ``timeoutSeconds``
  (``--min-request-timeout``, 30 to 60 minutes by default), and the client re-opens it from
  that version, one request per half hour or more;
- a ``Gone`` (410: the version fell out of the server's window, after a compaction or a
  restart) leads to a fresh list at once; a second one in a row, with no event between, after
  the backoff's wait, so a server that keeps answering 410 is not listed in a tight loop;
- any other failure (the server restarted, the connection dropped, a proxy cut the stream)
  leads to a fresh list after the backoff's wait (kube.backoff), as the extender's cache does.
  A list, not a watch resumed from the last version: the list proves the store whole again,
  and failures are rare enough for its cost;
- an event proves the server answers and starts the backoff's count over.

Each list's and watch's outcome goes to ``health`` (kube.watchhealth): a watch RBAC refuses is
logged as an error naming the verb to grant, and the plugin's ``/readyz`` and metrics show it.

``current`` says whether the store can be trusted now: True from a successful list until a
failure, so a reader never acts on pods the watch stopped following. Each change of the store
(a pod added, changed or gone, a list that differs from what was held) calls ``on_change``; an
event that repeats what is held (a duplicate after a reconnect, a bookmark) does not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from gpushare.core.model.kubejson import KubeObject, uid_of
from gpushare.kube.backoff import Backoff
from gpushare.kube.port import Gone, KubeAPI, KubeDict, KubeError, WatchEvent
from gpushare.kube.watchhealth import WatchHealth

log = logging.getLogger(__name__)


def _version(obj: KubeDict) -> str:
    meta = obj.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""


class NodePodWatch:
    """The pods bound to ``node`` by UID, from a list and then a watch (see the module)."""

    def __init__(
        self,
        api: KubeAPI,
        node: str,
        *,
        on_change: Callable[[], None] | None = None,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        health: WatchHealth | None = None,
    ) -> None:
        self.api = api
        self.node = node
        self.health = health if health is not None else WatchHealth(role="its ClusterRole")
        """Where a refused list or watch is reported (see the module)."""
        self.on_change = on_change
        self.backoff = backoff if backoff is not None else Backoff()
        self._sleep = sleep
        self.pods: dict[str, KubeDict] = {}
        """The node's pods by UID as last listed or watched."""
        self.version = ""
        """The resourceVersion to resume the watch from: the list's, then each event's."""
        self.current = False
        """The store follows the server: a list went through and no failure came since."""
        self.lists = 0
        self.watches = 0
        self.gones = 0
        self.events = 0
        self.bookmarks = 0

    def objects(self) -> list[KubeObject]:
        """The node's pods now."""
        return list(self.pods.values())

    def replace(self, pods: Iterable[KubeDict], version: str) -> None:
        """Hold exactly these pods, listed at ``version``; tell ``on_change`` if they differ."""
        fresh = {uid_of(p): p for p in pods}
        differs = {u: _version(p) for u, p in fresh.items()} != {
            u: _version(p) for u, p in self.pods.items()
        }
        self.pods, self.version, self.current = fresh, version, True
        if differs:
            self._changed()

    def apply(self, event: WatchEvent) -> bool:
        """Take in one watch event; return whether the store changed."""
        version = _version(event.object)
        if version:
            self.version = version
        if event.type == "BOOKMARK":
            self.bookmarks += 1
            return False
        uid = uid_of(event.object)
        if not uid:
            return False
        if event.type == "DELETED":
            changed = self.pods.pop(uid, None) is not None
        elif event.type in ("ADDED", "MODIFIED"):
            held = self.pods.get(uid)
            changed = held is None or _version(held) != version or not version
            self.pods[uid] = event.object
        else:
            return False
        if changed:
            self._changed()
        return changed

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    async def list(self) -> None:
        """List the node's pods and hold them."""
        with self.health.step("pods", "list"):
            pods, version = await self.api.list_pods(self.node)
        self.health.succeeded("pods", "list")
        self.lists += 1
        self.replace(pods, version)

    async def follow(self) -> None:
        """Take in the watch's events until it ends (raises Gone or KubeError)."""
        self.watches += 1
        with self.health.step("pods", "watch"):
            async for event in self.api.watch_pods(self.version, node=self.node, bookmarks=True):
                self.backoff.reset()
                self.health.succeeded("pods", "watch")
                self.events += 1
                self.apply(event)

    async def run(self) -> None:
        """List unless the store is current, then watch; forever (see the module)."""
        gone_in_a_row = 0
        while True:
            wait = 0.0
            events = self.events
            try:
                if not self.current:
                    await self.list()
                await self.follow()
                gone_in_a_row = 0
                self.backoff.reset()  # the watch ended without an error: resume it
            except Gone as err:
                self.current = False
                self.gones += 1
                gone_in_a_row = 1 if self.events > events else gone_in_a_row + 1
                if gone_in_a_row > 1:
                    wait = self.backoff.failed()
                log.info("node=%s phase=watch expired (%s); listing in %.1fs", self.node, err, wait)
            except KubeError as err:
                self.current = False
                gone_in_a_row = 0
                wait = self.backoff.failed()
                log.warning(
                    "node=%s phase=watch API error (%s); listing in %.1fs (failure %d in a row)",
                    self.node,
                    err,
                    wait,
                    self.backoff.failures,
                )
            if wait:
                await self._sleep(wait)
