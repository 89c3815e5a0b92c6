"""Waits after API failures grow, are capped, jittered and start over; nothing really sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from gpushare.core.decision.scheduling import Settings
from gpushare.deviceplugin.allocating import NodeParts, NodePods, NodeReader
from gpushare.deviceplugin.checkpoint import ServedCheckpoint
from gpushare.deviceplugin.config import PluginConfig, Stats
from gpushare.deviceplugin.kubelet.reconcile import ServedCheck
from gpushare.kube.backoff import Backoff
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node
from gpushare.kube.port import KubeDict, Unreachable
from gpushare.kube.sealing import keyless_trust
from gpushare.node.enforcement.hook import NoIsolation


class FakeTime:
    """A clock that only moves when someone sleeps on it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)  # let the test run, never wait for real


def test_waits_double_up_to_the_cap_with_equal_jitter() -> None:
    time = FakeTime()
    backoff = Backoff(base_s=1.0, cap_s=30.0, draw=lambda: 0.0, clock=time.clock)
    floors = [backoff.failed() for _ in range(8)]
    assert floors == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]
    top = Backoff(base_s=1.0, cap_s=30.0, draw=lambda: 0.999, clock=time.clock)
    tops = [top.failed() for _ in range(8)]
    assert all(f < t < 2 * f for f, t in zip(floors, tops, strict=True))
    assert max(tops) < 30.0
    assert backoff.failures == 8


def test_a_thousand_failures_stay_at_the_cap() -> None:
    backoff = Backoff(base_s=0.5, cap_s=30.0, draw=lambda: 0.5, clock=lambda: 0.0)
    waits = [backoff.failed() for _ in range(1000)]
    assert waits[-1] == 22.5 and max(waits) == 22.5


def test_reset_and_a_quiet_spell_start_over() -> None:
    time = FakeTime()
    backoff = Backoff(base_s=1.0, cap_s=30.0, quiet_s=120.0, draw=lambda: 0.0, clock=time.clock)
    for _ in range(5):
        backoff.failed()
    assert backoff.failed() == 15.0
    backoff.reset()
    assert backoff.failed() == 0.5
    time.now += 100  # not quiet long enough: the count goes on
    assert backoff.failed() == 1.0
    time.now += 121
    assert backoff.failed() == 0.5


def test_base_must_be_positive_and_below_the_cap() -> None:
    with pytest.raises(ValueError, match="base_s=5"):
        Backoff(base_s=5, cap_s=1)
    with pytest.raises(ValueError, match="base_s=0"):
        Backoff(base_s=0)


class Flaky(MemoryKube):
    """Refuses the next ``down`` node lists, as an API server that is not there."""

    def __init__(self) -> None:
        super().__init__()
        self.down = 0
        self.tries = 0

    async def list_nodes(self) -> tuple[list[KubeDict], str]:
        self.tries += 1
        if self.down:
            self.down -= 1
            raise Unreachable("connection refused")
        return await super().list_nodes()


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(2000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def test_the_cache_backs_off_while_the_api_is_down_and_starts_over_once_it_answers() -> None:
    kube = Flaky()
    kube.put_node(gpu_node("node-a", gpus_units=[15]))
    kube.down = 8
    time = FakeTime()
    backoff = Backoff(base_s=1.0, cap_s=30.0, draw=lambda: 0.5, clock=time.clock)
    cache = ClusterCache(kube, settings=Settings(), backoff=backoff, sleep=time.sleep)

    async def main() -> None:
        task = asyncio.create_task(cache.run())
        try:
            await until(lambda: cache.synced)
            # ceilings 1, 2, 4, 8, 16, then 30; each wait three quarters of its ceiling
            assert time.slept == [0.75, 1.5, 3.0, 6.0, 12.0, 22.5, 22.5, 22.5]
            assert kube.tries == 9
            # the list went through, but only a watch event proves the server is back
            assert backoff.failures == 8
            kube.put_node(gpu_node("node-b", gpus_units=[15]))
            await until(lambda: "node-b" in cache.state.nodes)
            assert backoff.failures == 0
            # the watch expires (relist at once, no wait), and the server is down again: the
            # waits start from the base, not from the cap the last outage reached
            kube.down = 3
            kube.put_node(gpu_node("node-c", gpus_units=[15]))
            kube.compact()
            await until(lambda: "node-c" in cache.state.nodes)
            assert time.slept[8:] == [0.75, 1.5, 3.0]
            assert cache.relists == 2
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())


class FailingReader(NodeReader):
    """Fails the next ``down`` reads of the node's pods."""

    down = 0

    async def read(self) -> NodePods:
        if self.down:
            self.down -= 1
            raise Unreachable("connection refused")
        return await super().read()


def served_check(
    tmp_path: Path,
    sleep: Callable[[float], Awaitable[None]],
    backoff: Backoff,
    clock: Callable[[], float],
) -> tuple[ServedCheck, FailingReader]:
    kube = MemoryKube()
    config = PluginConfig(node="n", state_dir=tmp_path, check_interval=1.0)
    stats = Stats()
    reader = FailingReader(api=kube, config=config, trust=keyless_trust(kube), stats=stats)
    parts = NodeParts(
        api=kube,
        config=config,
        hook=NoIsolation(),
        checkpoint=ServedCheckpoint(tmp_path / "served.json"),
        stats=stats,
        pods=reader,
    )
    return ServedCheck(parts, backoff=backoff, sleep=sleep, clock=clock), reader


def test_the_device_plugins_check_backs_off_and_returns_to_its_safety_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    time = FakeTime()
    backoff = Backoff(base_s=1.0, cap_s=30.0, draw=lambda: 0.5, clock=time.clock)
    check, reader = served_check(tmp_path, time.sleep, backoff, time.clock)
    checks = 0

    async def listing(socket: Path) -> list[object]:
        nonlocal checks
        checks += 1
        return []

    monkeypatch.setattr("gpushare.deviceplugin.kubelet.reconcile.list_pod_resources", listing)
    reader.down = 7

    async def main() -> None:
        task = asyncio.create_task(check.run(["mem"]))
        try:
            await until(lambda: len(time.slept) >= 11)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(main())
    # the first check at once; after a failure never less than the interval, growing to the
    # cap; then, once a check went through and no pod waits, the safety period
    assert time.slept[:11] == [1.0, 1.5, 3.0, 6.0, 12.0, 22.5, 22.5, 60.0, 60.0, 60.0, 60.0]
    assert backoff.failures == 0
