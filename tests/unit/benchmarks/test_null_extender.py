"""The benchmark's reference extender answers the wire format as gpushare does, deciding nothing."""

from __future__ import annotations

import asyncio
import json

import httpx

from gpushare.core.model.inventory import Mode
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from tests.support.benchmarks import load

null_extender = load("null_extender")


def _post(app: object, path: str, body: dict[str, object]) -> httpx.Response:
    async def call() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
            return await client.post(path, content=json.dumps(body))

    return asyncio.run(call())


def test_filter_names_the_first_node_alone() -> None:
    app = null_extender.NullExtender(MemoryKube())
    reply = _post(app, "/filter", {"Pod": {}, "NodeNames": ["b", "a", "c"]}).json()
    assert reply["NodeNames"] == ["b"]
    assert reply["Error"] == ""


def test_bind_posts_the_binding_and_reports_a_refusal() -> None:
    kube = MemoryKube()
    for name in ("n1", "n2"):
        kube.put_node(gpu_node(name, gpus_units=[15], mode=Mode.CGPU))
    pod = kube.create_pod(gpu_pod("p", mem=1))
    uid = pod["metadata"]["uid"]
    app = null_extender.NullExtender(kube)
    args = {"PodName": "p", "PodNamespace": "default", "PodUID": uid, "Node": "n1"}
    assert _post(app, "/bind", args).json() == {"Error": ""}
    assert kube.pods()[0]["spec"]["nodeName"] == "n1"
    # a second binding of a bound pod is refused by the API, and the refusal is the answer
    refused = _post(app, "/bind", {**args, "Node": "n2"}).json()["Error"]
    assert refused
    assert kube.pods()[0]["spec"]["nodeName"] == "n1"
