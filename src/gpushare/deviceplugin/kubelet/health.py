"""Device-list generations: what ListAndWatch streams wait on, and what a health change bumps.

kubelet keeps one ListAndWatch stream open per resource and takes each message as the whole device
list. A GPU turning unhealthy (an XID error, or the fake backend's switch) bumps the generation,
so every open stream sends the list again with that GPU's devices ``Unhealthy``, and the node's
inventory is published again so the scheduler stops placing pods there.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gpushare.kube.port import KubeError
from gpushare.node.gpus import GpuSource

log = logging.getLogger(__name__)


class Generations:
    """A counter that streams wait on; the condition is made on first use, inside the loop."""

    def __init__(self) -> None:
        self._value = 0
        self._cond: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    async def wait(self, seen: int) -> int:
        """Return the current generation once it differs from ``seen``."""
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: self._value != seen)
            return self._value

    async def bump(self) -> None:
        """Start a new generation and wake every waiting stream."""
        cond = self._condition()
        async with cond:
            self._value += 1
            cond.notify_all()


async def watch_health(
    source: GpuSource, generations: Generations, publish: Callable[[], Awaitable[None]]
) -> None:
    """On every health change: new device lists on the streams, the inventory republished."""
    while True:
        await source.changed()
        await generations.bump()
        try:
            await publish()
        except KubeError as err:
            log.warning("cannot republish the inventory after a health change: %s", err)
