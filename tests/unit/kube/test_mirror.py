"""``kube.mirror``: list, then watch, each change counted; a refused list reported, then cleared."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from gpushare.kube.backoff import Backoff
from gpushare.kube.mirror import Mirror
from gpushare.kube.port import Forbidden, Gone, KubeDict, WatchEvent
from gpushare.kube.watchhealth import WatchHealth


def _claim(name: str) -> KubeDict:
    return {"metadata": {"namespace": "team", "name": name}}


def test_a_refused_list_is_reported_until_a_list_answers() -> None:
    async def body() -> None:
        answers: list[Exception | None] = [
            Forbidden('User "system:serviceaccount:gs:extender" cannot list resourceclaims'),
            None,
        ]
        listed = asyncio.Event()

        async def listing() -> tuple[list[KubeDict], str]:
            err = answers.pop(0)
            if err is not None:
                raise err
            listed.set()
            return [_claim("a")], "5"

        stop = asyncio.Event()

        async def watching(version: str) -> AsyncIterator[WatchEvent]:
            assert version == "5"
            yield WatchEvent("ADDED", _claim("b"))
            yield WatchEvent("DELETED", _claim("a"))
            await stop.wait()
            raise Gone("expired")

        health = WatchHealth(role="gpushare-scheduler")
        mirror = Mirror(
            "resourceclaims",
            listing,
            watching,
            asyncio.Event(),
            backoff=Backoff(base_s=0.01, cap_s=0.01),
            health=health,
        )
        task = asyncio.create_task(mirror.run())
        while not health.refusals() and not listed.is_set():
            await asyncio.sleep(0)
        assert [(r.resource, r.verb, r.reason) for r in health.refusals()] == [
            ("resourceclaims", "list", "forbidden")
        ]
        await listed.wait()
        while mirror.revision < 3:
            await asyncio.sleep(0.001)
        assert not health.refusals() and mirror.synced
        assert list(mirror.objects) == ["team/b"]
        task.cancel()

    asyncio.run(body())
