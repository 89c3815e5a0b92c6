"""ResourcePolicy through the extender's HTTP verbs over the in-memory API."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from gpushare.core.gating import ANN_DELETION_COST, ANN_UNIT
from gpushare.core.policybook import PolicyBook
from gpushare.core.scheduling import Scheduler, Settings
from gpushare.extender.app import create_app
from gpushare.extender.driver import ExtenderDriver
from gpushare.extender.service import Extender
from gpushare.kube.backoff import Backoff
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from gpushare.kube.policies import PolicyWatch

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
    watch = PolicyWatch(kube, book)
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


def test_eci_unit_refuses_the_pods_with_the_reason() -> None:
    kube = MemoryKube()
    kube.put_node(pooled("a1", "a"))
    kube.put_node(pooled("b1", "b"))
    bad = {**POLICY, "spec": {**POLICY["spec"], "units": [{"resource": "eci"}]}}
    outcomes = asyncio.run(_run(kube, bad))
    assert not any(o.bound for o in outcomes)
    assert "spec.units[0].resource is 'eci'" in outcomes[0].failed["a1"]
    assert outcomes[0].unresolvable == {"a1", "b1"}
