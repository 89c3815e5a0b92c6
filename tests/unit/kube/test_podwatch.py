"""The device plugin's watch of its node's pods: list, watch, bookmarks, 410, disconnects.

Everything runs against the in-memory API (kube.memory), whose field-selected watch shows a pod
bound to the node as ADDED and sends a bookmark after changes the selector left out; nothing
sleeps for real.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.records.handoff import MEM
from gpushare.deviceplugin.allocating import NodeParts, NodeReader
from gpushare.deviceplugin.checkpoint import ServedCheckpoint
from gpushare.deviceplugin.config import PluginConfig, Stats
from gpushare.deviceplugin.kubelet.reconcile import FOLLOW_S, RESYNC_S, ServedCheck, next_check
from gpushare.kube.backoff import Backoff
from gpushare.kube.memory import MemoryKube
from gpushare.kube.podwatch import NodePodWatch
from gpushare.kube.port import KubeDict, Unreachable, WatchEvent
from gpushare.kube.sealing import keyless_trust
from gpushare.node.enforcement.hook import NoIsolation

NODE = "n1"


def node(name: str) -> KubeDict:
    return {"metadata": {"name": name}}


def pod(name: str, on: str = "") -> KubeDict:
    spec: KubeDict = {"containers": [{"name": "c"}]}
    if on:
        spec["nodeName"] = on
    return {"metadata": {"name": name, "namespace": "default"}, "spec": spec}


@dataclass
class Waits:
    """A sleep that records the seconds asked and returns at once."""

    slept: list[float] = field(default_factory=list)

    async def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        await asyncio.sleep(0)


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(5000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def truth(kube: MemoryKube) -> dict[str, str]:
    """The node's pods as the API holds them: UID to resourceVersion."""
    return {
        p["metadata"]["uid"]: p["metadata"]["resourceVersion"]
        for p in kube.pods()
        if p.get("spec", {}).get("nodeName") == NODE
    }


def held(watch: NodePodWatch) -> dict[str, str]:
    return {u: p["metadata"]["resourceVersion"] for u, p in watch.pods.items()}


@dataclass
class Rig:
    kube: MemoryKube
    watch: NodePodWatch
    waits: Waits
    changes: list[int]


def rig() -> Rig:
    kube = MemoryKube()
    for name in (NODE, "n2"):
        kube.put_node(node(name))
    changes: list[int] = []
    waits = Waits()
    watch = NodePodWatch(
        kube,
        NODE,
        on_change=lambda: changes.append(1),
        backoff=Backoff(draw=lambda: 0.5),
        sleep=waits,
    )
    return Rig(kube, watch, waits, changes)


@contextlib.asynccontextmanager
async def running(r: Rig) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(r.watch.run())
    await until(lambda: r.watch.current and r.watch.watches >= 1)
    yield task
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_pod_bound_later_arrives_and_a_quiet_node_costs_no_request() -> None:
    async def main() -> None:
        r = rig()
        r.kube.create_pod(pod("before", NODE))
        async with running(r):
            assert held(r.watch) == truth(r.kube)
            created = r.kube.create_pod(pod("later"))
            await r.kube.bind_pod("default", "later", created["metadata"]["uid"], NODE)
            await until(lambda: held(r.watch) == truth(r.kube))
            r.kube.update_pod("default", "later", phase="Running")
            await until(lambda: held(r.watch) == truth(r.kube))
            r.kube.delete_pod("default", "before")
            await until(lambda: held(r.watch) == truth(r.kube))
            for i in range(20):  # other nodes' pods: bookmarks only
                r.kube.create_pod(pod(f"elsewhere-{i}", "n2"))
            await until(lambda: r.watch.version == str(r.kube._version))
        assert r.kube.calls.count("list_pods") == 1
        assert r.kube.calls.count("watch_pods") == 1
        assert len(r.watch.pods) == 1

    asyncio.run(main())


def test_bookmarks_and_repeated_events_move_the_version_without_a_change() -> None:
    r = rig()
    listed = r.kube.create_pod(pod("p", NODE))
    r.watch.replace([listed], listed["metadata"]["resourceVersion"])
    assert r.changes == [1]
    assert not r.watch.apply(WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "90"}}))
    assert r.watch.version == "90"
    assert not r.watch.apply(WatchEvent("MODIFIED", listed))  # the same version again
    assert not r.watch.apply(WatchEvent("ADDED", listed))
    assert r.changes == [1]
    r.watch.replace([listed], "91")  # a list that holds what the store holds
    assert r.changes == [1]
    newer = {**listed, "metadata": {**listed["metadata"], "resourceVersion": "92"}}
    assert r.watch.apply(WatchEvent("MODIFIED", newer))
    assert r.watch.apply(WatchEvent("DELETED", newer))
    assert not r.watch.apply(WatchEvent("DELETED", newer))  # already gone
    assert r.changes == [1, 1, 1]
    assert r.watch.pods == {}


def test_gone_relists_at_once_and_a_second_gone_in_a_row_backs_off() -> None:
    async def main() -> None:
        r = rig()
        async with running(r):
            r.kube.create_pod(pod("gone-unseen", NODE))
            await until(lambda: held(r.watch) == truth(r.kube))
            r.kube.delete_pod_unseen("default", "gone-unseen")
            r.kube.expire_watches()
            await until(lambda: r.watch.gones == 1 and r.watch.current)
            assert held(r.watch) == truth(r.kube)
            assert r.waits.slept == []  # at once
            assert r.kube.calls.count("list_pods") == 2

    asyncio.run(main())

    class AlwaysGone(MemoryKube):
        def watch_pods(
            self, resource_version: str, *, node: str = "", bookmarks: bool = False
        ) -> AsyncIterator[WatchEvent]:
            self.expire_watches()
            return super().watch_pods(resource_version, node=node, bookmarks=bookmarks)

    async def again() -> None:
        kube = AlwaysGone()
        waits = Waits()
        watch = NodePodWatch(kube, NODE, backoff=Backoff(draw=lambda: 0.5), sleep=waits)
        task = asyncio.create_task(watch.run())
        await until(lambda: watch.gones >= 4)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the first 410 lists at once, each further one in a row waits longer
        assert waits.slept[:3] == [0.75, 1.5, 3.0]

    asyncio.run(again())


def test_a_dropped_watch_lists_again_after_the_backoff_and_misses_nothing() -> None:
    async def main() -> None:
        r = rig()
        async with running(r):
            r.kube.break_watches(Unreachable("connection reset"))
            # what happens while the watch is down is only in the next list
            r.kube.create_pod(pod("while-down", NODE))
            await until(lambda: r.watch.lists == 2 and r.watch.current)
            assert r.waits.slept == [0.75]
            assert held(r.watch) == truth(r.kube)
            assert r.watch.backoff.failures == 1
            r.kube.create_pod(pod("after", NODE))
            await until(lambda: held(r.watch) == truth(r.kube))
            assert r.watch.backoff.failures == 0  # an event proves the server answers

    asyncio.run(main())


OPS = st.lists(
    st.sampled_from(["create-here", "create-there", "bind", "run", "delete", "compact", "drop"]),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(ops=OPS)
def test_the_store_ends_as_the_api_holds_it_whatever_happens_between(ops: list[str]) -> None:
    """Any mix of changes, compactions (410) and dropped watches: the store catches up."""

    async def main() -> None:
        r = rig()
        async with running(r):
            for i, op in enumerate(ops):
                names = sorted(p["metadata"]["name"] for p in r.kube.pods())
                unbound = [p for p in r.kube.pods() if not p.get("spec", {}).get("nodeName")]
                if op == "create-here":
                    r.kube.create_pod(pod(f"p{i}", NODE))
                elif op == "create-there":
                    r.kube.create_pod(pod(f"p{i}"))
                elif op == "bind" and unbound:
                    first = unbound[0]["metadata"]
                    await r.kube.bind_pod("default", first["name"], first["uid"], NODE)
                elif op == "run" and names:
                    r.kube.update_pod("default", names[0], phase="Running")
                elif op == "delete" and names:
                    r.kube.delete_pod("default", names[-1])
                elif op == "compact":
                    r.kube.expire_watches()
                elif op == "drop":
                    r.kube.break_watches(Unreachable("connection reset"))
                await asyncio.sleep(0)
            r.kube.put_node(node("n3"))  # a last write wakes a watch waiting on a compaction
            r.kube.create_pod(pod("last", "n2"))
            await until(lambda: r.watch.current and held(r.watch) == truth(r.kube))

    asyncio.run(main())


# -- when the served check reads PodResources -------------------------------------------------


def test_the_next_check_follows_waiting_pods_then_falls_back_to_the_safety_period() -> None:
    assert next_check(waiting=True, since_change=0.0, interval=1.0) == 1.0
    assert next_check(waiting=True, since_change=FOLLOW_S - 0.1, interval=1.0) == 1.0
    assert next_check(waiting=True, since_change=FOLLOW_S, interval=1.0) == RESYNC_S
    assert next_check(waiting=False, since_change=0.0, interval=1.0) == RESYNC_S
    assert next_check(waiting=False, since_change=0.0, interval=90.0) == 90.0


@dataclass
class Parked:
    """A sleep that records the seconds asked and never ends by itself."""

    slept: list[float] = field(default_factory=list)

    async def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        await asyncio.Event().wait()


def test_a_quiet_node_is_checked_each_safety_period_and_a_change_wakes_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = 0

    async def listing(socket: Path) -> list[object]:
        nonlocal reads
        reads += 1
        return []

    monkeypatch.setattr("gpushare.deviceplugin.kubelet.reconcile.list_pod_resources", listing)

    async def main() -> None:
        r = rig()
        config = PluginConfig(node=NODE, state_dir=tmp_path, check_interval=1.0)
        stats = Stats()
        parts = NodeParts(
            api=r.kube,
            config=config,
            hook=NoIsolation(),
            checkpoint=ServedCheckpoint(tmp_path / "served.json"),
            stats=stats,
            pods=NodeReader(api=r.kube, config=config, trust=keyless_trust(r.kube), stats=stats),
        )
        r.watch.on_change = parts.changed.set
        parked = Parked()
        check = ServedCheck(parts, watch=r.watch, sleep=parked)
        async with running(r):
            task = asyncio.create_task(check.run([MEM]))
            await until(lambda: len(parked.slept) == 1)
            assert (reads, parked.slept) == (1, [RESYNC_S])
            r.kube.create_pod(pod("new", NODE))
            await until(lambda: len(parked.slept) == 2)
            assert reads == 2  # at once, not after the safety period
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert r.kube.calls.count("list_pods") == 1  # the watch's list; the checks list nothing

    asyncio.run(main())
