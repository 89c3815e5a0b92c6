"""ResourcePolicy through the extender's HTTP verbs over the in-memory API."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.resourcepolicies.gating import ANN_DELETION_COST, ANN_UNIT
from gpushare.core.resourcepolicies.policybook import PolicyBook
from gpushare.extender.app import create_app
from gpushare.extender.driver import ExtenderDriver
from gpushare.extender.service import Extender
from gpushare.kube.backoff import Backoff
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from gpushare.kube.policies import PolicyWatch
from gpushare.kube.port import Gone, NotFound, Unreachable, WatchEvent

POLICY: dict[str, Any] = {
    "metadata": {"name": "web", "namespace": "default"},
    "spec": {
        "selector": {"app": "web"},
        "units": [
            {"resource": "ecs", "nodeSelector": {"pool": "a"}, "max": 2, "podLabels": {"u": "a"}},
            {"resource": "ecs", "nodeSelector": {"pool": "b"}, "podAnnotations": {"x": "b"}},
        ],
    },
}


def pooled(name: str, pool: str) -> dict[str, Any]:
    node = gpu_node(name, gpus_units=[16])
    node["metadata"].setdefault("labels", {})["pool"] = pool
    return node


def web_pod(name: str) -> dict[str, Any]:
    pod = gpu_pod(name, mem=4)
    pod["metadata"].setdefault("labels", {})["app"] = "web"
    return pod


async def _run(kube: MemoryKube, policy: dict[str, Any]) -> list[Any]:
    settings = Settings()
    scheduler = Scheduler(settings)
    book = PolicyBook()
    cache = ClusterCache(kube, settings=settings, backoff=Backoff(base_s=0.01), book=book)
    extender = Extender(api=kube, cache=cache, scheduler=scheduler)
    watch = PolicyWatch(kube, book, notify=extender.policy_notice)
    kube.put_resource_policy(policy)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(extender)), base_url="http://extender"
    )
    tasks = [asyncio.create_task(cache.run()), asyncio.create_task(watch.run())]
    try:
        for _ in range(50):
            await asyncio.sleep(0)
        driver = ExtenderDriver(client)
        outcomes = []
        for i in range(4):
            pod = kube.create_pod(web_pod(f"web-{i}"))
            for _ in range(50):
                await asyncio.sleep(0)
            outcomes.append(await driver.schedule(pod, ["a1", "b1"]))
            for _ in range(50):
                await asyncio.sleep(0)
        await extender.events.drain()
        return outcomes
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.aclose()


def test_overflow_into_unit_two_with_labels_annotations_and_cost() -> None:
    kube = MemoryKube()
    kube.put_node(pooled("a1", "a"))
    kube.put_node(pooled("b1", "b"))
    outcomes = asyncio.run(_run(kube, POLICY))
    assert [o.node for o in outcomes] == ["a1", "a1", "b1", "b1"]
    assert "unit 1 (nodeSelector pool=a) is full: 2/2 pods" in outcomes[2].failed["a1"]
    pods = {p["metadata"]["name"]: p["metadata"] for p in kube.pods()}
    assert pods["web-0"]["annotations"][ANN_UNIT] == "1"
    assert pods["web-0"]["annotations"][ANN_DELETION_COST] == "0"
    assert pods["web-0"]["labels"]["u"] == "a"
    assert pods["web-3"]["annotations"][ANN_UNIT] == "2"
    assert pods["web-3"]["annotations"][ANN_DELETION_COST] == "-1"
    assert pods["web-3"]["annotations"]["x"] == "b"
    said = {
        e["involvedObject"]["name"]: e["message"]
        for e in kube.events()
        if e["reason"] == "GPUSharePolicyUnit"
    }
    assert said["web-0"] == (
        "ResourcePolicy default/web placed this pod in unit 1 (nodeSelector pool=a) on a1, the "
        "first unit, which had room"
    )
    assert said["web-2"] == (
        "ResourcePolicy default/web placed this pod in unit 2 (nodeSelector pool=b) on b1; it "
        "moved on because unit 1 (nodeSelector pool=a) is full: 2/2 pods"
    )


def test_before_next_unit_is_named_on_the_policy() -> None:
    kube = MemoryKube()
    kube.put_node(pooled("a1", "a"))
    kube.put_node(pooled("b1", "b"))
    asking = {**POLICY, "spec": {**POLICY["spec"], "preemptPolicy": "BeforeNextUnit"}}
    outcomes = asyncio.run(_run(kube, asking))
    assert [o.node for o in outcomes] == ["a1", "a1", "b1", "b1"]  # ordering is unchanged
    (notice,) = [e for e in kube.events() if e["reason"] == "GPUSharePolicyNotice"]
    assert notice["type"] == "Warning"
    assert notice["involvedObject"]["kind"] == "ResourcePolicy"
    assert notice["involvedObject"]["apiVersion"] == "scheduling.alibabacloud.com/v1alpha1"
    assert notice["involvedObject"]["name"] == "web"
    assert "spec.preemptPolicy BeforeNextUnit has no effect" in notice["message"]


def test_eci_unit_refuses_the_pods_with_the_reason() -> None:
    kube = MemoryKube()
    kube.put_node(pooled("a1", "a"))
    kube.put_node(pooled("b1", "b"))
    bad = {**POLICY, "spec": {**POLICY["spec"], "units": [{"resource": "eci"}]}}
    outcomes = asyncio.run(_run(kube, bad))
    assert not any(o.bound for o in outcomes)
    assert "spec.units[0].resource is 'eci'" in outcomes[0].failed["a1"]
    assert outcomes[0].unresolvable == {"a1", "b1"}


class _Stop(Exception):
    """Ends PolicyWatch.run from its sleep."""


class _ScriptedPolicies:
    """A PolicyAPI whose lists and watches answer from a script, one step per call."""

    def __init__(self, lists: list[Any], watches: list[Any]) -> None:
        self.lists = lists
        self.watches = watches

    async def list_resource_policies(self) -> tuple[list[dict[str, Any]], str]:
        step = self.lists.pop(0)
        if isinstance(step, Exception):
            raise step
        return step, "1"

    async def watch_resource_policies(self, resource_version: str) -> AsyncIterator[WatchEvent]:
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        for event in step:
            yield event


def _run_watch(api: _ScriptedPolicies) -> tuple[PolicyWatch, list[float]]:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        raise _Stop

    watch = PolicyWatch(api, PolicyBook(), sleep=sleep)
    with contextlib.suppress(_Stop):
        asyncio.run(watch.run())
    return watch, waits


def test_a_crd_deleted_under_a_cut_watch_empties_the_book() -> None:
    """The watch ends without the policies' DELETED events; the relist finds no CRD."""
    api = _ScriptedPolicies(
        lists=[[POLICY], NotFound("list resourcepolicies: the server could not find it")],
        watches=[Unreachable("watch resourcepolicies: connection reset")],
    )
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 2:
            raise _Stop

    watch = PolicyWatch(api, PolicyBook(), sleep=sleep)
    with contextlib.suppress(_Stop):
        asyncio.run(watch.run())
    assert watch.book.policy_for("default", {"app": "web"}) is None
    assert watch.listed
    assert waits[1] == watch.absent_wait_s


def test_an_expired_watch_relists_at_once() -> None:
    changed = {**POLICY, "spec": {**POLICY["spec"], "selector": {"app": "api"}}}
    api = _ScriptedPolicies(
        lists=[[POLICY], [changed]],
        watches=[Gone("watch resourcepolicies: too old resource version"), []],
    )
    watch, waits = _run_watch(api)
    # relisted without a wait after the Gone; the one wait is after the second watch ended
    assert api.lists == [] and waits == [0.0]
    assert watch.book.policy_for("default", {"app": "web"}) is None
    assert watch.book.policy_for("default", {"app": "api"}) is not None


def test_readyz_waits_for_the_policies_to_be_listed() -> None:
    kube = MemoryKube()
    kube.put_resource_policy(POLICY)
    settings = Settings()
    book = PolicyBook()
    cache = ClusterCache(kube, settings=settings, book=book)
    extender = Extender(api=kube, cache=cache, scheduler=Scheduler(settings))
    watch = PolicyWatch(kube, book)

    async def body() -> None:
        await cache.sync()
        app = create_app(extender, policies=watch)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://extender"
        ) as client:
            before = await client.get("/readyz")
            assert before.status_code == 503
            assert before.json()["reason"] == "ResourcePolicies not listed yet"
            await watch.sync()
            assert (await client.get("/readyz")).status_code == 200

    asyncio.run(body())


def test_metrics_show_the_generation_of_each_policy_read() -> None:
    from prometheus_client import generate_latest

    from gpushare.extender.metrics import ExtenderMetrics

    book = PolicyBook()
    kube = MemoryKube()
    cache = ClusterCache(kube, settings=Settings(), book=book)
    book.put_policy({**POLICY, "metadata": {**POLICY["metadata"], "generation": 3}})
    bad = {**POLICY, "spec": {**POLICY["spec"], "units": [{"resource": "eci"}]}}
    book.put_policy({**bad, "metadata": {"name": "bad", "namespace": "default", "generation": 1}})
    text = generate_latest(ExtenderMetrics(lambda: cache).registry).decode()
    assert (
        "gpushare_resource_policy_generation"
        '{name="web",policy_namespace="default",valid="true"} 3.0' in text
    )
    assert (
        "gpushare_resource_policy_generation"
        '{name="bad",policy_namespace="default",valid="false"} 1.0' in text
    )


def _crowded(units: int, nodes: int) -> tuple[MemoryKube, list[str]]:
    """``nodes`` nodes in pool ``gpu`` and a policy of ``units`` units, none of which holds one."""
    kube = MemoryKube()
    names = [f"n{i:03d}" for i in range(nodes)]
    for name in names:
        kube.put_node(pooled(name, "gpu"))
    kube.put_resource_policy(
        {
            "metadata": {"name": "web", "namespace": "default", "uid": "rp-uid"},
            "spec": {
                "selector": {"app": "web"},
                "units": [{"nodeSelector": {"pool": f"none-{i}"}} for i in range(units)],
            },
        }
    )
    return kube, names


async def _filter_once(kube: MemoryKube, names: list[str]) -> bytes:
    """One filter of a pod the policy selects, over HTTP; the reply's bytes."""
    settings = Settings()
    book = PolicyBook()
    cache = ClusterCache(kube, settings=settings, book=book)
    await cache.sync()
    extender = Extender(api=kube, cache=cache, scheduler=Scheduler(settings))
    await PolicyWatch(kube, book, notify=extender.policy_notice).sync()
    pod = kube.create_pod(web_pod("web-0"))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(extender)), base_url="http://extender"
    ) as client:
        reply = await client.post("/filter", json={"Pod": pod, "NodeNames": names})
    await extender.events.drain()
    return reply.content


def test_filter_work_and_reply_stay_bounded_under_a_policy_of_many_units(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpushare.core.resourcepolicies.resourcepolicy import Unit

    calls = 0
    holds = Unit.holds

    def counted(unit: Unit, labels: Any) -> bool:
        nonlocal calls
        calls += 1
        return holds(unit, labels)

    monkeypatch.setattr(Unit, "holds", counted)
    kube, names = _crowded(units=100, nodes=60)
    body = asyncio.run(_filter_once(kube, names))
    reply = json.loads(body)
    assert sorted(reply["FailedNodes"]) == names and not reply["NodeNames"]
    reason = reply["FailedNodes"]["n000"]
    assert "and 97 more units, each full or with no node for this pod" in reason
    # before: every unit's full description on every node (about 7.6 kB a node), and every
    # unit tested against every node (6,000 calls)
    assert len(body) <= len(names) * 1100
    assert calls <= len(names) + 100


def test_a_policy_over_the_unit_limit_is_refused_on_the_policy_and_its_pods() -> None:
    kube, names = _crowded(units=101, nodes=2)
    reply = json.loads(asyncio.run(_filter_once(kube, names)))
    assert sorted(reply["FailedAndUnresolvableNodes"]) == names
    assert "spec.units lists 101 units: at most 100" in reply["FailedAndUnresolvableNodes"]["n000"]
    (warning,) = [e for e in kube.events() if e["reason"] == "GPUSharePolicyNotice"]
    assert warning["type"] == "Warning"
    assert warning["involvedObject"]["kind"] == "ResourcePolicy"
    assert warning["involvedObject"]["uid"] == "rp-uid"
    assert warning["message"].startswith(
        "ResourcePolicy default/web: spec.units lists 101 units: at most 100 are allowed"
    )
