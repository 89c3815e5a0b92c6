"""A refused list or watch is loud: one ERROR naming what to grant, /readyz, the gauges.

The device plugin's pod watch was refused (403) at every start by the chart's own RBAC, and the
only trace was a warning among the retries while no pod was ever marked served. These tests
drive kube.watchhealth directly, then the plugin's watch and the extender's cache against the
in-memory API with the verb withheld, as RBAC would.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from gpushare.core.decision.scheduling import Settings
from gpushare.deviceplugin.config import PluginConfig
from gpushare.deviceplugin.metrics import registry_for
from gpushare.deviceplugin.plugin import DevicePlugin
from gpushare.extender.metrics import ExtenderMetrics
from gpushare.kube.backoff import Backoff
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.podwatch import NodePodWatch
from gpushare.kube.port import Forbidden, Gone, KubeError, NotFound, Unauthorized, Unreachable
from gpushare.kube.watchhealth import WatchHealth, identity_in
from gpushare.node.gpus import FakeGpus

FORBIDDEN = Forbidden(
    'watch pods on n1: pods is forbidden: User "system:serviceaccount:gpushare:gpushare-device-'
    'plugin" cannot watch resource "pods" in API group "" at the cluster scope'
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_403_is_refused_at_once_logged_once_and_names_what_to_grant(
    caplog: pytest.LogCaptureFixture,
) -> None:
    health = WatchHealth(role="the device plugin's ClusterRole")
    with caplog.at_level(logging.INFO, logger="gpushare.kube.watchhealth"):
        for _ in range(3):
            health.failed("pods", "watch", FORBIDDEN)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    line = errors[0].getMessage()
    assert "resource=pods verb=watch" in line
    assert "identity=system:serviceaccount:gpushare:gpushare-device-plugin" in line
    assert "grant 'watch' on 'pods'" in line and "the device plugin's ClusterRole" in line
    assert health.rows() == [("pods", "watch", "forbidden")]
    assert health.problem().startswith("watch pods refused (forbidden, 3 in a row)")

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gpushare.kube.watchhealth"):
        health.succeeded("pods", "watch")
    assert health.rows() == [] and health.problem() == ""
    assert [r.getMessage() for r in caplog.records] == [
        "resource=pods verb=watch phase=watch-refused answered again"
    ]


def test_other_failures_count_only_in_a_row_and_a_refusal_fades_without_new_ones() -> None:
    clock = Clock()
    health = WatchHealth(role="r", failing_after=3, hold_s=90, clock=clock)
    for _ in range(2):
        health.failed("nodes", "watch", Unreachable("watch nodes: the stream ended"))
    assert health.rows() == []
    health.failed("nodes", "watch", Unreachable("watch nodes: the stream ended"))
    assert health.rows() == [("nodes", "watch", "failing")]
    health.failed("pods", "list", Unauthorized("list pods: Unauthorized"))
    assert health.rows() == [("nodes", "watch", "failing"), ("pods", "list", "unauthorized")]
    assert "does not accept these credentials" in health.problem()
    clock.now = 91  # a watch granted again and quiet: no event clears it, time does
    assert health.rows() == []


def test_gone_and_not_found_are_answers_not_refusals() -> None:
    health = WatchHealth(role="r", failing_after=1)
    for err in (Gone("too old"), NotFound("no ResourcePolicy CRD")):
        with pytest.raises(KubeError), health.step("resourcepolicies", "list"):
            raise err
    assert health.rows() == []
    with pytest.raises(Forbidden), health.step("resourcepolicies", "list"):
        raise Forbidden("list resourcepolicies: forbidden")
    assert health.rows() == [("resourcepolicies", "list", "forbidden")]


def test_the_identity_is_read_from_the_refusal_when_it_names_one() -> None:
    assert identity_in(str(FORBIDDEN)) == "system:serviceaccount:gpushare:gpushare-device-plugin"
    assert identity_in("watch pods: Forbidden (forbidden to these credentials)") == ""


def _exported(registry: object) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()  # type: ignore[arg-type]


def test_the_device_plugin_is_not_ready_and_says_why_while_its_pod_watch_is_refused(
    tmp_path: Path,
) -> None:
    """The chart's old RBAC: list granted, watch not."""
    kube = MemoryKube()
    kube.put_node({"metadata": {"name": "n1"}})
    kube.forbidden.add("watch_pods")
    plugin = DevicePlugin(
        api=kube,
        source=FakeGpus.parse("1x15GiB", node="n1"),
        config=PluginConfig(node="n1", state_dir=tmp_path),
    )
    assert plugin.not_ready() == "starting: not registered with kubelet yet"

    async def run() -> None:
        watch = NodePodWatch(
            kube, "n1", backoff=Backoff(draw=lambda: 0.5), sleep=_no_sleep, health=plugin.health
        )
        task = asyncio.create_task(watch.run())
        for _ in range(200):
            await asyncio.sleep(0)
        plugin._tasks = [task]
        assert not task.done()  # it keeps trying: granting the verb is enough
        assert plugin.not_ready().startswith("watch pods refused (forbidden")
        assert "grant 'watch' on 'pods'" in plugin.not_ready()
        assert "deviceplugin-rbac.yaml" in plugin.not_ready()
        metrics = _exported(registry_for(plugin, "n1"))
        assert (
            'gpushare_device_plugin_watch_refused{node="n1",reason="forbidden",resource="pods",'
            'verb="watch"} 1.0' in metrics
        )
        kube.forbidden.discard("watch_pods")
        for _ in range(200):  # granted: the watch opens, and stays open on a quiet node
            await asyncio.sleep(0)
        kube.create_pod(
            {"metadata": {"name": "p", "namespace": "d"}, "spec": {"nodeName": "n1"}}
        )  # an event proves the watch answers again
        for _ in range(200):
            await asyncio.sleep(0)
        assert plugin.not_ready() == ""
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())


async def _no_sleep(_: float) -> None:
    await asyncio.sleep(0)


def test_the_extender_is_not_ready_while_its_node_watch_is_refused() -> None:
    """Lists granted, the watch not: /readyz fails though the cache synced."""
    import httpx2

    from gpushare.core.decision.scheduling import Scheduler
    from gpushare.extender.app import create_app
    from gpushare.extender.service import Extender

    kube = MemoryKube()
    kube.forbidden.add("watch_nodes")
    cache = ClusterCache(
        kube,
        settings=Settings(),
        backoff=Backoff(draw=lambda: 0.5),
        sleep=_stop,
        health=WatchHealth(role="the extender's ClusterRole"),
    )
    extender = Extender(api=kube, cache=cache, scheduler=Scheduler(Settings()))

    async def run() -> None:
        with pytest.raises(_Stopped):  # the first retry's wait: one failure is enough
            await cache.run()
        transport = httpx2.ASGITransport(app=create_app(extender))
        async with httpx2.AsyncClient(transport=transport, base_url="http://x") as client:
            answer = await client.get("/readyz")
        assert cache.synced and answer.status_code == 503
        assert "watch nodes refused (forbidden" in answer.json()["reason"]
        metrics = b"".join(await ExtenderMetrics(lambda: cache).exposition()).decode()
        assert (
            'gpushare_watch_refused{reason="forbidden",resource="nodes",verb="watch"} 1.0'
            in metrics
        )

    asyncio.run(run())


class _Stopped(Exception):
    pass


async def _stop(_: float) -> None:
    raise _Stopped
