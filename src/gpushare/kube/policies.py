"""A list-then-watch of ResourcePolicies into the extender's PolicyBook.

The CRD is optional: while it is not installed the list answers NotFound, and the watch tries
again every ``absent_wait_s`` (logged once), so the extender runs the same with or without it.
A NotFound also empties the book: when the CRD is deleted its policies go with it, and a watch
that was cut off at that moment would never see their DELETED events. Other failures wait as
the cluster cache does (kube.backoff); a Gone relists at once.

``listed`` turns true once the policies are known (listed, or known to be absent): the
extender reports ready only then, so a restarted extender cannot place, in the moment before its
first list, a pod that a policy would have kept out of a node pool.

A policy that cannot be applied (``InvalidResourcePolicy``: an ECI unit, more units than
``MAX_UNITS`` where the CRD predates that limit...) is logged and handed to ``notify`` with why,
and its pods are told at filter; a policy with fields gpushare accepts but does not act on
(``ResourcePolicy.notices``) is logged and handed to ``notify`` too. The extender turns each into
a Warning Event on the policy, so that nothing in it is ignored without a word where ``kubectl
describe resourcepolicy`` shows it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gpushare.core.model.kubejson import name_of, namespace_of
from gpushare.core.resourcepolicies.policybook import PolicyBook
from gpushare.core.resourcepolicies.resourcepolicy import InvalidResourcePolicy, ResourcePolicy
from gpushare.kube.backoff import Backoff
from gpushare.kube.port import Gone, KubeError, NotFound, PolicyAPI, WatchEvent
from gpushare.kube.watchhealth import WatchHealth

log = logging.getLogger(__name__)


class PolicyWatch:
    """Keeps a PolicyBook's policies current."""

    def __init__(
        self,
        api: PolicyAPI,
        book: PolicyBook,
        *,
        absent_wait_s: float = 30.0,
        backoff: Backoff | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        notify: Callable[[ResourcePolicy | InvalidResourcePolicy, str], None] | None = None,
        health: WatchHealth | None = None,
    ) -> None:
        self._api = api
        self.health = health if health is not None else WatchHealth(role="its ClusterRole")
        """Where a refused list or watch is reported (kube.watchhealth)."""
        self._notify = notify
        self.book = book
        self.absent_wait_s = absent_wait_s
        self.backoff = backoff if backoff is not None else Backoff()
        self._sleep = sleep
        self._told_absent = False
        self.listed = False
        """Whether the policies have been listed once (or the CRD found absent)."""

    def apply(self, event: WatchEvent) -> None:
        """Take in one policy event."""
        obj = event.object
        if event.type == "DELETED":
            self.book.delete_policy(namespace_of(obj), name_of(obj))
        elif event.type in ("ADDED", "MODIFIED"):
            self._note(self.book.put_policy(obj))

    def _note(self, entry: InvalidResourcePolicy | ResourcePolicy) -> None:
        if isinstance(entry, InvalidResourcePolicy):
            log.warning("policy=%s phase=resourcepolicy invalid: %s", entry.key, entry.message)
            if self._notify is not None:
                self._notify(entry, entry.message)
            return
        for notice in entry.notices:
            log.warning("policy=%s phase=resourcepolicy %s", entry.key, notice)
            if self._notify is not None:
                self._notify(entry, notice)

    async def sync(self) -> str:
        """List every policy and start the book's policies over; return the resourceVersion."""
        with self.health.step("resourcepolicies", "list"):
            items, version = await self._api.list_resource_policies()
        self.health.succeeded("resourcepolicies", "list")
        self.book.replace_policies([])
        for obj in items:
            self._note(self.book.put_policy(obj))
        log.info("resourcepolicies synced count=%d", len(items))
        self.listed = True
        return version

    async def run(self) -> None:
        """List, then watch, forever."""
        while True:
            wait = 0.0
            try:
                version = await self.sync()
                self._told_absent = False
                with self.health.step("resourcepolicies", "watch"):
                    async for event in self._api.watch_resource_policies(version):
                        self.backoff.reset()
                        self.health.succeeded("resourcepolicies", "watch")
                        self.apply(event)
            except Gone:
                continue
            except NotFound as err:
                self.book.replace_policies([])
                self.listed = True
                if not self._told_absent:
                    log.info(
                        "no ResourcePolicy CRD (%s); looking again every %.0fs",
                        err,
                        self.absent_wait_s,
                    )
                    self._told_absent = True
                wait = self.absent_wait_s
            except KubeError as err:
                wait = self.backoff.failed()
                log.warning("resourcepolicies: %s; again in %.1fs", err, wait)
            await self._sleep(wait)
